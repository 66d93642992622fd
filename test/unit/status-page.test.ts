import { describe, expect, it } from "vitest";
import { statusPageHtml } from "../../src/status-page/page.ts";
import { statusPageScript } from "../../src/status-page/script.ts";

describe("status page assets", () => {
  it("serves a script that parses, builds no markup from data, and keeps the key out of URLs", () => {
    // Parses without running: a syntax error in the served text fails here, not in a browser.
    expect(() => new Function(statusPageScript)).not.toThrow();
    expect(statusPageScript).not.toMatch(/innerHTML|outerHTML|insertAdjacentHTML|document\.write/);
    expect(statusPageScript).not.toMatch(/localStorage/);
    // The key is only ever read from sessionStorage into a bearer header.
    expect(statusPageScript).toContain('Authorization: "Bearer " + key()');
    expect(statusPageScript).not.toMatch(/[?&](key|token)=/);
  });

  it("has a login form that posts (never a GET that would put the key in the URL) and loads only its own assets", () => {
    expect(statusPageHtml).toMatch(/<form id="login-form" method="post"/);
    expect(statusPageHtml).toMatch(/<input id="admin-key"[^>]*type="password"/);
    const sources = [...statusPageHtml.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]);
    expect(sources).toEqual(["/status/app.css", "/status/app.js"]);
  });
});
