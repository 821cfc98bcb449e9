// The live dashboard: polls the dashboard JSON once a second and draws every sale.
// Public: sales and stock. With the admin token (kept in sessionStorage, so it dies with the
// tab): answers per second, latency, lag, flags and the last reconciliation per sale.
'use strict';

const TOKEN_KEY = 'flashsale.adminToken';
const POLL_MS = 1000;
// The server keeps every sale's series from its start (GET …/dashboard/history/{sku}); the
// page reads it again every HISTORY_REFETCH_MS and draws the seconds it polled since on top.
const HISTORY_S = 120;
const HISTORY_REFETCH_MS = 5000;
const COLORS = {accepted: '#2e9e5b', soldOut: '#e0a030', rejected: '#c8323c',
                p50: '#3a6fd8', p99: '#8e44ad', stock: '#2e9e5b', lag: '#c8323c',
                queue: '#3a6fd8', admitted: '#2e9e5b', waiting: '#e0a030', draw: '#8e44ad'};

const $ = (sel, root = document) => root.querySelector(sel);
const fmt = v => (v === null || v === undefined) ? '—' : Number(v).toLocaleString('en-US');
const ms = v => (v === null || v === undefined) ? '—' : (v < 1 ? v.toFixed(2) : v.toFixed(1));
const cards = new Map();   // sku -> {el, charts: {name: uPlot}, history}

let token = sessionStorage.getItem(TOKEN_KEY) || '';

function setStatus(text, bad) {
  const s = $('#status');
  s.textContent = text;
  s.classList.toggle('err', !!bad);
}

// An error answer in words: its Problem Details title and detail when it has them.
async function problem(what, r) {
  let text = what + ' answered ' + r.status;
  if ((r.headers.get('content-type') || '').startsWith('application/problem+json')) {
    const p = await r.json().catch(() => ({}));
    if (p.title) text += ' ' + p.title + (p.detail ? ': ' + p.detail : '');
  }
  return new Error(text);
}

async function fetchView() {
  if (token) {
    const r = await fetch('/api/v1/admin/dashboard', {headers: {Authorization: 'Bearer ' + token}});
    if (r.ok) return {view: await r.json(), admin: true};
    if (r.status === 401 || r.status === 403) {
      forgetToken();
      setStatus((await problem('admin dashboard', r)).message + '; showing public data', true);
    } else {
      throw await problem('admin dashboard', r);
    }
  }
  const r = await fetch('/api/v1/dashboard');
  if (!r.ok) throw await problem('dashboard', r);
  return {view: await r.json(), admin: false};
}

async function tick() {
  const started = performance.now();
  try {
    const {view, admin} = await fetchView();
    render(view, admin);
    if (!$('#status').classList.contains('err') || admin) {
      setStatus('updated ' + new Date(view.at_ms).toLocaleTimeString() + (admin ? ' · admin' : ''));
    }
  } catch (e) {
    setStatus(String(e), true);
  } finally {
    // Once a second from start to start, whatever the answer took (never two at once).
    setTimeout(tick, Math.max(100, POLL_MS - (performance.now() - started)));
  }
}

function render(view, admin) {
  $('#admin-lock').hidden = !admin;
  $('#admin-unlock').hidden = admin;
  $('#admin-token').hidden = admin;
  $('#service').hidden = !admin;
  if (admin) renderService(view);
  const main = $('#sales');
  const seen = new Set();
  for (const sale of view.sales) {
    seen.add(sale.sku_id);
    renderSale(main, sale, admin, view);
  }
  for (const [sku, card] of cards) {
    if (!seen.has(sku)) { card.el.remove(); cards.delete(sku); }
  }
  $('.empty', main)?.toggleAttribute('hidden', view.sales.length > 0);
}

function renderService(view) {
  $('#svc-ledger').textContent = 'ledger: ' + view.ledger;
  const b = $('#svc-breaker');
  b.textContent = 'breaker ' + (view.breaker_open ? 'OPEN' : 'closed');
  b.className = 'chip ' + (view.breaker_open ? 'on-bad' : 'on-ok');
  // The risk service's breaker, when this instance calls one: open means the fallback decides.
  const r = $('#svc-risk');
  r.hidden = view.risk_breaker_open == null;
  r.textContent = 'risk breaker ' + (view.risk_breaker_open ? 'OPEN (fallback decides)' : 'closed');
  r.className = 'chip ' + (view.risk_breaker_open ? 'on-warn' : 'on-ok');
  $('#svc-conns').textContent = 'connections: ' + fmt(view.open_connections);
  const scripts = view.scripts.map(s => s.script + ' p50 ' + ms(s.p50_ms) + ' / p99 ' + ms(s.p99_ms) + ' ms');
  $('#svc-scripts').textContent = 'Lua scripts: ' + (scripts.length ? scripts.join(' · ') : 'none (embedded ledger)');
}

function cardFor(main, sku) {
  let card = cards.get(sku);
  if (card) return card;
  const el = $('#sale-card').content.firstElementChild.cloneNode(true);
  el.id = 'sale-' + sku;
  el.dataset.sku = sku;
  main.appendChild(el);
  card = {el, charts: {}, history: {t: [], stock: [], backlog: [], acc: [], so: [], rej: [], p50: [], p99: [],
    queue: [], admitted: [], waiting: []}, server: null, loadedAt: 0, loadedAdmin: false, loading: false};
  cards.set(sku, card);
  // Charts have a fixed pixel width: follow the card's (window resize, phone rotation).
  new ResizeObserver(() => resizeCharts(card)).observe(el);
  return card;
}

function setField(el, key, text, raw) {
  const dd = $('[data-k="' + key + '"]', el);
  dd.textContent = text;
  if (raw !== undefined) dd.dataset.v = raw;
}

function renderSale(main, sale, admin, view) {
  const card = cardFor(main, sale.sku_id);
  const el = card.el;
  setField(el, 'name', sale.name);
  setField(el, 'sku', '#' + sale.sku_id);
  const badge = $('[data-k="state"]', el);
  badge.textContent = sale.state;
  badge.className = 'badge ' + sale.state;
  for (const k of ['available', 'sold', 'reserved', 'total']) setField(el, k, fmt(sale[k]), sale[k]);
  setField(el, 'buckets', fmt(sale.buckets), sale.buckets);
  // A queue sale: queued, admitted and bought, as the server's admission state has them.
  const q = sale.queue;
  setField(el, 'admission', q ? sale.admission + ' ' + fmt(q.queue_length) + ' queued, ' +
    fmt(q.admitted) + ' admitted, ' + fmt(q.bought) + ' bought' : sale.admission);
  renderBuckets(el, sale);
  $('.fill', el).style.width = (sale.total ? 100 * sale.sold / sale.total : 0) + '%';
  $('.ops', el).hidden = !admin;
  remember(card.history, view.at_ms / 1000, sale, admin);
  if (admin) renderOps(card, sale, view);
  drawCharts(card, sale, admin);
  loadHistory(card, sale.sku_id, admin);
}

// The server's series of the sale from its start, read again every HISTORY_REFETCH_MS.
async function loadHistory(card, sku, admin) {
  const fresh = performance.now() - card.loadedAt < HISTORY_REFETCH_MS && card.loadedAdmin === admin;
  if (card.loading || fresh) return;
  card.loading = true;
  try {
    const path = (admin ? '/api/v1/admin/dashboard/history/' : '/api/v1/dashboard/history/') + sku;
    const r = await fetch(path, admin ? {headers: {Authorization: 'Bearer ' + token}} : {});
    if (r.ok) {
      card.server = await r.json();
      card.loadedAt = performance.now();
      card.loadedAdmin = admin;
    }
  } catch (e) {
    // The polled seconds still draw; the next poll tries again.
  } finally {
    card.loading = false;
  }
}

// A bucketed sale's buckets, a row each, when the server read them (never on the embedded
// ledger: it runs a bucketed sale as one book). Built with text nodes only: no markup from data.
function renderBuckets(el, sale) {
  const table = $('table.buckets', el);
  const list = sale.bucket_counters;
  table.hidden = !list;
  if (!list) return;
  $('caption', table).textContent = 'per bucket (' + sale.bucket_source + '), in flight between buckets: ' +
    fmt(sale.in_flight_units);
  const rows = list.map(b => {
    const tr = document.createElement('tr');
    tr.dataset.bucket = b.bucket;
    for (const v of [b.bucket, b.available, b.sold, b.reserved, b.total]) {
      const td = document.createElement('td');
      td.textContent = fmt(v);
      tr.appendChild(td);
    }
    return tr;
  });
  $('tbody', table).replaceChildren(...rows);
}

// One polled point: stock and the queue, and (admin) the backlog and the last complete
// second of answers. Kept HISTORY_S: older seconds come from the server's history.
function remember(h, t, sale, admin) {
  const a = admin ? sale.answers : null, last = a ? a.t.length - 1 : -1;
  const q = sale.queue;
  const row = {t, stock: sale.available, backlog: admin ? sale.backlog : null,
    acc: a ? a.accepted[last] : null, so: a ? a.sold_out[last] : null, rej: a ? a.rejected[last] : null,
    p50: a ? a.p50_ms[last] : null, p99: a ? a.p99_ms[last] : null,
    queue: q ? q.queue_length : null, admitted: q ? q.admitted : null,
    waiting: q ? Math.max(0, q.queue_length - q.admitted) : null};
  for (const k of Object.keys(h)) h[k].push(row[k]);
  while (h.t.length && h.t[0] < t - HISTORY_S) for (const k of Object.keys(h)) h[k].shift();
}

// The server's series, then the polled points after its last one, as columns.
function series(card) {
  const s = card.server, h = card.history;
  const out = {t: [], stock: [], backlog: [], acc: [], so: [], rej: [], p50: [], p99: [],
    queue: [], admitted: [], waiting: [], draw: []};
  const n = s ? s.t.length : 0, an = s && s.answers, q = s && s.queue;
  for (let i = 0; i < n; i++) {
    const row = {t: s.t[i], stock: s.available[i], backlog: an ? an.backlog[i] : null,
      acc: an ? an.accepted[i] : null, so: an ? an.sold_out[i] : null, rej: an ? an.rejected[i] : null,
      p50: an ? an.p50_ms[i] : null, p99: an ? an.p99_ms[i] : null,
      queue: q ? q.queue_length[i] : null, admitted: q ? q.admitted[i] : null, waiting: q ? q.waiting[i] : null,
      draw: s.draw_position ? s.draw_position[i] : null};
    for (const k of Object.keys(out)) out[k].push(row[k]);
  }
  const end = n ? s.t[n - 1] : -Infinity;
  for (let i = 0; i < h.t.length; i++) {
    if (h.t[i] <= end + 1) continue;
    for (const k of Object.keys(out)) out[k].push(k === 'draw' ? null : h[k][i]);
  }
  return out;
}

function renderOps(card, sale, view) {
  const el = card.el;
  const a = sale.answers;
  const last = a.t.length - 1;
  setField(el, 'accepted_s', fmt(a.accepted[last]), a.accepted[last]);
  setField(el, 'sold_out_s', fmt(a.sold_out[last]), a.sold_out[last]);
  setField(el, 'rejected_s', fmt(a.rejected[last]), a.rejected[last]);
  setField(el, 'p50_p99', ms(lastValue(a.p50_ms)) + ' · ' + ms(lastValue(a.p99_ms)));
  setField(el, 'stream_lag', sale.stream_lag_events === null ? 'n/a' : fmt(sale.stream_lag_events));
  setField(el, 'backlog', fmt(sale.backlog), sale.backlog);
  setField(el, 'db_guard_rejections', fmt(sale.db_guard_rejections), sale.db_guard_rejections);
  setField(el, 'dead_letters', fmt(sale.dead_letters), sale.dead_letters);
  flag(el, 'sold_out_flag', sale.sold_out_flag ? 'warn' : 'ok', 'sold-out flag ' + (sale.sold_out_flag ? 'set' : 'clear'));
  flag(el, 'backpressure', sale.backpressure ? 'bad' : 'ok', 'back-pressure ' + (sale.backpressure ? 'ENGAGED' : 'off'));
  flag(el, 'breaker', view.breaker_open ? 'bad' : 'ok', 'breaker ' + (view.breaker_open ? 'OPEN' : 'closed'));
  renderReconcile(el, sale.reconcile);
}

// The latest second that had answers (a quiet second has no percentile).
function lastValue(xs) {
  for (let i = xs.length - 1; i >= 0; i--) if (xs[i] !== null) return xs[i];
  return null;
}

function flag(el, key, level, text) {
  const li = $('[data-f="' + key + '"]', el);
  li.textContent = text;
  li.className = 'on-' + level;
  li.dataset.level = level;
}

function renderReconcile(el, r) {
  if (!r) {
    flag(el, 'reconcile', 'warn', 'not reconciled yet');
    setField(el, 'reconcile_text', '');
    return;
  }
  const diff = diffText(r.diff);
  flag(el, 'reconcile', r.ok ? 'ok' : 'bad', 'reconcile ' + (r.ok ? 'OK' : 'MISMATCH'));
  const text = 'last reconciliation ' + new Date(r.at_ms).toLocaleTimeString() + ' (' + r.trigger + '): ' +
    r.violations + ' violations, ' + r.lost_orders + ' lost, diff ' + diff + (r.hot_behind ? ', hot copy behind' : '');
  setField(el, 'reconcile_text', text, r.ok ? 'ok' : 'mismatch');
}

function diffText(diff) {
  if (!diff) return 'not compared (hot copy missing or behind)';
  const off = Object.entries(diff).filter(([, v]) => v !== 0);
  if (!off.length) return '0 in every field';
  return off.map(([k, v]) => k + ' ' + (v > 0 ? '+' : '') + v).join(', ');
}

function drawCharts(card, sale, admin) {
  const h = series(card);
  const backlog = admin ? h.backlog : h.backlog.map(() => null);
  draw(card, 'stock', stockOpts, [h.t, h.stock, backlog]);
  const admission = sale.admission !== 'open';
  $('[data-chart="admission"]', card.el).hidden = !admission;
  if (admission) draw(card, 'admission', admissionOpts, [h.t, h.queue, h.admitted, h.waiting, h.draw]);
  for (const name of ['answers', 'latency']) $('[data-chart="' + name + '"]', card.el).hidden = !admin;
  if (!admin) return;
  const num = v => v === null || v === undefined ? 0 : v;
  const acc = h.acc.map(num), so = h.t.map((_, i) => acc[i] + num(h.so[i]));
  const all = h.t.map((_, i) => so[i] + num(h.rej[i]));
  // Stacked: each band is drawn over the one above it, so series hold running sums.
  card.answersRaw = [null, h.rej, h.so, h.acc];
  draw(card, 'answers', answersOpts(card), [h.t, all, so, acc]);
  draw(card, 'latency', latencyOpts, [h.t, h.p50, h.p99]);
}

function draw(card, name, opts, data) {
  const fig = $('[data-chart="' + name + '"]', card.el);
  let chart = card.charts[name];
  if (!chart) {
    const o = typeof opts === 'function' ? opts() : opts;
    chart = new uPlot({...o, width: chartWidth(fig), height: 170}, data, fig);
    card.charts[name] = chart;
  } else {
    chart.setData(data);
  }
  // Points with a value: the browser test reads this to know the chart has data.
  fig.dataset.points = data.slice(1).flat().filter(v => v !== null && v > 0).length;
}

// The width of the card's chart column: set by the card, never by the charts in it.
function chartWidth(fig) {
  return Math.max(200, fig.parentElement.clientWidth || 320);
}

const axisY = label => ({label, size: 56, labelSize: 16, values: (u, ticks) => ticks.map(v => fmt(v))});
const timeAxis = {space: 60};

function stockOpts() {
  return {
    // The whole sale, as the other charts of the card. From the data, not `max`: with one
    // point uPlot widens max by a day.
    scales: {x: {time: true, range: u => wholeSale(u.data[0])},
             units: {range: (u, min, max) => [0, Math.max(1, max)]}},
    axes: [timeAxis, {...axisY('units'), scale: 'units'}],
    series: [{}, {label: 'remaining', stroke: COLORS.stock, width: 2, scale: 'units', points: {show: fewPoints}},
             {label: 'backlog', stroke: COLORS.lag, width: 1.5, scale: 'units', dash: [4, 3]}],
  };
}

function wholeSale(xs) {
  const end = xs.length ? xs[xs.length - 1] : Date.now() / 1000;
  const start = xs.length ? xs[0] : end - 60;
  return [Math.min(start, end - 60), end];
}

// A queue's length, admitted and waiting buyers, or a draw's waitlist position, over time.
const admissionOpts = {
  scales: {x: {time: true, range: u => wholeSale(u.data[0])}, y: {range: (u, min, max) => [0, Math.max(1, max)]}},
  axes: [timeAxis, axisY('buyers')],
  series: [{}, {label: 'queued', stroke: COLORS.queue, width: 2},
           {label: 'admitted', stroke: COLORS.admitted, width: 2},
           {label: 'waiting', stroke: COLORS.waiting, width: 1.5, dash: [4, 3]},
           {label: 'draw position', stroke: COLORS.draw, width: 2}],
};

// Dots while a line has too few points to be seen (the first seconds after the page opens).
const fewPoints = u => u.data[0].length < 5;

function answersOpts(card) {
  // Legends show each outcome's own rate, not the running sum that is drawn.
  const own = si => (u, v, _s, i) => (i === null || i === undefined) ? fmt(v) : fmt(card.answersRaw[si][i]);
  return () => ({
    scales: {x: {time: true, range: u => wholeSale(u.data[0])}, y: {range: (u, min, max) => [0, Math.max(1, max)]}},
    axes: [timeAxis, axisY('answers/s')],
    series: [{},
      {label: 'rejected', stroke: COLORS.rejected, fill: COLORS.rejected + '99', value: own(1)},
      {label: 'sold out', stroke: COLORS.soldOut, fill: COLORS.soldOut + '99', value: own(2)},
      {label: 'accepted', stroke: COLORS.accepted, fill: COLORS.accepted + 'bb', value: own(3)}],
  });
}

// Points, because a quiet second has no percentile and a lone busy second would otherwise
// draw nothing.
const latencyOpts = {
  scales: {x: {time: true, range: u => wholeSale(u.data[0])}, y: {range: (u, min, max) => [0, Math.max(1, max)]}},
  axes: [timeAxis, axisY('ms')],
  series: [{}, {label: 'p50', stroke: COLORS.p50, width: 2, points: {show: true, size: 6}},
           {label: 'p99', stroke: COLORS.p99, width: 2, points: {show: true, size: 6}}],
};

function forgetToken() {
  token = '';
  sessionStorage.removeItem(TOKEN_KEY);
}

function resizeCharts(card) {
  for (const [name, chart] of Object.entries(card.charts)) {
    const fig = $('[data-chart="' + name + '"]', card.el);
    const width = chartWidth(fig);
    if (!fig.hidden && width !== chart.width) chart.setSize({width, height: 170});
  }
}

$('#admin-form').addEventListener('submit', e => {
  e.preventDefault();
  token = $('#admin-token').value.trim();
  $('#admin-token').value = '';
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  setStatus('');
});
$('#admin-lock').addEventListener('click', () => { forgetToken(); setStatus(''); });
tick();
