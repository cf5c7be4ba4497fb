// web/plots.js - the comparison page's two plots, drawn as inline SVG: the
// relative error of every layer in execution order (measured, or the lower
// bound derived from statistics) and the timing samples of both sides.
// Loaded before app.js, whose helpers (s, h, fmtNs, fmtNum, api) they call
// at run time.
"use strict";

/* The relative error a row is drawn at: measured (max_rel) on the sample
 * and full bases, else the lower bound derived from the two sides'
 * statistics (derived.max_rel_lower, derived_from "stats"). */
function relOf(t) {
  if (typeof t.max_rel === "number") return t.max_rel;
  if (t.derived && typeof t.derived.max_rel_lower === "number") return t.derived.max_rel_lower;
  return null;
}

/* Every row of the comparison's per-tensor table, in head execution order,
 * on a log scale of max relative error. Identical rows have no error by
 * definition and sit on the bottom line, as do exact zeros. Rows compared
 * on statistics only (capture "stats") have no element error: they are
 * drawn, hollow, at the lower bound derived from the statistics, and a
 * diverged one without any size on the top line. */
function divergencePlot(x) {
  const rows = (x.tensors || []).slice().sort((a, b) => a.seq - b.seq);
  const W = 760, H = 260, L = 64, R = 14, T = 14, B = 40;
  const svg = s("svg", { class: "plot", id: "divergence-plot", width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" });
  if (!rows.length) {
    svg.append(s("text", { x: L, y: H / 2 }, x.tensors === undefined ? "no per-tensor rows" : "no tensors were compared"));
    return svg;
  }
  const vals = rows.map((t) => { const v = relOf(t); return v !== null && v > 0 ? v : null; }).filter((v) => v !== null);
  let lo = vals.length ? Math.floor(Math.log10(Math.min(...vals))) - 1 : -9;
  let hi = vals.length ? Math.ceil(Math.log10(Math.max(...vals))) : -6;
  const tol = rows.find((t) => typeof t.rtol === "number");
  if (tol && tol.rtol > 0) {
    lo = Math.min(lo, Math.floor(Math.log10(tol.rtol)) - 1);
    hi = Math.max(hi, Math.ceil(Math.log10(tol.rtol)));
  }
  lo = Math.max(lo, -18);
  if (hi <= lo) hi = lo + 1;
  const floorY = H - B + 10;
  const xOf = (i) => L + (rows.length === 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (rows.length - 1));
  const yOf = (v) => T + ((hi - Math.log10(v)) * (H - B - T)) / (hi - lo);
  for (let e = lo; e <= hi; e++) {
    const y = yOf(Math.pow(10, e));
    svg.append(s("line", { class: "gridline", x1: L, x2: W - R, y1: y, y2: y }),
      s("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, "1e" + e));
  }
  svg.append(s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }),
    s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }),
    s("text", { x: L - 6, y: floorY + 4, "text-anchor": "end" }, "0"),
    s("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, "record in execution order (" + rows.length + ")"));
  if (tol && tol.rtol > 0) {
    const y = yOf(tol.rtol);
    svg.append(s("line", { class: "tol", x1: L, x2: W - R, y1: y, y2: y }),
      s("text", { x: W - R - 4, y: y - 4, "text-anchor": "end" }, "rtol " + fmtNum(tol.rtol)));
  }
  const path = [];
  const fdKey = x.first_divergence ? x.first_divergence.key : null;
  const fiKey = x.first_introduced ? x.first_introduced.key : null;
  const marks = [];
  rows.forEach((t, i) => {
    const v = relOf(t);
    const derived = t.derived_from === "stats" && typeof t.max_rel !== "number";
    const nonfinite = (t.nonfinite && t.nonfinite.max_rel) || (t.derived && t.derived.nonfinite && t.derived.nonfinite.max_rel_lower);
    let y;
    if (nonfinite) y = T;
    else if (v === null && t.status === "diverged") y = T; /* nothing to size it by */
    else if (v === null || v <= 0) y = floorY;
    else y = Math.max(T, Math.min(H - B, yOf(v)));
    const px = xOf(i);
    path.push((i ? "L" : "M") + px.toFixed(1) + " " + y.toFixed(1));
    const isFd = t.key === fdKey;
    const c = s("circle", {
      class: "pt " + t.status + (derived ? " derived" : "") + (isFd ? " first-divergence" : ""),
      cx: px.toFixed(1), cy: y.toFixed(1), r: isFd ? 5 : 3.2,
      "data-key": t.key, "data-seq": t.seq, "data-status": t.status,
    }, s("title", null, t.key + "\n" + t.status + (v !== null ? (derived ? "\nmax rel >= " + fmtNum(v) + " (derived from stats; capture sample for elementwise)" : "\nmax rel " + fmtNum(v)) : "") + (t.reason ? "\nreason " + t.reason : "")));
    if (derived) c.setAttribute("data-derived-from", "stats");
    marks.push(c);
    if (isFd || (t.key === fiKey && fiKey !== fdKey)) {
      svg.append(s("line", { class: "marker" + (isFd ? "" : " introduced"), x1: px, x2: px, y1: T, y2: H - B }),
        s("text", { x: Math.min(px + 4, W - R - 160), y: T + 10 + (isFd ? 0 : 14), class: isFd ? "fd-label" : "fi-label" },
          (isFd ? "first divergence: " : "first introduced: ") + t.key));
    }
  });
  if (rows.some((t) => t.derived_from === "stats" && typeof t.max_rel !== "number"))
    svg.append(s("text", { x: L + 4, y: H - B - 6, class: "derived-label" },
      "open points: lower bounds derived from stats (rerun at capture sample for elementwise error)"));
  svg.append(s("path", { class: "line", d: path.join(" ") }));
  for (const c of marks) svg.append(c);
  return svg;
}

/* The raw timing samples of one cell (records of kind timing), by phase. */
async function timingSamples(jobId, model, width, pass, mode) {
  const job = await api("/v1/jobs/" + encodeURIComponent(jobId));
  const cell = (job.cells || []).find((c) => c.model === model && c.width === width && c.pass === pass &&
    (c.mode || "eager") === (mode || "eager"));
  if (!cell) return {};
  const rec = await api("/v1/jobs/" + jobId + "/cells/" + cell.id + "/records?kind=timing&limit=100");
  const out = {};
  for (const t of rec.records || []) {
    const ph = t.phase || "run";
    out[ph] = (out[ph] || []).concat(t.samples_ns || []);
  }
  return out;
}

function quantile(sorted, q) {
  if (!sorted.length) return null;
  const pos = (sorted.length - 1) * q, i = Math.floor(pos), f = pos - i;
  return i + 1 < sorted.length ? sorted[i] + f * (sorted[i + 1] - sorted[i]) : sorted[i];
}

/* A strip of every sample with its box (quartiles, median) for control
 * and head, one pair per phase, on a shared axis. */
function timingPlot(ctl, head, perf) {
  const phases = [...new Set([...Object.keys(ctl), ...Object.keys(head)])];
  const W = 760, L = 90, R = 44, rowH = 34;
  if (!phases.length) return h("p", { class: "muted" }, "no timing samples recorded");
  const all = [];
  for (const p of phases) all.push(...(ctl[p] || []), ...(head[p] || []));
  let lo = Math.min(...all), hi = Math.max(...all);
  if (hi === lo) { lo *= 0.95; hi *= 1.05; }
  const pad = (hi - lo) * 0.05;
  lo -= pad; hi += pad;
  const H = 30 + phases.length * rowH * 2 + 10;
  const svg = s("svg", { class: "plot", id: "timing-plot", width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" });
  const xOf = (v) => L + ((v - lo) * (W - L - R)) / (hi - lo);
  for (let i = 0; i <= 4; i++) {
    const v = lo + ((hi - lo) * i) / 4, x = xOf(v);
    svg.append(s("line", { class: "gridline", x1: x, x2: x, y1: 8, y2: H - 22 }),
      s("text", { x, y: H - 8, "text-anchor": "middle" }, fmtNs(v)));
  }
  let y = 16;
  let seed = 7;
  const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
  for (const p of phases) {
    for (const [name, cls, src] of [["control", "ctl", ctl], ["head", "hd", head]]) {
      const v = (src[p] || []).slice().sort((a, b) => a - b);
      const mid = y + rowH / 2;
      svg.append(s("text", { x: L - 8, y: mid + 4, "text-anchor": "end" }, name + (phases.length > 1 ? " " + p : "")));
      if (v.length) {
        const q1 = quantile(v, 0.25), q2 = quantile(v, 0.5), q3 = quantile(v, 0.75);
        svg.append(s("rect", { class: "box", x: xOf(q1), y: mid - 9, width: Math.max(1, xOf(q3) - xOf(q1)), height: 18 }),
          s("line", { class: "median", x1: xOf(q2), x2: xOf(q2), y1: mid - 11, y2: mid + 11 }));
        for (const t of v) {
          svg.append(s("circle", { class: cls, cx: xOf(t).toFixed(1), cy: (mid + (rand() - 0.5) * 14).toFixed(1), r: 2.2, "fill-opacity": 0.6 },
            s("title", null, fmtNs(t))));
        }
      }
      y += rowH;
    }
  }
  const wrap = h("div", null, svg);
  if (perf && perf.hl_shift_ns !== undefined && perf.hl_shift_ns !== null) {
    wrap.append(h("p", { class: "muted" }, "Hodges-Lehmann shift " + fmtNs(perf.hl_shift_ns, true) + " (head − control)"));
  }
  return wrap;
}
