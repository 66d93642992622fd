/**
 * `GET /status`: the operator's status page, one static page over the JSON API
 * (`/v1/fleet/overview`, `/v1/fleet/tenants`, `/v1/tenants/:id`). The page itself is public and
 * holds no data; everything it shows needs the admin key, which the page keeps in sessionStorage.
 * A strict Content-Security-Policy allows only these assets and calls to this origin.
 */
import { Hono } from "hono";
import { statusPageHtml } from "../status-page/page.ts";
import { statusPageScript } from "../status-page/script.ts";
import { statusPageCss } from "../status-page/style.ts";
import type { AppEnv } from "./context.ts";

export const statusPageRoutes = new Hono<AppEnv>();

const securityHeaders = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-store",
};

statusPageRoutes.get("/status", (c) =>
  c.body(statusPageHtml, 200, { ...securityHeaders, "content-type": "text/html; charset=utf-8" }),
);
statusPageRoutes.get("/status/app.js", (c) =>
  c.body(statusPageScript, 200, { ...securityHeaders, "content-type": "text/javascript; charset=utf-8" }),
);
statusPageRoutes.get("/status/app.css", (c) =>
  c.body(statusPageCss, 200, { ...securityHeaders, "content-type": "text/css; charset=utf-8" }),
);
