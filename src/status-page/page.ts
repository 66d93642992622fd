/**
 * The status page's HTML shell (`GET /status`). It holds no data: the script (script.ts) signs in
 * with the admin key, keeps it in sessionStorage (never in a URL: the form posts nowhere useful
 * and the script sends the key only as a bearer header), and draws `GET /v1/fleet/overview` every
 * few seconds. No build step: the three assets are strings served by src/routes/status-page.ts.
 */
export const statusPageHtml = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Lessor status</title>
<link rel="stylesheet" href="/status/app.css">
<script src="/status/app.js" defer></script>
</head>
<body>
<header>
  <h1>Lessor</h1>
  <nav id="regions" aria-label="Regions" hidden></nav>
  <span id="as-of" class="muted"></span>
  <span id="refresh-state" class="muted"></span>
  <button id="sign-out" type="button" hidden>Sign out</button>
</header>
<main>
  <section id="login" hidden>
    <h2>Sign in</h2>
    <form id="login-form" method="post" autocomplete="off">
      <label for="admin-key">Admin key</label>
      <input id="admin-key" name="admin-key" type="password" required autocomplete="off" spellcheck="false">
      <button type="submit">Sign in</button>
      <p id="login-error" class="error" role="alert"></p>
      <p class="muted">The key stays in this tab's sessionStorage and is sent only as a bearer header.</p>
    </form>
  </section>
  <div id="dashboard" hidden>
    <p id="banner" class="error" role="alert" hidden></p>
    <section>
      <h2>Hosts</h2>
      <div id="hosts"></div>
    </section>
    <section>
      <h2>Pools by state</h2>
      <dl id="pools" class="counts"></dl>
    </section>
    <section>
      <h2>Failing tenants</h2>
      <p class="muted" id="failing-note"></p>
      <table id="failing"><thead><tr><th>tenant</th><th>host</th><th>reason</th><th>failed at</th><th>retry at</th></tr></thead><tbody></tbody></table>
    </section>
    <section>
      <h2>Campaigns</h2>
      <div id="campaigns"></div>
    </section>
    <section>
      <h2>Folds</h2>
      <dl id="folds" class="counts"></dl>
    </section>
    <section>
      <h2>Recent lifecycle events</h2>
      <table id="events"><thead><tr><th>at</th><th>tenant</th><th>generation</th><th>from → to</th><th>reason</th></tr></thead><tbody></tbody></table>
    </section>
    <section>
      <h2>Find a tenant</h2>
      <form id="search-form" role="search" autocomplete="off">
        <input id="search" type="search" placeholder="tenant id prefix" pattern="[a-z0-9][a-z0-9-]*" maxlength="40">
        <button type="submit">Search</button>
      </form>
      <ul id="search-results"></ul>
      <pre id="tenant-detail"></pre>
    </section>
  </div>
</main>
</body>
</html>
`;
