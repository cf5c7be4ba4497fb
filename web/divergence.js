// web/divergence.js - what the comparison page says about a diverged
// cell beyond its first divergent key: the op and its CPU kernel, the
// provenance note (stale generated wrappers of the kernel's file in the
// head's source tree), how the first divergence's error grew, and where
// the cell's error grew most (docs/compare.md, "Kernel attribution" and
// "Error amplification"), the op one side ran alone before it ("Ops one
// side has and the other lacks"), and the op's replay with its reproducer
// (docs/api.md, "Replay and repro"). Loaded before app.js, whose helpers
// (h, fmtNum, api, clear) it calls at run time.
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

/* An op one side ran alone before the first divergence (docs/compare.md,
 * "Ops one side has and the other lacks"). */
function opOrigin(o) {
  if (!o) return null;
  const side = o.kind === "inserted" ? "inserted in the head" : "removed from the head";
  const link = o.link === "same_value" ? "; the first divergence holds its result" : "; in the same module call";
  return [h("dt", null, "op origin"),
    h("dd", { class: "mono", id: "op-origin", "data-kind": o.kind },
      o.op + " " + side + " in " + o.module + " (call " + o.call + ", " + o.phase + ")" + link)];
}

/* The replay of the cell's unit (the op where the error came in, else at
 * granularity module the module call of a forward divergence): what it
 * found and its reproducer, a button that asks for it, or nothing when
 * there is no unit. */
function replayPanel(r, x) {
  const box = h("div", { id: "replay" });
  const rows = [x.first_introduced, x.first_divergence].filter(Boolean);
  const unit = rows.some((d) => d.op) ? "op" : rows.some((d) => d.phase === "forward") ? "layer" : null;
  if (!unit || !r.head || !r.head.job) return box;
  fillReplay(box, r.head.job, x, unit);
  return box;
}

/* Each width's verdict: the model run on both builds, and the unit (op or
 * module) alone on the control's recorded inputs under each build
 * (docs/api.md, "Replay and repro"). */
function replayWidths(rep) {
  const refused = rep.isolated && rep.isolated.refused;
  const iso = (w, k) => (w.isolated && w.isolated[k]) || "—";
  const rows = (rep.per_width || []).map((w) => h("tr", { "data-width": w.width },
    h("td", null, w.width), h("td", null, w.verdict),
    h("td", { class: "isolated" }, iso(w, "verdict")),
    h("td", { class: "vs-control" }, iso(w, "control")), h("td", { class: "vs-head" }, iso(w, "head"))));
  return [h("table", { id: "replay-widths", class: "small" },
    h("thead", null, h("tr", null, h("th", null, "width"), h("th", null, "model run"),
      h("th", null, (rep.unit || "op") + " alone on the control's inputs"),
      h("th", null, "control build vs the control's output"), h("th", null, "head build vs it"))),
    h("tbody", null, rows)),
  refused ? h("p", { class: "muted", id: "replay-isolated-refused" }, "no isolated replay: " + refused) : ""];
}

async function fillReplay(box, job, x, unit) {
  try {
    const j = await api("/v1/jobs/" + encodeURIComponent(job));
    const cell = (j.cells || []).find((c) => c.model === x.model && c.width === x.width && c.pass === x.pass &&
      (c.mode || "eager") === (x.mode || "eager"));
    if (!cell) return;
    const base = "/v1/jobs/" + encodeURIComponent(job) + "/cells/" + encodeURIComponent(cell.id);
    let rep = null;
    try {
      rep = await api(base + "/replay");
    } catch (e) {
      const code = e.code;
      if (code === "pending") {
        // the replay jobs, then the unit alone on the control's inputs: look again
        setTimeout(() => { if (box.isConnected) fillReplay(box, job, x, unit); }, 2000);
        return clear(box).append(h("p", { class: "muted", "data-state": "pending" }, "replay running…"));
      }
      if (code !== "no_replay") throw e;
      const ask = h("button", { type: "button", id: "replay-ask" }, "Replay this " + unit + " on both builds");
      ask.addEventListener("click", async () => {
        try {
          await api(base + "/replay", { method: "POST", body: {} });
          fillReplay(box, job, x, unit);
        } catch (e) {
          box.append(h("p", { class: "muted", id: "replay-error" }, "replay refused: " + e.message));
        }
      });
      return clear(box).append(h("h3", null, "Replay"), ask);
    }
    const where = rep.conclusion === "kernel_changed" ? " at " + rep.widths.join(", ")
      : rep.conclusion === "inherited" && rep.upstream ? " from " + rep.upstream.key : rep.why ? ": " + rep.why : "";
    const dl = h("a", { href: "#", id: "repro-link", "data-url": base + "/repro" }, "reproducer (repro.tar)");
    dl.addEventListener("click", async (ev) => {
      ev.preventDefault();
      const res = await fetch(base + "/repro", { headers: authHeaders() });
      const a = h("a", { href: URL.createObjectURL(await res.blob()), download: "repro.tar" });
      a.click();
    });
    clear(box).append(h("h3", null, "Replay of " + rep.op),
      h("p", { id: "replay-conclusion", "data-conclusion": rep.conclusion }, rep.conclusion + where),
      ...replayWidths(rep), dl);
  } catch (e) {
    clear(box).append(h("p", { class: "muted" }, "replay unavailable: " + e.message));
  }
}
