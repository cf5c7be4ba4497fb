// web/profile.js - where a slower (or faster) cell's time went: the head
// cell's profiled pair (docs/compare.md, "Which op got slower"), one
// control and one head process with module and operator timers, run after
// the timing processes. The comparison lists the modules and operators
// whose self time moved the way the profiled total did, largest first,
// each with its share of that change. Loaded before app.js, whose helpers
// (h, fmtNs, fmtNum) it calls at run time.
"use strict";

/* One row: a module (path and type), the outside time or an operator. */
function profileRow(kind, name, type, x) {
  return h("tr", { "data-kind": kind },
    h("td", null, kind), h("td", { class: "mono" }, name), h("td", null, type || ""),
    h("td", null, fmtNs(x.control_ns)), h("td", null, fmtNs(x.head_ns)),
    h("td", null, fmtNs(x.delta_ns, true)),
    h("td", null, x.share === null || x.share === undefined ? "–" : fmtNum(100 * x.share, 3) + "%"));
}

/* The cell panel's section, or null when the cell has no profiled pair. */
function profileSection(perf) {
  const p = perf && perf.profile;
  if (!p) return null;
  const rows = [
    ...p.modules.map((m) => profileRow("module", m.path === "" ? "(model)" : m.path, m.type, m)),
    profileRow("outside", "outside the modules", "", p.outside),
    ...p.ops.map((o) => profileRow(p.ops_clock === "device" ? "op (device)" : "op", o.name, "", o)),
  ];
  const left = p.modules_left_out + p.ops_left_out;
  return h("div", { id: "profile" },
    h("h3", null, "Where the time went (profiled pair)"),
    h("p", { class: "muted" }, "per profiled iteration, " + fmtNs(p.control_ns) + " → " + fmtNs(p.head_ns) +
      " (" + fmtNs(p.delta_ns, true) + "); self times, timers on both sides" +
      (left ? "; " + left + " small entries not sent by the runners" : "") +
      (p.ops_unavailable ? "; no operators: " + p.ops_unavailable : "")),
    h("table", { class: "list" },
      h("thead", null, h("tr", null, ["", "name", "type", "control", "head", "change", "share"].map((x) => h("th", null, x)))),
      h("tbody", null, rows)));
}
