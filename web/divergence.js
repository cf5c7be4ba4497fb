// web/divergence.js - what the comparison page says about a diverged
// cell beyond its first divergent key: the op and its CPU kernel, the
// provenance note (stale generated wrappers of the kernel's file in the
// head's source tree), how the first divergence's error grew, and where
// the cell's error grew most (docs/compare.md, "Kernel attribution" and
// "Error amplification"). Loaded before app.js, whose helpers (h, fmtNum)
// it calls at run time.
"use strict";

/* The kernel as the reports name it: a stub and its file, or its kind. */
function kernelText(k) {
  if (k.kind === "stub") return k.stub + ", " + k.file;
  if (k.kind === "unknown") return "not in capd's kernel table";
  const kind = { blas: "BLAS", onednn: "oneDNN", native: "native (no DispatchStub)" }[k.kind] || k.kind;
  return kind + " kernel, " + k.file;
}

/* The provenance note: the head's stale generated wrappers of the kernel's
 * file, the paths the attribution kept, or why there is no count. */
function provenanceNote(k) {
  if (k.stale_wrappers === undefined) return h("span", { class: "muted" }, "no provenance scan (submit with --source-tree)");
  if (k.stale_wrappers === 0) return "no stale generated wrapper of " + k.file + " in the source tree";
  const paths = k.stale_wrapper_paths || [];
  const more = k.stale_wrappers - paths.length;
  return h("span", null, k.stale_wrappers + " stale generated wrapper" + (k.stale_wrappers === 1 ? "" : "s") +
    " of this file in the source tree: ",
    paths.flatMap((p, i) => [i ? ", " : "", h("code", { class: "stale-path" }, p)]),
    more > 0 ? " and " + more + " more" : "");
}

/* first_divergence_growth in words: introduced, amplified or carried. */
function growthText(g) {
  if (g.kind === "introduced") return "introduced here: inputs exact, relative error " + fmtNum(g.out_rel_err, 3);
  const io = "relative error " + fmtNum(g.in_rel_err, 3) + " in, " + fmtNum(g.out_rel_err, 3) + " out";
  if (g.kind === "amplified") return "amplified ×" + fmtNum(g.ratio, 3) + " here: " + io;
  return "carried, not grown: " + io;
}

/* The rows of the cell's details list (dt, dd pairs) after its first
 * divergence and first introduced; none for a cell without them. */
function divergenceDetail(x) {
  const fd = x.first_divergence, k = fd && fd.kernel, g = x.first_divergence_growth, a = x.max_amplification;
  const rows = [];
  if (fd && fd.op) rows.push(h("dt", null, "op"), h("dd", { class: "mono", id: "fd-op" }, fd.op + " in " + fd.module));
  if (k) {
    rows.push(h("dt", null, "kernel"), h("dd", { class: "mono", id: "fd-kernel" }, kernelText(k)));
    if (k.note) rows.push(h("dt", null, "kernel note"), h("dd", { id: "fd-kernel-note" }, k.note));
    if (k.file) rows.push(h("dt", null, "provenance"), h("dd", { id: "fd-provenance" }, provenanceNote(k)));
  }
  if (g) rows.push(h("dt", null, "error growth"), h("dd", { id: "fd-growth", "data-kind": g.kind }, growthText(g)));
  if (a) {
    rows.push(h("dt", null, "largest amplification"), h("dd", { id: "max-amplification", "data-key": a.key },
      h("span", { class: "mono" }, a.key), " (" + (a.op ? a.op + " in " : "") + (a.module || "?") + "): relative error " +
        fmtNum(a.in_rel_err, 3) + " → " + fmtNum(a.out_rel_err, 3) + ", ×" + fmtNum(a.ratio, 3) + ", fed by ",
      h("span", { class: "mono" }, a.input_key)));
  }
  return rows;
}
