/** The status page's stylesheet (`GET /status/app.css`). */
export const statusPageCss = `
:root { --allocated: #2f6fdb; --reserved: #e0a100; --draining: #8a5cd6; --free: #e6e9ef; --fail: #c62828; --ok: #2e7d32; }
* { box-sizing: border-box; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1b1f24; background: #f6f7f9; }
header { display: flex; gap: 1rem; align-items: baseline; padding: .6rem 1rem; background: #1b1f24; color: #fff; }
header h1 { font-size: 1.1rem; margin: 0; }
header button { margin-left: auto; }
main { padding: 1rem; max-width: 1100px; }
section { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; padding: .6rem 1rem; margin-bottom: 1rem; }
h2 { font-size: 1rem; margin: .2rem 0 .6rem; }
.muted { color: #6b7280; }
header .muted { color: #b8bec7; }
.error { color: var(--fail); }
.host { margin-bottom: .8rem; }
.host h3 { font-size: .95rem; margin: 0 0 .3rem; }
.bar { display: flex; height: 18px; border-radius: 3px; overflow: hidden; background: var(--free); border: 1px solid #c9ced6; }
.bar span { display: block; height: 100%; }
.bar .allocated { background: var(--allocated); }
.bar .reserved { background: var(--reserved); }
.bar .draining { background: var(--draining); }
.bar .succeeded { background: var(--ok); }
.bar .failed { background: var(--fail); }
.bar .skipped { background: #9aa1ab; }
.legend { display: flex; flex-wrap: wrap; gap: .9rem; margin: .3rem 0; }
.legend i { display: inline-block; width: .8em; height: .8em; margin-right: .3em; vertical-align: -1px; }
.counts { display: flex; flex-wrap: wrap; gap: .3rem 1.6rem; margin: 0; }
.counts div { display: flex; gap: .4rem; }
.counts dt { color: #6b7280; }
.counts dd { margin: 0; font-weight: 600; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .2rem .5rem; border-bottom: 1px solid #eef0f3; font-variant-numeric: tabular-nums; }
th { color: #6b7280; font-weight: 500; }
.campaign { margin-bottom: .7rem; }
#tenant-detail { white-space: pre-wrap; background: #f6f7f9; padding: .4rem; }
#tenant-detail:empty { display: none; }
#search-results button { background: none; border: none; color: var(--allocated); cursor: pointer; padding: 0; font: inherit; }
`;
