import { describe, expect, it } from "vitest";
import {
  currentTenantScope,
  detached,
  requireTenantScope,
  TenantContextError,
  withTenantScope,
} from "../../src/tenant-context/index.ts";

const acme = { tenantId: "acme", generation: 1, leaseId: "outer" };

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
        expect(currentTenantScope()).toBe(inner);
      });
      expect(currentTenantScope()).toBe(acme);
    });
    expect(currentTenantScope()).toBeUndefined();
  });

  it("restores the exact previous scope when the work throws", async () => {
    await withTenantScope(acme, async () => {
      await expect(
        withTenantScope({ tenantId: "acme", generation: 2, leaseId: "failing" }, async () => {
          await Promise.resolve();
          throw new Error("boom");
        }),
      ).rejects.toThrow("boom");
      expect(currentTenantScope()).toBe(acme);
    });
    expect(currentTenantScope()).toBeUndefined();
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
      background.push(detached(() => Promise.resolve().then(() => currentTenantScope())));
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
