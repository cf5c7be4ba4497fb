// web/bisect.js - the bisection pages: #/bisect lists them (GET /v1/bisect)
// and #/bisect/<id> shows one (GET /v1/bisect/{id}): its commits as a strip
// coloured by what each probe found, the probes by round (commit, state,
// verdict, why a commit was skipped) and the result. Both follow the SSE
// "bisect" events: an event of the bisection shown reloads it (coalesced),
// so the page follows a running bisection to its end without a reload.
// Loaded before app.js, whose helpers it calls at run time.
"use strict";

function bisectBadge(state) {
  return h("span", { class: "badge bs-" + state, "data-state": state }, state);
}

async function pageBisectList() {
  const m = clear(main());
  m.append(h("h1", null, "Bisections"));
  const holder = h("div", { id: "bisect-list" });
  m.append(holder);
  const load = async () => {
    let data;
    try {
      data = await api("/v1/bisect");
    } catch (e) {
      clear(holder).append(errorPanel(e));
      return;
    }
    const list = data.bisections || [];
    clear(holder).append(list.length ? h("table", { class: "list" },
      h("thead", null, h("tr", null, ["id", "project", "build", "predicate", "state", "round", "commits", "good → bad", "created"].map((x) => h("th", null, x)))),
      h("tbody", null, list.map((b) => h("tr", { "data-bisect-id": b.id, "data-state": b.state },
        h("td", null, h("a", { href: "#/bisect/" + encodeURIComponent(b.id), class: "mono" }, b.id)),
        h("td", null, b.project), h("td", null, b.build), h("td", null, b.predicate),
        h("td", null, bisectBadge(b.state)), h("td", null, String(b.round)), h("td", null, String(b.commit_count)),
        h("td", { class: "mono" }, short(b.good) + " → " + short(b.bad)),
        h("td", { title: b.created_at || "" }, ago(b.created_at))))))
      : h("p", { class: "muted" }, "No bisections yet."));
  };
  await load();
  return live.on(coalesced((type) => type === "bisect", load));
}

/* A handler that runs LOAD once for any burst of events WANT accepts, and
 * again after it if more came while it ran. */
function coalesced(want, load) {
  let busy = false, again = false;
  const run = async () => {
    busy = true;
    do {
      again = false;
      await new Promise((r) => setTimeout(r, 150));
      await load();
    } while (again);
    busy = false;
  };
  return (type, ev) => {
    if (!want(type, ev)) return;
    if (busy) again = true;
    else run();
  };
}

async function pageBisect(id) {
  const m = clear(main());
  const holder = h("div", { id: "bisect" }, h("p", { class: "muted" }, "loading…"));
  m.append(holder);
  let loads = 0;
  const load = async () => {
    try {
      const b = await api("/v1/bisect/" + encodeURIComponent(id));
      renderBisect(clear(holder), b);
      holder.dataset.loads = String(++loads);
    } catch (e) {
      clear(holder).append(errorPanel(e));
    }
  };
  await load();
  return live.on(coalesced((type, ev) => type === "bisect" && ev.bisect && ev.bisect.id === id, load));
}

function renderBisect(el, b) {
  const th = b.predicate === "perf" ? " (threshold " + fmtNum(b.threshold, 3) + ")" : "";
  el.append(h("h1", null, "Bisection ", h("span", { class: "mono" }, b.id), " ", h("span", { id: "bisect-state", "data-state": b.state }, bisectBadge(b.state))),
    h("div", { class: "panel" }, h("dl", { class: "kv" },
      h("dt", null, "project"), h("dd", null, b.project),
      h("dt", null, "build"), h("dd", null, b.build),
      h("dt", null, "branch"), h("dd", null, b.branch || "–"),
      h("dt", null, "predicate"), h("dd", null, b.predicate + th),
      h("dt", null, "good"), h("dd", { class: "mono" }, b.good),
      h("dt", null, "bad"), h("dd", { class: "mono" }, b.bad),
      h("dt", null, "commits"), h("dd", null, String(b.commit_count)),
      h("dt", null, "round"), h("dd", { id: "bisect-round" }, String(b.round)),
      b.reason ? [h("dt", null, "reason"), h("dd", { id: "bisect-reason" }, b.reason)] : null)));
  if (b.result) el.append(bisectResult(b.result));
  el.append(h("h2", null, "Commits"), commitStrip(b), h("h2", null, "Probes by round"), probeTable(b));
}

function bisectResult(r) {
  const ev = r.evidence;
  const evLink = ev && ev.control && ev.head && ev.control.job && ev.head.job
    ? h("a", { href: "#/compare?" + new URLSearchParams({ control: ev.control.job, head: ev.head.job }).toString(), id: "evidence-link" }, "the comparison") : null;
  return h("div", { class: "panel", id: "bisect-result" },
    h("h2", null, "Result"),
    h("dl", { class: "kv" },
      h("dt", null, "first bad"), h("dd", { class: "mono", id: "first-bad", "data-commit": r.first_bad }, r.first_bad),
      h("dt", null, "last good"), h("dd", { class: "mono" }, r.last_good),
      h("dt", null, "exact"), h("dd", null, r.exact ? "yes" : "no: skipped commits leave " + (r.candidates || []).length + " candidates"),
      !r.exact && r.candidates ? [h("dt", null, "candidates"), h("dd", { class: "mono" }, r.candidates.map(short).join(", "))] : null,
      h("dt", null, "rounds"), h("dd", null, String(r.rounds)),
      h("dt", null, "evidence"), h("dd", null, ev ? [h("span", { class: "badge " + (ev.verdict === "regression" ? "regression" : "pass") }, ev.verdict || "–"), " ", evLink] : "–")));
}

/* Every commit from good to bad, one square each, coloured by its probe
 * (untested commits light grey), the first bad one outlined. */
function commitStrip(b) {
  const commits = b.commits || [], n = commits.length;
  const byIdx = new Map((b.probes || []).map((p) => [p.index, p]));
  const W = 760, L = 10, R = 10, H = 40;
  const svg = s("svg", { class: "plot", id: "bisect-strip", width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" });
  const step = n ? (W - L - R) / n : 0, w = Math.max(1, step - (step > 4 ? 2 : 0));
  const firstBad = b.result ? b.result.first_bad : null;
  commits.forEach((c, i) => {
    const p = byIdx.get(i);
    svg.append(s("rect", { class: "probe-" + (p ? p.state : "untested") + (c === firstBad ? " first-bad" : ""), x: (L + i * step).toFixed(1), y: 8, width: w.toFixed(1), height: 22, "data-index": i },
      s("title", null, i + ": " + c + (p ? "\n" + p.state + " (round " + p.round + ")" + (p.skipped_reason ? "\n" + p.skipped_reason : "") : "\nnot probed"))));
  });
  return svg;
}

function verdictText(v) {
  if (!v) return "–";
  const cells = (v.cells || []).map((c) => c.status + (c.perf_verdict ? ", perf " + c.perf_verdict + (typeof c.perf_ratio === "number" ? " ×" + fmtNum(c.perf_ratio, 3) : "") : ""));
  return (v.judged || "") + (v.verdict ? " (" + v.verdict + (cells.length ? ": " + cells.join("; ") : "") + ")" : "");
}

function probeTable(b) {
  const probes = (b.probes || []).slice().sort((x, y) => x.round - y.round || x.index - y.index);
  if (!probes.length) return h("p", { class: "muted" }, "No probes yet.");
  return h("table", { class: "list", id: "probes" },
    h("thead", null, h("tr", null, ["round", "index", "commit", "state", "job", "verdict", "why"].map((x) => h("th", null, x)))),
    h("tbody", null, probes.map((p) => h("tr", { "data-index": p.index, "data-round": p.round, "data-state": p.state },
      h("td", null, String(p.round)), h("td", null, String(p.index)),
      h("td", { class: "mono", title: p.commit }, short(p.commit)),
      h("td", null, h("span", { class: "badge probe-" + p.state }, p.state)),
      h("td", null, p.job ? [h("a", { href: "#/jobs/" + encodeURIComponent(p.job), class: "mono" }, p.job), p.reused ? h("span", { class: "muted" }, " reused") : null] : "–"),
      h("td", { class: "verdict" }, verdictText(p.verdict)),
      h("td", { class: "why" }, p.skipped_reason || p.reason || "")))));
}
