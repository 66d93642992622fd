import { describe, expect, it } from "vitest";
import {
  detached,
  requireTenantScope,
  TenantContextError,
  type TenantScope,
  withTenantScope,
} from "../../src/tenant-context/index.ts";

const acme = { tenantId: "acme", generation: 1, leaseId: "outer" };

/** The active scope of tenant `acme`, or undefined outside any scope (every scope here is acme's). */
function activeScope(): TenantScope | undefined {
  try {
    return requireTenantScope("acme");
  } catch (error) {
    if (error instanceof TenantContextError && error.problem === "no_context") return undefined;
    throw error;
  }
}

describe("tenant scope boundary", () => {
  it("fails closed where no scope exists", () => {
    expect(() => requireTenantScope("acme")).toThrow(TenantContextError);
    try {
      requireTenantScope("acme");
    } catch (error) {
      expect((error as TenantContextError).problem).toBe("no_context");
    }
  });

  it("installs the lease and restores the exact previous scope on return", async () => {
    await withTenantScope(acme, async () => {
      expect(requireTenantScope("acme")).toBe(acme);
      const inner = { tenantId: "acme", generation: 1, leaseId: "inner" };
      await withTenantScope(inner, async () => {
        await Promise.resolve();
        expect(activeScope()).toBe(inner);
      });
      expect(activeScope()).toBe(acme);
    });
    expect(activeScope()).toBeUndefined();
  });

  it("restores the exact previous scope when the work throws", async () => {
    await withTenantScope(acme, async () => {
      await expect(
        withTenantScope({ tenantId: "acme", generation: 2, leaseId: "failing" }, async () => {
          await Promise.resolve();
          throw new Error("boom");
        }),
      ).rejects.toThrow("boom");
      expect(activeScope()).toBe(acme);
    });
    expect(activeScope()).toBeUndefined();
  });

  it("rejects a switch to another tenant inside an active scope", async () => {
    let ran = false;
    await withTenantScope(acme, async () => {
      const attempt = withTenantScope({ tenantId: "globex", generation: 1, leaseId: "x" }, async () => {
        ran = true;
      });
      await expect(attempt).rejects.toMatchObject({ problem: "tenant_switch" });
    });
    expect(ran).toBe(false);
  });

  it("refuses work on another tenant inside a scope", async () => {
    await withTenantScope(acme, async () => {
      expect(() => requireTenantScope("globex")).toThrow(TenantContextError);
    });
  });

  it("background work never inherits a scope: it must re-enter with its own tenant and lease", async () => {
    const background: Promise<unknown>[] = [];
    await withTenantScope(acme, async () => {
      // What a `waitUntil`/alarm task started from inside a request would see.
      background.push(detached(() => Promise.resolve().then(() => activeScope())));
      background.push(
        detached(() => Promise.resolve().then(() => requireTenantScope("acme"))).catch(
          (error: unknown) => error,
        ),
      );
      background.push(
        detached(() =>
          withTenantScope({ tenantId: "globex", generation: 7, leaseId: "reclaim" }, async () =>
            requireTenantScope("globex"),
          ),
        ),
      );
    });
    const [seen, failed, reentered] = await Promise.all(background);
    expect(seen).toBeUndefined();
    expect(failed).toBeInstanceOf(TenantContextError);
    expect(reentered).toMatchObject({ tenantId: "globex", leaseId: "reclaim" });
  });
});
