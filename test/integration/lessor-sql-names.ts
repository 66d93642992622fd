/// <reference types="vite/client" />
/**
 * Every name Lessor's own SQL could resolve through a search path: read from the source at test
 * time, so a statement added tomorrow is covered by the trap test without anyone listing it.
 *
 * A string literal in src/ (plain, single-quoted or template) that contains an upper-case SQL
 * keyword is taken as SQL. From it come the lower-case identifiers (functions, relations, types:
 * Lessor writes keywords in upper case and names in lower case), the type names written after `::`,
 * and the operators. Noise is harmless: the trap test plants a shadow only for a name that exists in
 * `pg_catalog`.
 */

const sources = import.meta.glob("../../src/**/*.ts", {
  query: "?raw",
  import: "default",
  eager: true,
}) as Record<string, string>;

const sqlKeyword =
  /\b(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|GRANT|REVOKE|DROP|RESET|DISCARD|ROLLBACK|COMMIT|BEGIN|CLOSE|DEALLOCATE|UNLISTEN|COMMENT|PERFORM|RETURN|EXECUTE)\b/;

/** The string literals of a TypeScript source, roughly (enough to find SQL). */
function literals(source: string): string[] {
  const found: string[] = [];
  const pattern = /`((?:[^`\\]|\\.)*)`|"((?:[^"\\\n]|\\.)*)"|'((?:[^'\\\n]|\\.)*)'/gs;
  for (const match of source.matchAll(pattern)) {
    const text = match[1] ?? match[2] ?? match[3] ?? "";
    // Template holes are code, not SQL.
    found.push(text.replaceAll(/\$\{[^}]*\}/g, " "));
  }
  return found;
}

export interface LessorSqlNames {
  /** Lower-case identifiers: candidate functions, relations and types. */
  identifiers: string[];
  /** Type names written after `::`. */
  types: string[];
  /** Operator tokens. */
  operators: string[];
  /** How many SQL strings they came from (a sanity check that the scan found Lessor's SQL). */
  statements: number;
}

export function lessorSqlNames(): LessorSqlNames {
  const identifiers = new Set<string>();
  const types = new Set<string>();
  const operators = new Set<string>();
  let statements = 0;
  for (const [path, source] of Object.entries(sources)) {
    // The client library runs in the caller's app, never on Lessor's connections.
    if (path.includes("/src/client/") || path.includes("/src/status-page/")) continue;
    for (const text of literals(source)) {
      if (!sqlKeyword.test(text)) continue;
      statements++;
      // Dollar-quoted bodies and quoted literals hold data, but PL/pgSQL bodies are code: keep them.
      for (const match of text.matchAll(/\b[a-z_][a-z0-9_]*\b/g)) identifiers.add(match[0]);
      for (const match of text.matchAll(/::\s*(?:pg_catalog\.)?([a-z_][a-z0-9_]*)/g)) {
        if (match[1]) types.add(match[1]);
      }
      const withoutComments = text.replaceAll(/--[^\n]*/g, " ");
      for (const match of withoutComments.matchAll(
        /(?<![a-zA-Z0-9_$'])([<>=!~#|&+\-*/%^@?]{1,3})(?![a-zA-Z0-9_]*')/g,
      )) {
        const op = match[1];
        if (op && !op.startsWith("--") && !op.startsWith("/*")) operators.add(op);
      }
    }
  }
  return {
    identifiers: [...identifiers].sort(),
    types: [...types].sort(),
    operators: [...operators].sort(),
    statements,
  };
}
