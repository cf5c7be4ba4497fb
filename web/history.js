// web/history.js - the history page, #/history?project=&branch=&model=&width=&pass=:
// per cell of the branch a time series along its commits (GET /v1/history):
// the perf observation (the median of the cell's timing samples) with the
// mean and spread of each segment between change points, the peak memory,
// and the numerics and outcome of every point, with change points and the
// other alerts marked. Every point links to its commit's diff. Loaded
// before app.js, whose helpers (h, s, api, clear, main, fmtNs, ...) it
// calls at run time.
"use strict";

const HIST_MAX_SERIES = 24;

/* The cells to plot: the one the query names in full, else the cells of
 * the branch's newest job that match what it names. */
async function historySeries(q) {
  if (q.model && q.width && q.pass) return [{ model: q.model, width: q.width, pass: q.pass }];
  const list = await api("/v1/jobs?" + new URLSearchParams({ project: q.project, branch: q.branch, limit: "1" }));
  if (!list.jobs || !list.jobs.length) return [];
  const job = await api("/v1/jobs/" + encodeURIComponent(list.jobs[0].id));
  await loadWidthOrder();
  return (job.cells || [])
    .filter((c) => (!q.model || c.model === q.model) && (!q.width || c.width === q.width) && (!q.pass || c.pass === q.pass))
    .map((c) => ({ model: c.model, width: c.width, pass: c.pass }))
    .sort((a, b) => (a.model < b.model ? -1 : a.model > b.model ? 1 : byWidthOrder(a.width, b.width) || byPassOrder(a.pass, b.pass)));
}

function historyLink(a) {
  const p = new URLSearchParams({ project: a.project, branch: a.branch, model: a.model, width: a.width, pass: a.pass });
  return "#/history?" + p.toString();
}

function historyForm(q) {
  const names = ["project", "branch", "model", "width", "pass"];
  const inputs = names.map((n) => h("input", { name: n, placeholder: n, value: q[n] || "", size: n === "project" || n === "branch" ? 14 : 10 }));
  const form = h("form", { class: "filters", id: "history-form" }, inputs, h("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    inputs.forEach((i, k) => { if (i.value.trim()) p.set(names[k], i.value.trim()); });
    location.hash = "#/history?" + p.toString();
  });
  return form;
}

async function pageHistory(query) {
  const q = parseQuery(query);
  const m = clear(main());
  m.append(h("h1", null, "History"), historyForm(q));
  if (!q.project || !q.branch) {
    m.append(h("p", { class: "muted" }, "Name a project and a branch (and optionally a model, width and pass) to plot its cells along the branch."));
    return null;
  }
  let series;
  try {
    series = await historySeries(q);
  } catch (e) {
    m.append(errorPanel(e));
    return null;
  }
  if (!series.length) {
    m.append(h("p", { class: "muted", id: "history-empty" }, "No cells of this branch match."));
    return null;
  }
  if (series.length > HIST_MAX_SERIES)
    m.append(h("p", { class: "muted" }, series.length + " cells; the first " + HIST_MAX_SERIES + " are plotted: name a model, width or pass for others."));
  for (const c of series.slice(0, HIST_MAX_SERIES)) {
    const sec = h("section", { class: "panel series", "data-model": c.model, "data-width": c.width, "data-pass": c.pass },
      h("h2", null, c.model + " · " + c.width + " · " + c.pass), h("p", { class: "muted" }, "loading…"));
    m.append(sec);
    const p = new URLSearchParams({ project: q.project, branch: q.branch, model: c.model, width: c.width, pass: c.pass, limit: "200" });
    try {
      renderSeries(sec, await api("/v1/history?" + p.toString()));
    } catch (e) {
      sec.lastChild.textContent = e.status === 404 ? "No points yet." : "Could not load: " + e.message;
    }
  }
  return null;
}

function renderSeries(sec, r) {
  sec.lastChild.remove();
  sec.dataset.status = r.status;
  const pts = r.points || [];
  const cps = r.change_points || [], evs = r.events || [];
  sec.querySelector("h2").append(" ", h("span", { class: "badge " + (r.status === "ok" ? "done" : "pending") }, r.status.replace("_", " ")),
    h("span", { class: "muted" }, "  " + pts.length + " commits"));
  const perfCps = cps.filter((a) => a.kind === "perf"), memCps = cps.filter((a) => a.kind === "memory");
  sec.append(h("h3", null, "Time (median of the timing samples)"),
    seriesPlot("perf", pts, (p) => (p.outcome === "ok" ? p.perf_ns : null), perfCps, fmtNs),
    h("h3", null, "Peak memory"),
    seriesPlot("memory", pts, (p) => p.peak_rss_bytes || null, memCps, fmtBytes),
    h("h3", null, "Numerics and outcome"),
    eventStrip(pts, evs),
    alertList(cps.concat(evs)));
}

function fmtBytes(b) {
  if (b === null || b === undefined) return "–";
  return b >= 1073741824 ? (b / 1073741824).toFixed(2) + " GiB" : (b / 1048576).toFixed(1) + " MiB";
}

function pointTitle(p) {
  return short(p.commit) + (p.ordered_by === "submission" ? " (placed by submission time)" : "") +
    "\noutcome " + p.outcome + "\ntime " + fmtNs(p.perf_ns) + (p.perf_samples ? " (median of " + p.perf_samples + " processes' fastest samples)" : "") +
    "\npeak memory " + fmtBytes(p.peak_rss_bytes) + "\nnumerics " + p.numerics +
    (p.first_divergent_key ? " at " + p.first_divergent_key : "") + "\nclick for the diff";
}

const HP = { W: 760, H: 190, L: 78, R: 16, T: 16, B: 26 };

function xAt(n, i) {
  return HP.L + (n === 1 ? (HP.W - HP.L - HP.R) / 2 : (i * (HP.W - HP.L - HP.R)) / (n - 1));
}

/* The mean ± sd of each segment between change points: before the first
 * one its "before", after each one its "after". */
function segments(n, idx, cps) {
  const out = [];
  const order = cps.map((a) => ({ a, i: idx.get(a.first_bad) })).filter((x) => x.i !== undefined).sort((x, y) => x.i - y.i);
  order.forEach((x, k) => {
    if (k === 0 && x.a.detail && x.a.detail.before) out.push({ from: 0, to: x.i - 1, st: x.a.detail.before });
    const to = k + 1 < order.length ? order[k + 1].i - 1 : n - 1;
    if (x.a.detail && x.a.detail.after) out.push({ from: x.i, to, st: x.a.detail.after });
  });
  return out;
}

/* One metric along the commits: a point per commit (a link to its diff),
 * the segments' mean and spread, and a dashed line at each change point
 * between its last good and first bad commit, labelled. */
function seriesPlot(kind, pts, valueOf, cps, fmt) {
  const { W, H, L, R, T, B } = HP;
  const svg = s("svg", { class: "plot hist-plot", "data-kind": kind, width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" });
  const vals = pts.map(valueOf);
  const have = vals.filter((v) => typeof v === "number");
  if (!have.length) {
    svg.append(s("text", { x: L, y: H / 2 }, "no values"));
    return svg;
  }
  const idx = new Map(pts.map((p, i) => [p.commit, i]));
  const segs = segments(pts.length, idx, cps);
  let lo = Math.min(...have), hi = Math.max(...have);
  for (const g of segs) { lo = Math.min(lo, g.st.mean - g.st.sd); hi = Math.max(hi, g.st.mean + g.st.sd); }
  const pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.05 || 1;
  lo = Math.max(0, lo - pad); hi += pad;
  const yOf = (v) => T + ((hi - v) * (H - B - T)) / (hi - lo);
  for (let k = 0; k <= 3; k++) {
    const v = lo + ((hi - lo) * k) / 3, y = yOf(v);
    svg.append(s("line", { class: "gridline", x1: L, x2: W - R, y1: y, y2: y }), s("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, fmt(v)));
  }
  svg.append(s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }), s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }),
    s("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle" }, "commit along the branch, oldest first (" + pts.length + ")"));
  const n = pts.length, half = n > 1 ? (xAt(n, 1) - xAt(n, 0)) / 2 : 20;
  for (const g of segs) {
    const x1 = xAt(n, g.from) - half / 2, x2 = xAt(n, g.to) + half / 2;
    svg.append(s("rect", { class: "seg-band", x: x1, y: yOf(g.st.mean + g.st.sd), width: Math.max(1, x2 - x1), height: Math.max(1, yOf(g.st.mean - g.st.sd) - yOf(g.st.mean + g.st.sd)) },
      s("title", null, "mean " + fmt(g.st.mean) + " ± " + fmt(g.st.sd) + " over " + g.st.n + " points")),
    s("line", { class: "seg-mean", x1, x2, y1: yOf(g.st.mean), y2: yOf(g.st.mean) }));
  }
  for (const a of cps) {
    const i = idx.get(a.first_bad);
    if (i === undefined) continue;
    const x = i > 0 ? (xAt(n, i) + xAt(n, i - 1)) / 2 : xAt(n, i);
    const mag = a.detail && typeof a.detail.magnitude === "number" ? " " + (a.detail.magnitude >= 0 ? "+" : "") + (100 * a.detail.magnitude).toFixed(1) + "%" : "";
    svg.append(s("line", { class: "cp-marker " + a.label + " alert-" + a.status, x1: x, x2: x, y1: T, y2: H - B, "data-commit": a.first_bad, "data-label": a.label, "data-alert": a.id },
      s("title", null, a.label + mag + " at " + short(a.first_bad) + " (after " + short(a.last_good) + "), alert " + a.status)),
    s("text", { class: "cp-label", x: Math.min(x + 4, W - R - 150), y: T + 10 }, a.label + mag + " · " + a.status));
  }
  const path = [];
  pts.forEach((p, i) => {
    const v = vals[i];
    if (typeof v !== "number") return;
    path.push((path.length ? "L" : "M") + xAt(n, i).toFixed(1) + " " + yOf(v).toFixed(1));
  });
  svg.append(s("path", { class: "line", d: path.join(" ") }));
  pts.forEach((p, i) => {
    const v = vals[i];
    if (typeof v !== "number") return;
    svg.append(s("a", { href: "#/diff/" + encodeURIComponent(p.commit), class: "pt-link" },
      s("circle", { class: "hpt" + (p.ordered_by === "submission" ? " by-submission" : ""), cx: xAt(n, i).toFixed(1), cy: yOf(v).toFixed(1), r: 3.4,
        "data-commit": p.commit, "data-index": i, "data-value": v }, s("title", null, pointTitle(p)))));
  });
  return svg;
}

/* One square per commit: its numerics against the previous commit and its
 * outcome; numerics and outcome alerts are marked and labelled. */
function eventStrip(pts, evs) {
  const { W, L, R } = HP, H = 64, n = pts.length;
  const svg = s("svg", { class: "plot hist-plot", "data-kind": "numerics", width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" });
  svg.append(s("text", { x: L - 6, y: 24, "text-anchor": "end" }, "numerics"), s("text", { x: L - 6, y: 46, "text-anchor": "end" }, "outcome"));
  const sz = Math.max(3, Math.min(12, n > 1 ? xAt(n, 1) - xAt(n, 0) - 2 : 12));
  pts.forEach((p, i) => {
    const x = xAt(n, i) - sz / 2;
    svg.append(s("a", { href: "#/diff/" + encodeURIComponent(p.commit), class: "pt-link" },
      s("rect", { class: "num-" + p.numerics, x, y: 14, width: sz, height: 14, "data-commit": p.commit, "data-numerics": p.numerics }, s("title", null, pointTitle(p))),
      s("rect", { class: "st-" + p.outcome, x, y: 36, width: sz, height: 14, "data-commit": p.commit }, s("title", null, pointTitle(p)))));
  });
  const idx = new Map(pts.map((p, i) => [p.commit, i]));
  for (const a of evs) {
    const i = idx.get(a.first_bad);
    if (i === undefined) continue;
    const x = xAt(n, i);
    const what = a.kind === "numerics" ? (a.detail && a.detail.first_divergent_key) || "" : a.detail ? a.detail.before + " → " + a.detail.after : "";
    svg.append(s("path", { class: "ev-marker " + a.kind + " alert-" + a.status, d: `M${x - 5} 4 L${x + 5} 4 L${x} 11 Z`, "data-commit": a.first_bad, "data-kind": a.kind, "data-alert": a.id },
      s("title", null, a.kind + " " + a.label + " at " + short(a.first_bad) + ": " + what + " (alert " + a.status + ")")),
    s("text", { class: "ev-label", x: Math.min(x + 8, W - R - 220), y: 10 }, a.kind + " " + a.label + (what ? ": " + what : "")));
  }
  return svg;
}

function alertSummary(a) {
  const d = a.detail || {};
  if (a.kind === "numerics") return "first divergent " + (d.first_divergent_key || "–");
  if (a.kind === "outcome") return (d.before || "–") + " → " + (d.after || "–");
  if (typeof d.magnitude !== "number") return "";
  const pct = (x) => (x >= 0 ? "+" : "") + (100 * x).toFixed(1) + "%";
  return pct(d.magnitude) + (d.magnitude_ci ? " [" + pct(d.magnitude_ci[0]) + ", " + pct(d.magnitude_ci[1]) + "]" : "") +
    (typeof d.p_value === "number" ? ", p = " + fmtNum(d.p_value, 2) : "");
}

function alertList(all) {
  if (!all.length) return h("p", { class: "muted" }, "No change points or events.");
  return h("table", { class: "list hist-alerts" },
    h("thead", null, h("tr", null, ["kind", "label", "first bad", "last good", "change", "status"].map((x) => h("th", null, x)))),
    h("tbody", null, all.map((a) => h("tr", { "data-alert-id": a.id, "data-kind": a.kind },
      h("td", null, a.kind), h("td", null, h("span", { class: "badge lbl-" + a.label }, a.label)),
      h("td", null, h("a", { href: "#/diff/" + encodeURIComponent(a.first_bad), class: "mono" }, short(a.first_bad))),
      h("td", { class: "mono" }, short(a.last_good)), h("td", null, alertSummary(a)), h("td", null, a.status)))));
}
