/**
 * The status page's script (`GET /status/app.js`), plain browser JavaScript with no build step.
 * It builds every element with textContent (never innerHTML), so nothing the API returns can
 * become markup, and keeps the admin key in sessionStorage only. A 401 signs out.
 *
 * It is a template literal: the script uses no backquote, no dollar-brace and no backslash, so
 * the text served is exactly the text below (test/unit/status-page.test.ts parses it).
 */
export const statusPageScript = `"use strict";
(function () {
  var storageKey = "lessor.adminKey";
  var refreshMs = 3000;
  var timer = null;
  var $ = function (id) { return document.getElementById(id); };

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      if (name === "text") node.textContent = String(attrs[name]);
      // Through the CSSOM: the Content-Security-Policy refuses style attributes, not this.
      else if (name === "style") String(attrs[name]).split(";").forEach(function (decl) {
        var cut = decl.indexOf(":");
        if (cut > 0) node.style.setProperty(decl.slice(0, cut).trim(), decl.slice(cut + 1).trim());
      });
      else node.setAttribute(name, String(attrs[name]));
    });
    (children || []).forEach(function (child) { if (child) node.appendChild(child); });
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
  function dash(value) { return value === null || value === undefined || value === "" ? "-" : String(value); }
  function time(iso) { return iso ? new Date(iso).toLocaleTimeString() : "-"; }
  function ago(ms) {
    if (ms === null || ms === undefined) return "-";
    var s = Math.floor(ms / 1000);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
  }
  function pct(part, whole) { return whole > 0 ? Math.max(0, Math.min(100, (part / whole) * 100)) : 0; }
  function counts(target, pairs) {
    clear(target);
    pairs.forEach(function (pair) {
      target.appendChild(el("div", { "data-key": pair[0] }, [el("dt", { text: pair[0] }), el("dd", { text: dash(pair[1]) })]));
    });
  }
  function legend(pairs) {
    return el("div", { "class": "legend" }, pairs.map(function (pair) {
      return el("span", {}, [el("i", { "class": "swatch", style: "background: var(--" + pair[0] + ")" }), document.createTextNode(pair[1])]);
    }));
  }

  function key() { return sessionStorage.getItem(storageKey); }

  function api(path) {
    return fetch(path, { headers: { Authorization: "Bearer " + key() }, cache: "no-store" }).then(function (response) {
      if (response.status === 401) { signOut("That key was refused."); throw new Error("signed out"); }
      return response.json().then(function (body) {
        if (!response.ok) throw new Error((body && body.code ? body.code + ": " + body.message : "HTTP " + response.status));
        return body;
      });
    });
  }

  function drawHosts(hosts, unavailable) {
    var target = clear($("hosts"));
    hosts.forEach(function (h) {
      var cap = h.poolCapacity;
      var free = Math.max(0, cap - h.allocated - h.reserved - h.draining);
      var bar = el("div", {
        "class": "bar", role: "img", "data-host": h.host, "data-allocated": h.allocated, "data-reserved": h.reserved,
        "data-draining": h.draining, "data-capacity": cap,
        "aria-label": h.host + ": " + h.allocated + " allocated, " + h.reserved + " reserved, " + h.draining + " draining of " + cap
      }, [
        el("span", { "class": "allocated", style: "width:" + pct(h.allocated, cap) + "%" }),
        el("span", { "class": "reserved", style: "width:" + pct(h.reserved, cap) + "%" }),
        el("span", { "class": "draining", style: "width:" + pct(h.draining, cap) + "%" })
      ]);
      var rows = h.candidates.map(function (c) {
        return el("tr", {}, [el("td", { text: c.tenantId }), el("td", { text: c.generation }), el("td", { text: ago(c.idleMs) }),
          el("td", { text: c.leases }), el("td", { text: c.pinned })]);
      });
      target.appendChild(el("div", { "class": "host", "data-host": h.host }, [
        el("h3", { text: h.host + " — " + (h.allocated + h.reserved + h.draining) + " of " + cap + " connections for pools (budget " + h.budget + ", of which reserve " + h.reserve + ")" }),
        bar,
        legend([["allocated", "allocated " + h.allocated], ["reserved", "reserved (starting) " + h.reserved], ["draining", "draining " + h.draining], ["free", "free " + free]]),
        h.tenancy ? el("p", { "class": "tenancy", "data-host": h.host, text: "tenants " + h.tenancy.tenants + " (" + h.tenancy.jwtTenants + " in JWT mode) · databases " + h.tenancy.databases.used + " of " + (h.tenancy.databases.limit === null ? "unlimited" : h.tenancy.databases.limit) + " · roles " + h.tenancy.roles.used + " of " + (h.tenancy.roles.limit === null ? "unlimited" : h.tenancy.roles.limit) }) : el("p", { "class": "muted", text: "Tenants per host unknown (the control plane did not answer)." }),
        el("p", { "class": "muted", text: "waiters " + h.waiters + " · leases " + h.leases + " · evictions " + h.evictions + " · saturations " + h.saturations + " · admissions " + h.admissions }),
        rows.length === 0 ? el("p", { "class": "muted", text: "No eviction candidate (no idle, unpinned pool)." }) :
          el("table", { "class": "candidates" }, [
            el("thead", {}, [el("tr", {}, ["eviction candidate", "generation", "idle", "leases", "pinned"].map(function (t) { return el("th", { text: t }); }))]),
            el("tbody", {}, rows)
          ])
      ]));
    });
    unavailable.forEach(function (name) {
      target.appendChild(el("p", { "class": "error", text: name + ": its BudgetObject did not answer." }));
    });
  }

  function drawCampaigns(campaigns) {
    var target = clear($("campaigns"));
    if (!campaigns) { target.appendChild(el("p", { "class": "muted", text: "Control plane unreachable." })); return; }
    if (campaigns.length === 0) { target.appendChild(el("p", { "class": "muted", text: "No campaign yet." })); return; }
    campaigns.forEach(function (c) {
      var n = c.counts;
      var remaining = Math.max(0, n.total - n.succeeded - n.failed - n.skipped);
      target.appendChild(el("div", { "class": "campaign", "data-campaign": c.id, "data-state": c.state, "data-succeeded": n.succeeded, "data-total": n.total }, [
        el("div", { text: c.id + " → v" + c.toVersion + " · " + c.state + " · " + n.succeeded + " done, " + n.failed + " failed, " + n.skipped + " skipped, " + remaining + " remaining of " + n.total + (c.blockedReason ? " · blocked: " + c.blockedReason : "") + (c.reason ? " · " + c.reason : "") }),
        el("div", { "class": "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": n.total, "aria-valuenow": n.succeeded + n.failed + n.skipped }, [
          el("span", { "class": "succeeded", style: "width:" + pct(n.succeeded, n.total) + "%" }),
          el("span", { "class": "failed", style: "width:" + pct(n.failed, n.total) + "%" }),
          el("span", { "class": "skipped", style: "width:" + pct(n.skipped, n.total) + "%" })
        ])
      ]));
    });
  }

  function drawRows(table, rows) {
    var body = clear(table.querySelector("tbody"));
    rows.forEach(function (cells) { body.appendChild(el("tr", {}, cells.map(function (c) { return el("td", { text: dash(c) }); }))); });
  }

  /* The region this page shows (?region=, each region read on its own), and links to the others. */
  var region = new URLSearchParams(location.search).get("region");

  function drawRegions(o) {
    var nav = clear($("regions"));
    nav.hidden = !o.regions || o.regions.length < 2;
    (o.regions || []).forEach(function (name) {
      nav.appendChild(name === o.region
        ? el("strong", { text: "region " + name })
        : el("a", { href: "?region=" + encodeURIComponent(name), text: name }));
      nav.appendChild(document.createTextNode(" "));
    });
  }

  function draw(o) {
    drawRegions(o);
    $("as-of").textContent = "as of " + time(o.asOf);
    var banner = $("banner");
    banner.hidden = o.controlPlane === "up";
    banner.textContent = o.controlPlane === "up" ? "" : "The control plane is unreachable: failing tenants, events, campaigns and folds are not shown.";
    drawHosts(o.hosts, o.hostsUnavailable);
    counts($("pools"), [["starting", o.pools.starting], ["ready", o.pools.ready], ["draining", o.pools.draining], ["failed", o.pools.failed]]);
    var failing = o.failing ? o.failing.tenants : [];
    $("failing-note").textContent = o.failing
      ? o.failing.count + " tenant(s) whose latest lifecycle event in the last " + Math.round(o.failing.windowSeconds / 3600) + " h moved them to failed" + (o.failing.count > failing.length ? " (newest " + failing.length + " shown)" : "")
      : "";
    drawRows($("failing"), failing.map(function (t) { return [t.tenantId, t.host, t.reason, time(t.failedAt), time(t.retryAt)]; }));
    Array.prototype.forEach.call($("failing").querySelectorAll("tbody tr"), function (tr, i) { tr.setAttribute("data-tenant", failing[i].tenantId); });
    drawCampaigns(o.campaigns);
    var f = o.folds;
    counts($("folds"), [
      ["last outcome", f.last ? f.last.summary : null], ["last run", time(f.counters.lastRunAt)], ["last folded", time(f.counters.lastFoldedAt)],
      ["backlog", f.backlog.deltas + " deltas" + (f.backlog.oldestAgeSeconds ? ", oldest " + f.backlog.oldestAgeSeconds + " s" : "")],
      ["horizon", f.horizon.pinned ? "pinned: " + f.horizon.description : "not pinned"]
    ]);
    drawRows($("events"), (o.events || []).map(function (e) { return [time(e.at), e.tenantId, e.generation, e.from + " → " + e.to, e.reason]; }));
  }

  function refresh() {
    return api("/v1/fleet/overview" + (region ? "?region=" + encodeURIComponent(region) : "")).then(function (o) {
      draw(o);
      $("refresh-state").textContent = "refreshes every " + refreshMs / 1000 + " s";
    }).catch(function (error) {
      if (key()) $("refresh-state").textContent = "refresh failed: " + error.message;
    });
  }

  function showDashboard() {
    $("login").hidden = true;
    $("dashboard").hidden = false;
    $("sign-out").hidden = false;
    refresh();
    if (timer === null) timer = setInterval(refresh, refreshMs);
  }

  function signOut(message) {
    sessionStorage.removeItem(storageKey);
    if (timer !== null) { clearInterval(timer); timer = null; }
    $("dashboard").hidden = true;
    $("sign-out").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
  }

  function search(event) {
    event.preventDefault();
    var q = $("search").value.trim();
    var list = clear($("search-results"));
    $("tenant-detail").textContent = "";
    if (!/^[a-z0-9][a-z0-9-]{0,39}$/.test(q)) { list.appendChild(el("li", { "class": "muted", text: "Type the start of a tenant id." })); return; }
    api("/v1/fleet/tenants?limit=20&q=" + encodeURIComponent(q)).then(function (answer) {
      if (answer.tenants.length === 0) list.appendChild(el("li", { "class": "muted", text: "No tenant starts with " + q + "." }));
      answer.tenants.forEach(function (t) {
        var button = el("button", { type: "button", text: t.id });
        button.addEventListener("click", function () {
          api("/v1/tenants/" + encodeURIComponent(t.id)).then(function (detail) {
            $("tenant-detail").textContent = JSON.stringify(detail, null, 2);
          });
        });
        list.appendChild(el("li", {}, [button, document.createTextNode(" " + t.status + " · " + t.tier + " · " + t.host)]));
      });
    }).catch(function (error) { list.appendChild(el("li", { "class": "error", text: error.message })); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    $("login-form").addEventListener("submit", function (event) {
      event.preventDefault();
      var value = $("admin-key").value.trim();
      $("admin-key").value = "";
      if (!value) return;
      sessionStorage.setItem(storageKey, value);
      $("login-error").textContent = "";
      showDashboard();
    });
    $("sign-out").addEventListener("click", function () { signOut(""); });
    $("search-form").addEventListener("submit", search);
    if (key()) showDashboard(); else signOut("");
  });
})();
`;
