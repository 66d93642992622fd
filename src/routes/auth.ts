/** Operator authentication: the admin key as a bearer token. */
import { bearerAuth } from "hono/bearer-auth";
import { createMiddleware } from "hono/factory";
import { secretMatches } from "../crypto/keys.ts";
import { errorCatalog } from "../errors/index.ts";
import type { AppEnv } from "./context.ts";

const missing = { code: "missing_credentials", message: errorCatalog.missing_credentials.message };
const invalid = { code: "invalid_credentials", message: "Invalid key." };

/** Requires `Authorization: Bearer <LESSOR_ADMIN_KEY>`, compared in constant time. */
export const requireAdmin = createMiddleware<AppEnv>((c, next) =>
  bearerAuth<AppEnv>({
    verifyToken: (token) => (c.env.LESSOR_ADMIN_KEY ? secretMatches(token, c.env.LESSOR_ADMIN_KEY) : false),
    noAuthenticationHeader: { message: missing },
    invalidAuthenticationHeader: { message: invalid },
    invalidToken: { message: invalid },
  })(c, next),
);
