/**
 * The one workerd module the bench Worker imports, declared for the Node type-check of bench/
 * (local/tsconfig.json has Node types, not the generated Worker types): the base class that gives a
 * Durable Object RPC methods, as Lessor's TenantObject uses it.
 */
declare module "cloudflare:workers" {
  export abstract class DurableObject<Env = unknown> {
    protected readonly ctx: unknown;
    protected readonly env: Env;
    constructor(ctx: unknown, env: Env);
  }
}
