// web/widthcheck.js - the job page's "Width self-check" panel: each width
// of the job against its own default cells (GET /v1/jobs/{id}/widths,
// docs/widths.md "Width self-check"), one row per width with its verdict
// and where it first left the scalar path. Shown for a job whose matrix
// has default and another width; filled once the job has finished (the
// job page calls refresh() again when it does). Loaded before app.js,
// whose helpers (h, clear, api) it calls at run time.
"use strict";

const WIDTH_VERDICT_CLASS = { pass: "pass", diverged: "regression", incomplete: "pending" };

/* "mlp forward: layer fc1, op aten::mul, fc1.0.forward.output.0 (tolerance,
 * rule reference_float64)". */
function widthSiteText(fd) {
  const where = [fd.module ? "layer " + fd.module : null, fd.op ? "op " + fd.op : null, fd.key].filter(Boolean);
  return fd.model + " " + fd.pass + ": " + where.join(", ") + " (" + (fd.reason || "within tolerance") + ", rule " + fd.rule + ")";
}

function widthCountsText(c) {
  const parts = ["identical", "within_tolerance", "nondeterministic", "diverged", "incomparable", "unsupported", "not_run", "missing"]
    .filter((k) => c[k]).map((k) => c[k] + " " + k.replace(/_/g, " "));
  return c.compared + "/" + c.cells + " compared" + (parts.length ? ": " + parts.join(", ") : "");
}

function widthCheckTable(r) {
  const rows = r.widths.map((w) => h("tr", { "data-width": w.width, "data-verdict": w.verdict },
    h("td", { class: "mono" }, w.width),
    h("td", null, h("span", { class: "badge " + (WIDTH_VERDICT_CLASS[w.verdict] || "pending") }, w.verdict)),
    h("td", null, widthCountsText(w.counts)),
    h("td", { class: "mono" }, w.first_divergence ? widthSiteText(w.first_divergence) : "–")));
  return h("table", { class: "list", id: "width-check-table" },
    h("thead", null, h("tr", null, ["width", "verdict", "cells", "first divergence"].map((x) => h("th", null, x)))),
    h("tbody", null, rows));
}

/* The panel for JOB, or null when its matrix has no default and other
 * width to check; panel.refresh() (re)loads it. */
function widthCheckPanel(job) {
  const widths = (job.matrix && job.matrix.widths) || [];
  if (!widths.includes("default") || widths.length < 2) return null;
  const body = h("div", null);
  const panel = h("div", { class: "panel", id: "width-check" }, h("h2", null, "Width self-check"), body);
  panel.refresh = async () => {
    clear(body).append(h("p", { class: "muted" }, "Each width against this job's default cells; loading…"));
    let r;
    try {
      r = await api("/v1/jobs/" + encodeURIComponent(job.id) + "/widths");
    } catch (e) {
      const pending = e.status === 409 && e.code === "pending";
      clear(body).append(h("p", { class: "muted" }, pending ? "Each width is checked against default when the job has finished." : "Unavailable: " + e.message));
      return;
    }
    clear(body).append(
      h("p", null, h("span", { class: "badge " + (WIDTH_VERDICT_CLASS[r.verdict] || "pending"), id: "width-check-verdict", "data-verdict": r.verdict }, r.verdict),
        "  every width against default, judged by " + (r.reference === "float64" ? "the float64 reference" : "the tolerance rule")),
      r.note ? h("p", { class: "muted" }, r.note) : null,
      widthCheckTable(r));
  };
  panel.refresh();
  return panel;
}
