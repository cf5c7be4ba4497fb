/*
 * capd dashboard: plain JavaScript, no dependencies, served by capd itself.
 *
 * Pages (hash routes): #/ the job list, #/jobs/<id> a job's grid,
 * #/compare?control=<job|commit>&head=<job|commit> and #/diff/<commit> a
 * comparison; #/history, #/alerts, #/bisect[/<id>] (web/history.js,
 * alerts.js, bisect.js). Everything comes from the REST API; live changes arrive on
 * one GET /v1/events stream, read with fetch() rather than EventSource so
 * the bearer token can be sent, and resumed with Last-Event-ID after a
 * reconnect. Data is only ever put in the page as text (textContent,
 * attributes), never as HTML.
 */
"use strict";

const TOKEN_KEY = "capd.token";
const SVGNS = "http://www.w3.org/2000/svg";

/* ---- DOM helpers ---- */

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  append(e, kids);
  return e;
}

function s(tag, attrs, ...kids) {
  const e = document.createElementNS(SVGNS, tag);
  setAttrs(e, attrs);
  append(e, kids);
  return e;
}

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.setAttribute("class", v);
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
}

function append(e, kids) {
  for (const k of kids.flat()) {
    if (k === null || k === undefined || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
}

function clear(e) {
  while (e.firstChild) e.removeChild(e.firstChild);
  return e;
}

/* The current route's view: a route renders into its own element, so one
 * still loading when the hash moves on draws into a detached view, never
 * over the page that replaced it. */
let view = null;
const main = () => view || document.getElementById("main");

function banner(msg, isError) {
  const b = document.getElementById("banner");
  clear(b);
  if (!msg) {
    b.hidden = true;
    return;
  }
  b.className = "banner" + (isError ? " error" : "");
  append(b, [msg]);
  b.hidden = false;
}

/* ---- formatting ---- */

function ago(iso) {
  if (!iso) return "";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return iso;
  const d = (Date.now() - t) / 1000;
  if (d < 60) return Math.max(0, Math.round(d)) + "s ago";
  if (d < 3600) return Math.round(d / 60) + "m ago";
  if (d < 86400) return Math.round(d / 3600) + "h ago";
  return Math.round(d / 86400) + "d ago";
}

/* A duration in human units, three significant digits, sign kept:
 * -79344 -> "-79.3 µs", 1.5e6 -> "1.50 ms". SIGNED also writes "+" for a
 * positive value (a shift, where the direction is the point). */
function fmtNs(ns, signed) {
  if (ns === null || ns === undefined || !Number.isFinite(ns)) return "–";
  const sign = ns < 0 ? "-" : signed && ns > 0 ? "+" : "";
  const a = Math.abs(ns);
  if (Math.round(a) < 1000) return sign + Math.round(a) + " ns";
  const units = [[1e3, "µs"], [1e6, "ms"], [1e9, "s"]];
  let i = a >= 1e9 ? 2 : a >= 1e6 ? 1 : 0;
  /* 999.96 µs rounds to "1.00 ms", never "1.00e+3 µs". */
  if (i < 2 && Number((a / units[i][0]).toPrecision(3)) >= 1000) i++;
  const v = a / units[i][0];
  return sign + (v >= 1000 ? v.toFixed(0) : v.toPrecision(3)) + " " + units[i][1];
}

function fmtMs(ms) {
  return ms === null || ms === undefined ? "–" : fmtNs(ms * 1e6);
}

/* The width table's order (GET /v1/widths: default first), so the job and
 * the comparison pages lay out their grids' columns the same way whatever
 * order the cells came in. Loaded once; alphabetical when unavailable. */
let widthRank = null;
async function loadWidthOrder() {
  if (widthRank) return widthRank;
  try {
    const t = await api("/v1/widths");
    widthRank = new Map((t.widths || []).map((w, i) => [w.name, i]));
  } catch (e) {
    return new Map(); /* not cached: a token may come later */
  }
  return widthRank;
}

function byWidthOrder(a, b) {
  const r = widthRank || new Map();
  const ra = r.has(a) ? r.get(a) : Infinity, rb = r.has(b) ? r.get(b) : Infinity;
  return ra !== rb ? ra - rb : a < b ? -1 : a > b ? 1 : 0;
}

const PASS_ORDER = ["forward", "backward"];
/* A cell's column under its width: its pass, with the mode of a compiled
 * cell ("forward/inductor"; docs/api.md, "Compiled cells"). */
function passLabel(c) {
  return c.mode && c.mode !== "eager" ? c.pass + "/" + c.mode : c.pass;
}

function byPassOrder(a, b) {
  const ra = PASS_ORDER.indexOf(a), rb = PASS_ORDER.indexOf(b);
  return (ra < 0 ? 99 : ra) - (rb < 0 ? 99 : rb) || (a < b ? -1 : a > b ? 1 : 0);
}

/* The perf-regression mark of a comparison cell: an inline SVG stopwatch
 * (an emoji would depend on a font the browser may not have). */
function perfMark() {
  return s("svg", { class: "perf-mark", width: 12, height: 12, viewBox: "0 0 12 12", role: "img", "aria-label": "perf regression" },
    s("title", null, "perf regression"),
    s("circle", { cx: 6, cy: 7, r: 4.2, fill: "none", stroke: "currentColor", "stroke-width": 1.4 }),
    s("path", { d: "M6 7V4.6M4.6 1.4h2.8", stroke: "currentColor", "stroke-width": 1.4, fill: "none" }));
}

function fmtNum(x, digits) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (x !== 0 && (Math.abs(x) < 1e-3 || Math.abs(x) >= 1e5)) return x.toExponential(digits || 2);
  return x.toPrecision(digits || 4).replace(/\.?0+$/, "");
}

function short(sha) {
  return sha ? sha.slice(0, 10) : "";
}

/* ---- API ---- */

function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch (e) {
    return "";
  }
}

function authHeaders(extra) {
  const hd = Object.assign({}, extra || {});
  const t = token();
  if (t) hd.Authorization = "Bearer " + t;
  return hd;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || "HTTP " + status);
    this.status = status;
    this.body = body;
    this.code = body && body.error ? body.error.code : null;
  }
}

/* GET or POST a JSON resource. The browser's HTTP cache revalidates with
 * the ETag capd sends (Cache-Control: no-cache), so repeated GETs of an
 * unchanged resource are answered 304 without capd building the body. */
async function api(path, opts) {
  opts = opts || {};
  const init = { method: opts.method || "GET", headers: authHeaders(opts.headers) };
  if (opts.body !== undefined) {
    init.body = JSON.stringify(opts.body);
    init.headers["Content-Type"] = "application/json";
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch (e) {
    body = text;
  }
  if (res.status === 401) {
    banner(h("span", null, "This capd needs an API token for reads. ",
      h("a", { href: "#", onclick: (ev) => { ev.preventDefault(); openToken(); } }, "Enter a token"),
      "."), true);
  }
  if (!res.ok) throw new ApiError(res.status, body);
  return body;
}

async function apiText(path) {
  const res = await fetch(path, { headers: authHeaders() });
  if (!res.ok) throw new ApiError(res.status, null);
  return res.text();
}

/* ---- token dialog ---- */

function openToken() {
  const d = document.getElementById("token-dialog");
  document.getElementById("token-input").value = token();
  if (d.showModal) d.showModal();
  else d.setAttribute("open", "");
}

function setupToken() {
  const d = document.getElementById("token-dialog");
  const close = () => (d.close ? d.close() : d.removeAttribute("open"));
  document.getElementById("token-button").addEventListener("click", openToken);
  document.getElementById("token-cancel").addEventListener("click", close);
  document.getElementById("token-clear").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    close();
    live.restart();
    route();
  });
  document.getElementById("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = document.getElementById("token-input").value.trim();
    if (v) sessionStorage.setItem(TOKEN_KEY, v);
    else sessionStorage.removeItem(TOKEN_KEY);
    close();
    banner(null);
    live.restart();
    route();
  });
}

/* ---- live updates (GET /v1/events) ---- */

class Live {
  constructor() {
    this.lastId = null;
    this.handlers = new Set();
    this.ctrl = null;
    this.retryMs = 3000;
    this.timer = null;
  }

  on(fn) {
    this.handlers.add(fn);
    return () => this.handlers.delete(fn);
  }

  setState(on) {
    const el = document.getElementById("live");
    el.className = "live " + (on ? "on" : "off");
    el.title = "live updates: " + (on ? "connected" : "disconnected");
    el.dataset.state = on ? "on" : "off";
  }

  restart() {
    if (this.ctrl) this.ctrl.abort();
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), 0);
  }

  async connect() {
    this.ctrl = new AbortController();
    const ctrl = this.ctrl;
    const hd = authHeaders({ Accept: "text/event-stream" });
    if (this.lastId !== null) hd["Last-Event-ID"] = this.lastId;
    try {
      const res = await fetch("/v1/events", { headers: hd, signal: ctrl.signal, cache: "no-store" });
      if (!res.ok || !res.body) throw new Error("HTTP " + res.status);
      this.setState(true);
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          this.dispatch(block);
        }
      }
    } catch (e) {
      if (ctrl.signal.aborted) return;
    }
    this.setState(false);
    if (ctrl === this.ctrl) this.timer = setTimeout(() => this.connect(), this.retryMs);
  }

  /* One SSE block: id, event, data (possibly several data lines), retry;
   * lines starting with ':' are comments (heartbeats). */
  dispatch(block) {
    let id = null, type = "message", data = [];
    for (const line of block.split("\n")) {
      if (!line || line[0] === ":") continue;
      const c = line.indexOf(":");
      const field = c < 0 ? line : line.slice(0, c);
      let val = c < 0 ? "" : line.slice(c + 1);
      if (val[0] === " ") val = val.slice(1);
      if (field === "id") id = val;
      else if (field === "event") type = val;
      else if (field === "data") data.push(val);
      else if (field === "retry" && /^\d+$/.test(val)) this.retryMs = Number(val);
    }
    if (id !== null) this.lastId = id;
    if (!data.length) return;
    let payload;
    try {
      payload = JSON.parse(data.join("\n"));
    } catch (e) {
      return;
    }
    for (const fn of this.handlers) {
      try {
        fn(type, payload, id);
      } catch (e) {
        console.error(e);
      }
    }
  }
}

const live = new Live();

/* ---- shared pieces ---- */

const OUTCOMES = ["queued", "running", "ok", "failed", "crashed", "timeout", "cancelled",
  "unsupported", "protocol_error", "interrupted"];
const STATUSES = ["identical", "within_tolerance", "nondeterministic", "diverged",
  "incomparable", "missing", "extra"];

function legend(items, prefix) {
  return h("div", { class: "legend" },
    items.map((k) => h("span", null, h("span", { class: "sw " + prefix + k }), k.replace("_", " "))));
}

function stateBadge(state) {
  return h("span", { class: "badge " + state, "data-state": state }, state);
}

function countsBar(counts) {
  const total = Object.values(counts || {}).reduce((a, b) => a + b, 0) || 1;
  const bar = h("span", { class: "bar", title: Object.entries(counts || {}).map(([k, v]) => k + " " + v).join(", ") });
  for (const k of OUTCOMES) {
    const n = (counts || {})[k];
    if (!n) continue;
    const seg = h("span", { class: "st-" + k });
    seg.style.width = (100 * n / total) + "%";
    bar.append(seg);
  }
  return bar;
}

function countsText(counts) {
  const total = Object.values(counts || {}).reduce((a, b) => a + b, 0);
  const done = total - ((counts || {}).queued || 0) - ((counts || {}).running || 0);
  return done + "/" + total;
}

/* Builds the model × width × pass grid: one row per model, one column per
 * (width, pass and mode: passLabel). CELLS are objects with model, width,
 * pass (and mode); CLASSOF and LABELOF give each cell's colour class and
 * text. */
function grid(cells, classOf, labelOf, onPick) {
  const models = [], widths = [], passes = [];
  const add = (arr, v) => { if (!arr.includes(v)) arr.push(v); };
  for (const c of cells) {
    add(models, c.model);
    add(widths, c.width);
    add(passes, passLabel(c));
  }
  widths.sort(byWidthOrder);
  passes.sort(byPassOrder);
  const byKey = new Map(cells.map((c) => [c.model + "\u0000" + c.width + "\u0000" + passLabel(c), c]));
  const t = h("table", { class: "grid" });
  const head1 = h("tr", null, h("th"));
  const head2 = h("tr", null, h("th"));
  for (const w of widths) {
    const th = h("th", { colspan: passes.length }, w);
    head1.append(th);
    for (const p of passes) head2.append(h("th", null, p));
  }
  t.append(h("thead", null, head1, head2));
  const body = h("tbody");
  for (const m of models) {
    const tr = h("tr", null, h("th", { class: "model", text: m }));
    for (const w of widths) {
      for (const p of passes) {
        const c = byKey.get(m + "\u0000" + w + "\u0000" + p);
        if (!c) {
          tr.append(h("td", { class: "empty" }));
          continue;
        }
        const td = h("td", {
          class: "gcell " + classOf(c),
          "data-model": m, "data-width": w, "data-pass": p,
          title: m + " · " + w + " · " + p,
        }, labelOf(c));
        td.addEventListener("click", () => {
          for (const x of t.querySelectorAll("td.selected")) x.classList.remove("selected");
          td.classList.add("selected");
          onPick(c, td);
        });
        c.td = td;
        tr.append(td);
      }
    }
    body.append(tr);
  }
  t.append(body);
  return t;
}

function errorPanel(e) {
  return h("div", { class: "panel" },
    h("h2", null, "Could not load"),
    h("p", null, e.message || String(e)),
    e.code ? h("p", { class: "muted" }, "code: " + e.code) : null);
}

/* ---- page: job list ---- */

function parseQuery(q) {
  const out = {};
  for (const [k, v] of new URLSearchParams(q || "")) out[k] = v;
  return out;
}

async function pageJobs(query) {
  const q = parseQuery(query);
  const m = clear(main());
  const project = h("input", { name: "project", placeholder: "project", value: q.project || "" });
  const branch = h("input", { name: "branch", placeholder: "branch", value: q.branch || "" });
  const form = h("form", { class: "filters" }, project, branch, h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    if (project.value.trim()) p.set("project", project.value.trim());
    if (branch.value.trim()) p.set("branch", branch.value.trim());
    location.hash = "#/" + (p.toString() ? "?" + p.toString() : "");
  });
  m.append(h("h1", null, "Jobs"), form);
  const params = new URLSearchParams({ limit: "100" });
  if (q.project) params.set("project", q.project);
  if (q.branch) params.set("branch", q.branch);
  let data;
  try {
    data = await api("/v1/jobs?" + params.toString());
  } catch (e) {
    m.append(errorPanel(e));
    return null;
  }
  const tbody = h("tbody", { id: "jobs-body" });
  const table = h("table", { class: "list", id: "jobs" },
    h("thead", null, h("tr", null, ["job", "project", "commit", "branch", "build", "state", "cells", "", "created"].map((x) => h("th", null, x)))),
    tbody);
  const rows = new Map();
  const render = (j) => {
    const tr = h("tr", { "data-job-id": j.id, "data-state": j.state },
      h("td", null, h("a", { href: "#/jobs/" + j.id, class: "mono" }, j.id)),
      h("td", null, j.project),
      h("td", { class: "mono" }, short(j.commit)),
      h("td", null, j.branch || ""),
      h("td", null, j.build),
      h("td", null, stateBadge(j.state)),
      h("td", null, countsBar(j.counts), " ", h("span", { class: "muted" }, countsText(j.counts))),
      h("td", null, j.control_commit ? h("a", { href: "#/diff/" + j.commit, title: "compare with control " + j.control_commit }, "diff") : ""),
      h("td", { title: j.created_at || "" }, ago(j.created_at)));
    return tr;
  };
  for (const j of data.jobs) {
    const tr = render(j);
    rows.set(j.id, { job: j, tr });
    tbody.append(tr);
  }
  const empty = h("p", { class: "muted", id: "jobs-empty" }, "No jobs yet.");
  append(m, [data.jobs.length ? null : empty, table]);
  const matches = (j) => (!q.project || j.project === q.project) && (!q.branch || j.branch === q.branch);
  const update = (id, patch, isNew) => {
    let r = rows.get(id);
    if (!r) {
      if (!isNew || !matches(patch)) return;
      r = { job: patch, tr: null };
      rows.set(id, r);
      const tr = render(patch);
      tr.classList.add("flash");
      tbody.prepend(tr);
      r.tr = tr;
      empty.remove();
      return;
    }
    Object.assign(r.job, patch);
    const tr = render(r.job);
    r.tr.replaceWith(tr);
    r.tr = tr;
  };
  return live.on((type, ev) => {
    if (type === "job" && ev.job) update(ev.job.id, ev.job, ev.change === "created");
    else if (type === "cell" && ev.job) update(ev.job.id, { state: ev.job.state, counts: ev.job.counts }, false);
  });
}

/* ---- page: one job ---- */

async function pageJob(id) {
  const m = clear(main());
  let job;
  try {
    job = await api("/v1/jobs/" + encodeURIComponent(id));
    await loadWidthOrder();
  } catch (e) {
    m.append(errorPanel(e));
    return null;
  }
  const stateEl = h("span", { id: "job-state" }, stateBadge(job.state));
  const countsEl = h("span", { id: "job-counts" }, countsBar(job.counts), " ", countsText(job.counts));
  m.append(
    h("h1", null, "Job ", h("span", { class: "mono" }, job.id), " ", stateEl),
    h("div", { class: "panel" },
      h("dl", { class: "kv" },
        h("dt", null, "project"), h("dd", null, job.project),
        h("dt", null, "commit"), h("dd", { class: "mono" }, job.commit),
        h("dt", null, "branch"), h("dd", null, job.branch || "–"),
        h("dt", null, "build"), h("dd", null, job.build),
        h("dt", null, "control"), h("dd", null, job.control_commit
          ? h("span", null, h("span", { class: "mono" }, short(job.control_commit)), " · ",
            h("a", { href: "#/diff/" + job.commit, id: "diff-link" }, "comparison"))
          : "–"),
        h("dt", null, "cells"), h("dd", null, countsEl),
        h("dt", null, "created"), h("dd", { title: job.created_at }, ago(job.created_at)),
        h("dt", null, "finished"), h("dd", null, job.finished_at ? ago(job.finished_at) : "–"))));
  const detail = h("div", { class: "panel", id: "cell-detail" }, h("p", { class: "muted" }, "Pick a cell for its outcome and log."));
  const g = grid(job.cells, (c) => "st-" + c.state, (c) => c.state.replace("_", " "), (c) => showCell(job, c, detail));
  g.id = "job-grid";
  /* web/widthcheck.js: the width and mode self-checks, where the matrix has them */
  const checks = [widthCheckPanel(job), modeCheckPanel(job)].filter(Boolean);
  m.append(h("h2", null, "Cells"), legend(OUTCOMES, "st-"), g, detail, ...checks);
  const byId = new Map(job.cells.map((c) => [c.id, c]));
  return live.on((type, ev) => {
    if (!ev.job || ev.job.id !== job.id) return;
    if (ev.job.counts) {
      clear(countsEl).append(countsBar(ev.job.counts), " ", countsText(ev.job.counts));
    }
    if (ev.job.state) clear(stateEl).append(stateBadge(ev.job.state));
    if (type === "job" && (ev.job.state === "done" || ev.job.state === "cancelled")) checks.forEach((c) => c.refresh());
    if (type === "cell" && ev.cell) {
      const c = byId.get(ev.cell.id);
      if (!c) return;
      Object.assign(c, ev.cell);
      c.td.className = "gcell st-" + c.state + (c.td.classList.contains("selected") ? " selected" : "");
      c.td.textContent = c.state.replace("_", " ");
    }
  });
}

async function showCell(job, c, panel) {
  clear(panel).append(
    h("h3", null, c.model + " · " + c.width + " · " + passLabel(c) + " ", h("span", { class: "badge st-" + c.state }, c.state)),
    h("dl", { class: "kv" },
      h("dt", null, "cell"), h("dd", { class: "mono" }, c.id),
      h("dt", null, "attempts"), h("dd", null, c.attempts),
      h("dt", null, "exit code"), h("dd", null, c.exit_code === null ? "–" : c.exit_code),
      h("dt", null, "signal"), h("dd", null, c.signal || "–"),
      h("dt", null, "reason"), h("dd", null, c.reason || "–"),
      h("dt", null, "effective width"), h("dd", null, c.effective_width || "–"),
      h("dt", null, "duration"), h("dd", null, fmtMs(c.duration_ms)),
      h("dt", null, "peak RSS"), h("dd", null, c.peak_rss_bytes ? (c.peak_rss_bytes / 1048576).toFixed(1) + " MiB" : "–")));
  const pre = h("pre", { class: "log" }, "loading log…");
  panel.append(h("h3", null, "Log"), pre);
  try {
    const text = await apiText("/v1/jobs/" + job.id + "/cells/" + c.id + "/log");
    pre.textContent = text || "(empty)";
  } catch (e) {
    pre.textContent = "log unavailable: " + e.message;
  }
}

/* ---- page: comparison ---- */

async function pageCompareForm() {
  const m = clear(main());
  const ctl = h("input", { placeholder: "control: job id or commit", size: 30 });
  const hd = h("input", { placeholder: "head: job id or commit", size: 30 });
  const sha = h("input", { placeholder: "commit", size: 30 });
  const f1 = h("form", { class: "filters" }, ctl, hd, h("button", { type: "submit" }, "Compare"));
  f1.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams({ control: ctl.value.trim(), head: hd.value.trim() });
    location.hash = "#/compare?" + p.toString();
  });
  const f2 = h("form", { class: "filters" }, sha, h("button", { type: "submit" }, "Diff against its control"));
  f2.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = "#/diff/" + encodeURIComponent(sha.value.trim());
  });
  m.append(h("h1", null, "Compare"),
    h("div", { class: "panel" }, h("h3", null, "Two jobs"), f1, h("h3", null, "A commit's diff"), f2));
  return null;
}

async function pageCompare(query, sha) {
  const m = clear(main());
  let url, title;
  if (sha) {
    url = "/v1/commits/" + encodeURIComponent(sha) + "/diff?tensors=1";
    title = "Diff of " + short(sha);
  } else {
    const q = parseQuery(query);
    if (!q.control || !q.head) return pageCompareForm();
    url = "/v1/compare?" + new URLSearchParams({ control: q.control, head: q.head, tensors: "1" }).toString();
    title = "Comparison";
  }
  m.append(h("h1", null, title));
  let r;
  try {
    r = await api(url);
  } catch (e) {
    if (e.status === 409 && e.body && e.body.verdict === "pending") {
      const ids = [e.body.control && e.body.control.job, e.body.head && e.body.head.job];
      m.append(h("div", { class: "panel", id: "pending" },
        h("span", { class: "badge big pending" }, "pending"), " ",
        "A job of this comparison has not finished. This page reloads when it does."));
      return live.on((type, ev) => {
        if (type === "job" && ev.job && ids.includes(ev.job.id) &&
            (ev.job.state === "done" || ev.job.state === "cancelled")) route();
      });
    }
    m.append(errorPanel(e));
    return null;
  }
  await loadWidthOrder();
  renderComparison(m, r);
  return null;
}

function renderComparison(m, r) {
  const c = r.counts || {};
  const side = (name, x) => h("div", null,
    h("h3", null, name),
    h("dl", { class: "kv" },
      h("dt", null, "job"), h("dd", null, h("a", { href: "#/jobs/" + x.job, class: "mono" }, x.job)),
      h("dt", null, "commit"), h("dd", { class: "mono" }, x.commit),
      h("dt", null, "branch"), h("dd", null, x.branch || "–"),
      h("dt", null, "build"), h("dd", null, x.build)));
  const counts = h("div", { class: "counts" },
    ["cells", "identical", "within_tolerance", "nondeterministic", "diverged", "incomparable",
      "missing_cells", "extra_cells", "outcome_regressions", "perf_regressions", "perf_improvements"]
      .map((k) => h("div", null, h("b", null, c[k] === undefined ? 0 : c[k]), k.replace(/_/g, " "))));
  m.append(
    h("div", { class: "panel" },
      h("span", { class: "badge big " + r.verdict, id: "verdict", "data-verdict": r.verdict }, r.verdict),
      r.mode === "cross_width" ? h("span", { class: "muted" }, "  cross-width: " + r.control_width + " → " + r.head_width) : null,
      counts,
      h("div", { class: "two" }, side("control", r.control), side("head", r.head))));
  for (const w of r.warnings || []) m.append(h("div", { class: "banner" }, "Warning: " + (w.message || JSON.stringify(w))));
  const env = envPanel(r.environment);
  if (env) m.append(env);

  const cells = (r.cells || []).map((x) => Object.assign({ kind: "cell" }, x));
  for (const x of r.missing_cells || []) cells.push(Object.assign({ kind: "missing", status: "missing" }, x));
  for (const x of r.extra_cells || []) cells.push(Object.assign({ kind: "extra", status: "extra" }, x));
  const detail = h("div", { class: "panel", id: "cmp-detail" });
  const g = grid(cells, (x) => "cs-" + x.status,
    (x) => [x.status.replace("_", " "), ...(x.perf && x.perf.verdict === "regression" ? [" ", perfMark()] : [])],
    (x) => showCmpCell(r, x, detail));
  g.id = "cmp-grid";
  m.append(h("h2", null, "Cells"), legend(STATUSES, "cs-"), g, detail);
  const first = cells.find((x) => x.status === "diverged") || cells.find((x) => x.kind === "cell");
  if (first && first.td) first.td.click();
}

/*
 * "What else differs": the build and environment fields that differ between
 * the two sides, in the order the engine ranks them (build and libraries
 * first), and any broken premise. Nothing when the fingerprints agree.
 */
function envPanel(env) {
  if (!env) return null;
  const diffs = env.differences || [], inc = env.inconsistent || [];
  if (!diffs.length && !inc.length) return null;
  const val = (v) => (v === null || v === undefined ? h("span", { class: "muted" }, "not set") : v);
  const rows = diffs.map((d) => h("tr", { "data-field": d.field, "data-group": d.group },
    h("td", null, d.group),
    h("td", { class: "mono" }, d.field),
    d.redacted ? h("td", { colspan: "2", class: "muted" }, "changed (value not shown)")
      : [h("td", { class: "mono env-val" }, val(d.control)), h("td", { class: "mono env-val" }, val(d.head))],
    h("td", null, String(d.cells))));
  const more = (env.differences_omitted || 0) > 0
    ? h("p", { class: "muted" }, env.differences_omitted + " more differences are not listed.") : null;
  return h("div", { class: "panel", id: "environment" },
    h("h2", null, "What else differs"),
    inc.map((x) => h("div", { class: "banner error" }, "Broken premise: " + x.side + " cells disagree on " + x.field + ": " +
      x.values.map((v) => (v.value === null ? "not set" : v.value) + " (" + v.cells + ")").join(", "))),
    h("p", { class: "muted" }, diffs.length + (env.differences_omitted || 0) + " difference(s) among " +
      env.fields_compared + " fields compared, control → head"),
    diffs.length ? h("table", { class: "list", id: "env-diffs" },
      h("thead", null, h("tr", null, ["group", "field", "control", "head", "cells"].map((x) => h("th", null, x)))),
      h("tbody", null, rows)) : null,
    more);
}

async function showCmpCell(r, x, panel) {
  clear(panel).append(h("h3", null, x.model + " · " + x.width + " · " + x.pass + " ",
    h("span", { class: "badge cs-" + x.status }, x.status)));
  if (x.kind !== "cell") {
    panel.append(h("p", null, x.kind === "missing" ? "The head has no such cell." : "The control has no such cell."));
    return;
  }
  const fd = x.first_divergence, fi = x.first_introduced;
  panel.append(h("dl", { class: "kv" },
    h("dt", null, "outcomes"), h("dd", null, (x.control_outcome || "–") + " → " + (x.head_outcome || "–"),
      x.outcome_change && x.outcome_change !== "none" ? " (" + x.outcome_change + ")" : ""),
    x.incomparable_reason ? [h("dt", null, "incomparable"), h("dd", null, x.incomparable_reason)] : null,
    h("dt", null, "tensors"), h("dd", null, x.tensors_compared + " compared: " + x.tensors_identical + " identical, " +
      x.tensors_within_tolerance + " within tolerance, " + x.tensors_diverged + " diverged, " +
      x.tensors_nondeterministic + " nondeterministic; " + x.missing_keys + " missing, " + x.extra_keys + " extra"),
    h("dt", null, "first divergence"), h("dd", { class: "mono", id: "first-divergence" }, fd ? fd.key + (fd.max_rel !== undefined ? "  (max rel " + fmtNum(fd.max_rel) + ")"
      : fd.derived ? "  (max rel >= " + fmtNum(fd.derived.max_rel_lower) + ", l2 rel >= " + fmtNum(fd.derived.rel_l2_lower) +
        ", derived from stats; rerun at capture sample for elementwise error)" : "") : "none"),
    h("dt", null, "first introduced"), h("dd", { class: "mono" }, fi ? fi.key : "none"),
    opOrigin(x.op_origin),
    divergenceDetail(x)));
  panel.append(replayPanel(r, x));

  panel.append(h("h3", null, "Relative error per layer, in execution order"));
  panel.append(divergencePlot(x));

  panel.append(h("h3", null, "Timing: control vs head"));
  const perf = x.perf;
  if (perf) {
    panel.append(h("p", null,
      h("span", { class: "badge " + (perf.verdict === "regression" ? "regression" : perf.verdict === "improvement" ? "pass" : "pending") }, perf.verdict),
      "  median " + fmtNs(perf.control_median_ns) + " → " + fmtNs(perf.head_median_ns) +
      ", ratio " + fmtNum(perf.ratio, 4) +
      (perf.ci99 ? ", 99% CI [" + fmtNum(perf.ci99[0], 4) + ", " + fmtNum(perf.ci99[1], 4) + "]" : "") +
      (perf.p_value !== null && perf.p_value !== undefined ? ", p = " + fmtNum(perf.p_value, 3) : "") +
      ", n = " + perf.n_control + " / " + perf.n_head));
    panel.append(profileSection(perf) || "");
  }
  const holder = h("div", { id: "timing" }, h("p", { class: "muted" }, "loading samples…"));
  panel.append(holder);
  try {
    const [cs, hs] = await Promise.all([
      timingSamples(r.control.job, x.model, x.control_width || x.width, x.pass, x.mode),
      timingSamples(r.head.job, x.model, x.width, x.pass, x.mode)]);
    clear(holder).append(timingPlot(cs, hs, perf));
  } catch (e) {
    clear(holder).append(h("p", { class: "muted" }, "timing samples unavailable: " + e.message));
  }
}

/* ---- router ---- */

let unsubscribe = null;
let routeGen = 0;

async function route() {
  if (unsubscribe) {
    unsubscribe();
    unsubscribe = null;
  }
  const gen = ++routeGen;
  const rendered = location.hash;
  view = h("div", { class: "view" });
  document.getElementById("main").replaceChildren(view);
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  let un = null;
  if (parts.length === 0) un = await pageJobs(query);
  else if (parts[0] === "jobs" && parts[1]) un = await pageJob(parts[1]);
  else if (parts[0] === "compare") un = await pageCompare(query, null);
  else if (parts[0] === "diff" && parts[1]) un = await pageCompare(null, parts[1]);
  else if (parts[0] === "history") un = await pageHistory(query);
  else if (parts[0] === "alerts") un = await pageAlerts(query);
  else if (parts[0] === "bisect") un = await (parts[1] ? pageBisect(parts[1]) : pageBisectList());
  else {
    clear(main()).append(h("p", null, "No such page. ", h("a", { href: "#/" }, "Jobs")));
  }
  if (gen !== routeGen) {
    // The hash moved on while this page loaded: a newer route owns the page.
    if (un) un();
    return;
  }
  unsubscribe = un;
  document.body.dataset.page = parts[0] || "jobs";
  document.body.dataset.route = rendered;
  document.body.dataset.ready = "1";
}

window.addEventListener("hashchange", () => {
  document.body.dataset.ready = "0";
  route();
});
window.addEventListener("DOMContentLoaded", () => {
  setupToken();
  live.connect();
  route();
});
