/**
 * The secrets `npm start` keeps in `.lessor/secrets.json` (git-ignored, owner-only): generated on
 * the first start and reused, so keys and connection strings stay valid across restarts.
 *
 * One admin key, wherever the user set it. `LESSOR_ADMIN_KEY` in `npm start`'s environment becomes
 * the kept one: `npx lessorctl` in another shell (which reads the file for a loopback Lessor), the
 * README's `KEY=…` line and the banner's "kept in .lessor/secrets.json" all name the key the Worker
 * runs with. When the Worker ran with the variable and the file kept the generated key, every one
 * of them was wrong: lessorctl got `401`.
 */
import { randomBytes } from "node:crypto";

export interface LocalSecrets {
  adminKey: string;
  sealKey: string;
  /** The MAC key tenant keys are minted under (added later: older secrets files get one on start). */
  keyMacKey?: string;
  pgPassword: string;
}

/** A fresh admin key, in the form `npm start` generates. */
export function newAdminKey(): string {
  return `lak_${randomBytes(32).toString("base64url")}`;
}

/**
 * The secrets this start runs with, from what the file kept (null: no file yet) and the
 * environment's `LESSOR_ADMIN_KEY` (unset or empty: keep the stored one), and whether the file must
 * be written: it is new, it lacked a MAC key, or the environment named another admin key.
 */
export function localSecrets(
  stored: LocalSecrets | null,
  environmentAdminKey: string | undefined,
): { secrets: LocalSecrets & { keyMacKey: string }; write: boolean } {
  const base: LocalSecrets = stored ?? {
    adminKey: newAdminKey(),
    sealKey: randomBytes(32).toString("base64"),
    pgPassword: randomBytes(24).toString("base64url"),
  };
  const adminKey = environmentAdminKey ? environmentAdminKey : base.adminKey;
  const secrets = { ...base, adminKey, keyMacKey: base.keyMacKey ?? randomBytes(32).toString("base64") };
  const write = stored === null || stored.keyMacKey === undefined || stored.adminKey !== adminKey;
  return { secrets, write };
}
