//! `/`: a one-page dashboard. Static HTML that polls `GET /api/v1/sales/{sku}` and `/metrics`.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flashsale</title>
<style>
body{font:14px system-ui,sans-serif;margin:2em;max-width:60em}
table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}
th{text-align:left}input{width:8em}.err{color:#b00}pre{font-size:12px;background:#f6f6f6;padding:.5em}
</style></head><body>
<h1>flashsale</h1>
<p>Sale <input id="sku" type="number" min="1" value="1"> <span id="err" class="err"></span>
 · <a href="/docs">API docs</a> · <a href="/openapi.json">openapi.json</a> · <a href="/metrics">metrics</a></p>
<table id="sale"><tbody></tbody></table>
<h2>Service</h2><pre id="metrics"></pre>
<script>
const keep = /^flashsale_(http_requests_total|purchases_total|sold_out_local_total|breaker_open|backpressure_engaged|rate_limited_total|stream_lag_events|open_connections|blacklisted_total)/;
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]))}
async function tick(){
  const sku = document.getElementById('sku').value;
  try {
    const r = await fetch('/api/v1/sales/' + encodeURIComponent(sku));
    const b = await r.json();
    document.getElementById('err').textContent = r.ok ? '' : (b.code + ': ' + b.message);
    const rows = r.ok ? ['name','state','mode','total_stock','available','reserved','sold','seq','per_user_limit']
      .map(k => '<tr><th>' + k + '</th><td>' + esc(b[k]) + '</td></tr>').join('') : '';
    document.querySelector('#sale tbody').innerHTML = rows;
  } catch (e) { document.getElementById('err').textContent = String(e); }
  try {
    const m = await (await fetch('/metrics')).text();
    document.getElementById('metrics').textContent =
      m.split('\n').filter(l => keep.test(l)).slice(0, 200).join('\n');
  } catch (e) {}
}
tick(); setInterval(tick, 1000);
</script></body></html>
"#;

pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}
