/**
 * Refusals that tell a newcomer where to go next (issue 31): each is asserted with its status, its
 * code and its whole text, so a message that starts pointing the wrong way fails here.
 */
import { describe, expect, it } from "vitest";
import { admin, createTenant, lessor, uniqueTenantId } from "./harness.ts";

const whereTheAdminKeyIs =
  "The admin key is the LESSOR_ADMIN_KEY secret; locally, npm start prints it and keeps it in .lessor/secrets.json (adminKey).";

async function answer(response: Response): Promise<{ status: number; code: string; message: string }> {
  const body = await response.json<{ code: string; message: string }>();
  return { status: response.status, code: body.code, message: body.message };
}

describe("messages", () => {
  it("a mistyped admin key is told where the admin key is, and is not called a tenant key", async () => {
    const refused = await lessor("/v1/tenants", { headers: { Authorization: "Bearer lak_mistyped" } });
    expect(await answer(refused)).toEqual({
      status: 401,
      code: "invalid_credentials",
      message: `This endpoint needs the admin key, and the key sent is not it. ${whereTheAdminKeyIs}`,
    });
  });

  it("a tenant key sent to an operator endpoint is named as one", async () => {
    const tenant = await createTenant(uniqueTenantId("msg-key"), { tier: "free" });
    const refused = await lessor("/v1/capacity", { headers: { Authorization: `Bearer ${tenant.key}` } });
    expect(await answer(refused)).toEqual({
      status: 401,
      code: "invalid_credentials",
      message: `This endpoint needs the admin key; a tenant key (lsk_…) does not open it. ${whereTheAdminKeyIs}`,
    });
  });

  it("tenant_exists says what to do next: another id, or a new key for this one", async () => {
    const tenant = await createTenant(uniqueTenantId("msg-dup"), { tier: "free" });
    const again = await admin("/v1/tenants", { method: "POST", json: { id: tenant.id } });
    expect(await answer(again)).toEqual({
      status: 409,
      code: "tenant_exists",
      message:
        "A tenant with this id already exists; its key was shown once, when it was created. Pick another id, or mint a new key for it: POST /v1/tenants/<id>/keys with the admin key (npx lessorctl tenants key <id>).",
    });
  });
});
