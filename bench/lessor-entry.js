// Lessor's Worker entry, re-exported for the bench Worker (bench/worker.ts): its fetch handler and
// every Durable Object class it exports, whatever classes later issues add.
//
// Why a .js file: local/tsconfig.json type-checks bench/ for Node (Node types, erasableSyntaxOnly),
// while src/ is Worker code, type-checked by the root tsconfig.json and bundled by esbuild. Importing
// src/index.ts from a .ts file under bench/ would pull all of src/ into the Node program, where it
// does not type-check. esbuild (inside wrangler) bundles this file like any other; TypeScript reads
// its types from lessor-entry.d.ts instead of following the import.

export * from "../src/index.ts";
export { default } from "../src/index.ts";
