/**
 * The horizon gate: does any backend *genuinely* pin the MVCC horizon of the control-plane
 * database right now? A pure function over what `pg_stat_activity`, `pg_prepared_xacts` and
 * `pg_replication_slots` report; the fold (fold.ts) reads those views and asks this.
 *
 * The definition is deliberately narrow (docs/adr/002-horizon-pin-definition.md). Every ordinary
 * statement sets a `backend_xmin` for its own duration; gating on that would stand the fold down
 * on every tick under load and let the deltas grow without bound. A pin is only something that
 * holds the horizon back with no statement in flight to bound the hold, or for longer than a
 * threshold.
 */

/** One row of `pg_stat_activity` (only rows with an xid or an xmin matter). */
export interface BackendActivity {
  pid: number;
  /** `datname`; null for backends attached to no database (walsenders, background workers). */
  database: string | null;
  /** `state`: active, idle, idle in transaction, …; null when the stats are not visible to us. */
  state: string | null;
  /** `backend_xid`: the top-level transaction id, once the transaction has written. */
  backendXid: string | null;
  /** `backend_xmin`: the oldest snapshot the backend holds. */
  backendXmin: string | null;
  /** `xact_start`, epoch milliseconds; null outside a transaction or when not visible. */
  xactStart: number | null;
  /**
   * An autovacuum worker running a lazy VACUUM. Postgres leaves such a backend's snapshot out of
   * every horizon (`PROC_IN_VACUUM`), so however long it runs it cannot strand a dead tuple.
   */
  lazyVacuum?: boolean;
}

/** One row of `pg_prepared_xacts`. */
export interface PreparedTransaction {
  gid: string;
  database: string | null;
  /** `prepared`, epoch milliseconds. */
  prepared: number;
}

/** One row of `pg_replication_slots`. */
export interface ReplicationSlot {
  slot: string;
  active: boolean;
  /** Data xmin: holds back the horizon of every database's tables. */
  xmin: string | null;
  /** Catalog xmin: holds back system catalogs only, never Lessor's tables. */
  catalogXmin: string | null;
  /** `age(xmin)`: transactions consumed since the slot's xmin. */
  xminAge: number | null;
  /** `inactive_since` (Postgres 17+), epoch milliseconds. */
  inactiveSince: number | null;
}

/** Everything the gate looks at, read in one statement on the fold's own connection. */
export interface HorizonObservation {
  /** The database clock, epoch milliseconds. */
  now: number;
  /** The fold's own backend: never a pin (it holds a snapshot while it asks). */
  ownPid: number;
  /** The database whose tables the fold deletes from. */
  database: string;
  backends: readonly BackendActivity[];
  prepared: readonly PreparedTransaction[];
  slots: readonly ReplicationSlot[];
}

export interface HorizonPolicy {
  /** A snapshot held in a transaction open longer than this pins the horizon. */
  pinThresholdMs: number;
  /**
   * An *active* slot's xmin pins only once it lags by more than this many transactions: a slot
   * has no age in seconds, and a live standby's feedback xmin always lags a little.
   */
  slotXminAgeLimit: number;
}

export const defaultHorizonPolicy: HorizonPolicy = {
  pinThresholdMs: 5_000,
  slotXminAgeLimit: 1_000_000,
};

/** What genuinely pins the horizon. */
export type HorizonPin =
  | {
      /** Idle in a transaction that holds a write xid: no statement bounds how long it stays. */
      kind: "idle_in_transaction";
      pid: number;
      seconds: number;
    }
  | {
      /** Holds a snapshot (or an xid) in a transaction open longer than the threshold. */
      kind: "long_transaction";
      pid: number;
      seconds: number;
    }
  | {
      /** A prepared transaction: its xid stays until someone commits or rolls it back. */
      kind: "prepared_transaction";
      gid: string;
      seconds: number;
    }
  | {
      /** A replication slot whose data xmin is inactive or lags past the limit. */
      kind: "replication_slot";
      slot: string;
      /** How long the slot has been inactive, when Postgres says (17+); null otherwise. */
      seconds: number | null;
      xminAge: number | null;
    };

export type HorizonDecision = { pinned: false } | ({ pinned: true } & HorizonPin);

function secondsSince(now: number, then: number): number {
  return Math.max(0, Math.round((now - then) / 100) / 10);
}

function isIdleInTransaction(state: string | null): boolean {
  // "idle in transaction (aborted)" holds neither an xid nor a snapshot; the row data says so too.
  return state === "idle in transaction";
}

/** The pin a backend holds, if any. */
function backendPin(
  backend: BackendActivity,
  observation: HorizonObservation,
  policy: HorizonPolicy,
): HorizonPin | null {
  if (backend.pid === observation.ownPid || backend.lazyVacuum === true) return null;
  // Only backends of our own database (or of none, such as walsenders) hold back our tables'
  // horizon: Postgres computes the horizon of an ordinary table per database.
  if (backend.database !== null && backend.database !== observation.database) return null;
  const holdsXid = backend.backendXid !== null;
  const holdsSnapshot = backend.backendXmin !== null;
  if (!holdsXid && !holdsSnapshot) return null;
  const seconds = backend.xactStart === null ? 0 : secondsSince(observation.now, backend.xactStart);
  if (holdsXid && isIdleInTransaction(backend.state)) {
    return { kind: "idle_in_transaction", pid: backend.pid, seconds };
  }
  // Without a transaction start there is no age to judge (a walsender relaying standby feedback,
  // or stats we may not see); such a backend is not counted (see the ADR's limits).
  if (backend.xactStart === null) return null;
  if (observation.now - backend.xactStart > policy.pinThresholdMs) {
    return { kind: "long_transaction", pid: backend.pid, seconds };
  }
  return null;
}

function preparedPin(prepared: PreparedTransaction, observation: HorizonObservation): HorizonPin | null {
  if (prepared.database !== null && prepared.database !== observation.database) return null;
  return {
    kind: "prepared_transaction",
    gid: prepared.gid,
    seconds: secondsSince(observation.now, prepared.prepared),
  };
}

function slotPin(
  slot: ReplicationSlot,
  observation: HorizonObservation,
  policy: HorizonPolicy,
): HorizonPin | null {
  // A slot's xmin holds back every database; its catalog_xmin only the system catalogs.
  if (slot.xmin === null) return null;
  const lagsTooFar = slot.xminAge !== null && slot.xminAge > policy.slotXminAgeLimit;
  if (slot.active && !lagsTooFar) return null;
  return {
    kind: "replication_slot",
    slot: slot.slot,
    seconds:
      !slot.active && slot.inactiveSince !== null ? secondsSince(observation.now, slot.inactiveSince) : null,
    xminAge: slot.xminAge,
  };
}

const kindOrder: Record<HorizonPin["kind"], number> = {
  idle_in_transaction: 0,
  prepared_transaction: 1,
  long_transaction: 2,
  replication_slot: 3,
};

/** Orders pins so the one reported is the longest-held (then the most specific kind). */
function comparePins(a: HorizonPin, b: HorizonPin): number {
  const bySeconds = (b.seconds ?? -1) - (a.seconds ?? -1);
  return bySeconds !== 0 ? bySeconds : kindOrder[a.kind] - kindOrder[b.kind];
}

/** Every genuine pin, longest-held first. */
export function findPins(
  observation: HorizonObservation,
  policy: HorizonPolicy = defaultHorizonPolicy,
): HorizonPin[] {
  const pins: HorizonPin[] = [];
  for (const backend of observation.backends) {
    const pin = backendPin(backend, observation, policy);
    if (pin) pins.push(pin);
  }
  for (const prepared of observation.prepared) {
    const pin = preparedPin(prepared, observation);
    if (pin) pins.push(pin);
  }
  for (const slot of observation.slots) {
    const pin = slotPin(slot, observation, policy);
    if (pin) pins.push(pin);
  }
  return pins.sort(comparePins);
}

/** Whether the horizon is genuinely pinned, and by what (the longest-held pin). */
export function decideHorizon(
  observation: HorizonObservation,
  policy: HorizonPolicy = defaultHorizonPolicy,
): HorizonDecision {
  const [pin] = findPins(observation, policy);
  return pin ? { pinned: true, ...pin } : { pinned: false };
}

/** "pid 123 for 12.3 seconds", "prepared transaction 'g' for 4 seconds", "replication slot 's'". */
export function describePin(pin: HorizonPin): string {
  switch (pin.kind) {
    case "idle_in_transaction":
    case "long_transaction":
      return `pid ${pin.pid} for ${pin.seconds} seconds`;
    case "prepared_transaction":
      return `prepared transaction '${pin.gid}' for ${pin.seconds} seconds`;
    case "replication_slot":
      return pin.seconds === null
        ? `replication slot '${pin.slot}' (xmin ${pin.xminAge ?? "?"} transactions old)`
        : `replication slot '${pin.slot}' for ${pin.seconds} seconds`;
  }
}
