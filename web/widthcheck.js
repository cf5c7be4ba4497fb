// web/widthcheck.js - the job page's self-check panels: "Width self-check",
// each width of the job against its own default cells (GET
// /v1/jobs/{id}/widths, docs/widths.md "Width self-check"), and "Mode
// self-check", each compiled mode against its own eager cells at the same
// width (GET /v1/jobs/{id}/modes, docs/api.md "Compiled cells"); one row per
// width (mode) with its verdict and where it first left the baseline. Shown
// for a job whose matrix has the baseline and another value; filled once
// the job has finished (the job page calls refresh() again when it does).
// Loaded before app.js, whose helpers (h, clear, api) it calls at run time.
"use strict";

const WIDTH_VERDICT_CLASS = { pass: "pass", diverged: "regression", incomplete: "pending" };

/* The two axes: the matrix list, the baseline, the words and element ids. */
const SELF_CHECKS = {
  width: { list: "widths", baseline: "default", title: "Width self-check", id: "width-check",
    what: "every width against default", pending: "Each width is checked against default when the job has finished." },
  mode: { list: "modes", baseline: "eager", title: "Mode self-check", id: "mode-check",
    what: "every compiled mode against eager at the same width", pending: "Each compiled mode is checked against eager when the job has finished." },
};

/* "mlp forward: layer fc1, op aten::mul, fc1.0.forward.output.0 (tolerance,
 * rule reference_float64)"; a mode's site names its width ("mlp forward at
 * avx2: ..."). */
function widthSiteText(fd) {
  const where = [fd.module ? "layer " + fd.module : null, fd.op ? "op " + fd.op : null, fd.key].filter(Boolean);
  const cell = fd.model + " " + fd.pass + (fd.width && !fd.mode ? " at " + fd.width : "");
  return cell + ": " + where.join(", ") + " (" + (fd.reason || "within tolerance") + ", rule " + fd.rule + ")";
}

function widthCountsText(c) {
  const parts = ["identical", "within_tolerance", "nondeterministic", "diverged", "incomparable", "unsupported", "not_run", "missing"]
    .filter((k) => c[k]).map((k) => c[k] + " " + k.replace(/_/g, " "));
  return c.compared + "/" + c.cells + " compared" + (parts.length ? ": " + parts.join(", ") : "");
}

function selfCheckTable(r, axis, ax) {
  const rows = r[ax.list].map((w) => h("tr", { ["data-" + axis]: w[axis], "data-verdict": w.verdict },
    h("td", { class: "mono" }, w[axis]),
    h("td", null, h("span", { class: "badge " + (WIDTH_VERDICT_CLASS[w.verdict] || "pending") }, w.verdict)),
    h("td", null, widthCountsText(w.counts)),
    h("td", { class: "mono" }, w.first_divergence ? widthSiteText(w.first_divergence) : "–")));
  return h("table", { class: "list", id: ax.id + "-table" },
    h("thead", null, h("tr", null, [axis, "verdict", "cells", "first divergence"].map((x) => h("th", null, x)))),
    h("tbody", null, rows));
}

/* The AXIS ("width" or "mode") panel for JOB, or null when its matrix has
 * no baseline and other value to check; panel.refresh() (re)loads it. */
function selfCheckPanel(job, axis) {
  const ax = SELF_CHECKS[axis];
  const values = (job.matrix && job.matrix[ax.list]) || [];
  if (!values.includes(ax.baseline) || values.length < 2) return null;
  const body = h("div", null);
  const panel = h("div", { class: "panel", id: ax.id }, h("h2", null, ax.title), body);
  panel.refresh = async () => {
    clear(body).append(h("p", { class: "muted" }, ax.what + "; loading…"));
    let r;
    try {
      r = await api("/v1/jobs/" + encodeURIComponent(job.id) + "/" + ax.list);
    } catch (e) {
      const pending = e.status === 409 && e.code === "pending";
      clear(body).append(h("p", { class: "muted" }, pending ? ax.pending : "Unavailable: " + e.message));
      return;
    }
    clear(body).append(
      h("p", null, h("span", { class: "badge " + (WIDTH_VERDICT_CLASS[r.verdict] || "pending"), id: ax.id + "-verdict", "data-verdict": r.verdict }, r.verdict),
        "  " + ax.what + ", judged by " + (r.reference === "float64" ? "the float64 reference" : "the tolerance rule")),
      r.note ? h("p", { class: "muted" }, r.note) : null,
      selfCheckTable(r, axis, ax));
  };
  panel.refresh();
  return panel;
}

function widthCheckPanel(job) {
  return selfCheckPanel(job, "width");
}

function modeCheckPanel(job) {
  return selfCheckPanel(job, "mode");
}
