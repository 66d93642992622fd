// @ts-check
// Row-level security with end users' tokens: a policy on `auth.user_id()`, two users, each seeing
// only their own rows. The tenant must have JWT mode and the tokens come from its identity provider;
// on this machine `npx lessorctl jwt dev <tenant>` is both (docs/rls.md).
//
//   LESSOR_CONNECTION_STRING='postgres://acme:lsk_…@127.0.0.1:8787/acme' \
//   LESSOR_ALICE_TOKEN='eyJ…' LESSOR_BOB_TOKEN='eyJ…' node examples/rls.mjs
import { neon, neonConfig } from "@neondatabase/serverless";

/**
 * Creates a table with a policy (as the tenant), writes a row as each user (with their token), and
 * reads back what each user sees.
 * @param {{ connectionString?: string, lessorUrl?: string, aliceToken?: string, bobToken?: string, fetchFunction?: (url: string, init: RequestInit) => Promise<Response> }} [options]
 *   the environment's unless given; the tests give Lessor's fetch handler as `fetchFunction`
 */
export async function main({
  connectionString = process.env.LESSOR_CONNECTION_STRING,
  lessorUrl = process.env.LESSOR_URL,
  aliceToken = process.env.LESSOR_ALICE_TOKEN,
  bobToken = process.env.LESSOR_BOB_TOKEN,
  fetchFunction,
} = {}) {
  if (!connectionString)
    throw new Error("Set LESSOR_CONNECTION_STRING: `npx lessorctl tenants create <id>` prints it.");
  if (!aliceToken || !bobToken)
    throw new Error(
      'Set LESSOR_ALICE_TOKEN and LESSOR_BOB_TOKEN (two users\' JWTs): eval "$(npx lessorctl jwt dev <tenant> --export)"',
    );
  neonConfig.fetchEndpoint = (host, port) => {
    const local = host === "localhost" || host === "[::1]" || host.startsWith("127.");
    return new URL("/sql", lessorUrl ?? `${local ? "http" : "https"}://${host}:${port}`).href;
  };
  if (fetchFunction) neonConfig.fetchFunction = fetchFunction;

  // As the tenant (no token): the table, its policy, and what the end users' role may do.
  const owner = neon(connectionString);
  await owner.transaction([
    owner`CREATE TABLE IF NOT EXISTS todos (
      id serial PRIMARY KEY,
      user_id text NOT NULL DEFAULT auth.user_id(),
      task text NOT NULL)`,
    owner`ALTER TABLE todos ENABLE ROW LEVEL SECURITY`,
    owner`DROP POLICY IF EXISTS own_todos ON todos`,
    owner`CREATE POLICY own_todos ON todos TO authenticated
      USING (user_id = (SELECT auth.user_id())) WITH CHECK (user_id = (SELECT auth.user_id()))`,
    owner`GRANT SELECT, INSERT, UPDATE, DELETE ON todos TO authenticated`,
    owner`GRANT USAGE ON SEQUENCE todos_id_seq TO authenticated`,
  ]);

  // As each end user: the same connection string, plus their token (sent as Authorization: Bearer).
  const alice = neon(connectionString, { authToken: aliceToken });
  const bob = neon(connectionString, { authToken: bobToken });
  await alice`INSERT INTO todos (task) VALUES ('water the plants')`;
  await bob`INSERT INTO todos (task) VALUES ('call the plumber')`;

  return {
    alice: await alice`SELECT user_id, task FROM todos ORDER BY id`,
    bob: await bob`SELECT user_id, task FROM todos ORDER BY id`,
  };
}

// Runs when executed (`node examples/rls.mjs`), not when imported (the tests call main()).
if (import.meta.filename !== undefined && import.meta.filename === process.argv[1]) {
  console.log(await main());
}
