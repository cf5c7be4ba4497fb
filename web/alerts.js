// web/alerts.js - the alerts page, #/alerts?project=&branch=&kind=&status=:
// the alerts along branches (GET /v1/alerts; open ones unless the query
// names a status), each with a link to its series and its commit's diff,
// and, for an admin token, the feedback buttons (POST /v1/alerts/{id}).
// Alerts that open while the page is shown (SSE "alert") appear at the
// top. Loaded before app.js, whose helpers it calls at run time.
"use strict";

const ALERT_MARKS = [["acknowledged", "Acknowledge"], ["false_positive", "False positive"], ["expected", "Expected"]];

/* Whether this tab's token may mark alerts: admin scope, which GET
 * /v1/tokens needs too. Asked without api() so a refusal shows no banner. */
async function isAdmin() {
  try {
    const res = await fetch("/v1/tokens", { headers: authHeaders() });
    return res.ok;
  } catch (e) {
    return false;
  }
}

function alertsForm(q) {
  const project = h("input", { name: "project", placeholder: "project", value: q.project || "" });
  const branch = h("input", { name: "branch", placeholder: "branch", value: q.branch || "" });
  const kind = h("select", { name: "kind" }, ["", "perf", "memory", "numerics", "outcome"].map((k) =>
    h("option", { value: k, selected: (q.kind || "") === k }, k || "any kind")));
  const status = h("select", { name: "status" }, ["open", "acknowledged", "false_positive", "expected", "all"].map((k) =>
    h("option", { value: k, selected: (q.status || "open") === k }, k.replace("_", " "))));
  const form = h("form", { class: "filters", id: "alerts-form" }, project, branch, kind, status, h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const e of [project, branch, kind, status]) if (e.value.trim() && !(e === status && e.value === "open")) p.set(e.name, e.value.trim());
    location.hash = "#/alerts" + (p.toString() ? "?" + p.toString() : "");
  });
  return form;
}

async function pageAlerts(query) {
  const q = parseQuery(query);
  const m = clear(main());
  m.append(h("h1", null, "Alerts"), alertsForm(q));
  const params = new URLSearchParams({ limit: "200" });
  for (const k of ["project", "branch", "kind", "status"]) if (q[k]) params.set(k, q[k]);
  let data, admin;
  try {
    [data, admin] = await Promise.all([api("/v1/alerts?" + params.toString()), isAdmin()]);
  } catch (e) {
    m.append(errorPanel(e));
    return null;
  }
  const tbody = h("tbody", { id: "alerts-body" });
  const table = h("table", { class: "list", id: "alerts" },
    h("thead", null, h("tr", null, ["kind", "label", "series", "first bad", "last good", "change", "opened", "status", admin ? "feedback" : null]
      .filter((x) => x !== null).map((x) => h("th", null, x)))), tbody);
  const empty = h("p", { class: "muted", id: "alerts-empty" }, "No alerts.");
  m.append(h("p", { class: "muted" }, admin ? "This token may mark alerts; the share of real changes among marked ones is capd_alert_precision in /metrics."
    : "Marking alerts needs an admin token."));
  append(m, [data.alerts.length ? null : empty, table]);
  const shown = new Set();
  for (const a of data.alerts) {
    tbody.append(alertRow(a, admin));
    shown.add(a.id);
  }
  const matches = (a) => (q.status || "open") !== "open" ? false :
    ["project", "branch", "kind"].every((k) => !q[k] || a[k] === q[k]);
  return live.on((type, ev) => {
    if (type !== "alert" || !ev.alert || shown.has(ev.alert.id) || !matches(ev.alert)) return;
    shown.add(ev.alert.id);
    const tr = alertRow(ev.alert, admin);
    tr.classList.add("flash");
    tbody.prepend(tr);
    empty.remove();
  });
}

function alertRow(a, admin) {
  const statusTd = h("td", { class: "alert-status" }, a.status.replace("_", " "));
  const tr = h("tr", { "data-alert-id": a.id, "data-status": a.status, "data-kind": a.kind },
    h("td", null, a.kind),
    h("td", null, h("span", { class: "badge lbl-" + a.label }, a.label)),
    h("td", null, h("a", { href: historyLink(a), class: "series-link" }, a.project + " / " + a.branch + ": " + a.model + " · " + a.width + " · " + a.pass)),
    h("td", null, h("a", { href: "#/diff/" + encodeURIComponent(a.first_bad), class: "mono diff-link", title: a.first_bad }, short(a.first_bad))),
    h("td", { class: "mono", title: a.last_good || "" }, short(a.last_good) || "–"),
    h("td", null, alertSummary(a)),
    h("td", { title: a.created_at || "" }, ago(a.created_at)),
    statusTd);
  if (admin) tr.append(h("td", { class: "alert-actions" }, ALERT_MARKS.map(([st, label]) =>
    h("button", { type: "button", "data-action": st, disabled: a.status === st, onclick: () => markAlert(a, st, tr, statusTd) }, label))));
  return tr;
}

async function markAlert(a, status, tr, statusTd) {
  for (const b of tr.querySelectorAll("button")) b.disabled = true;
  try {
    const r = await api("/v1/alerts/" + encodeURIComponent(a.id), { method: "POST", body: { status } });
    a.status = r.status;
    tr.dataset.status = r.status;
    statusTd.textContent = r.status.replace("_", " ");
    banner(null);
  } catch (e) {
    banner("Could not mark alert " + a.id + ": " + e.message, true);
  }
  for (const b of tr.querySelectorAll("button")) b.disabled = b.dataset.action === a.status;
}
