// tests/browser/dashboard.test.mjs - the web dashboard in a real browser.
//
// Starts a real capd (CAPD_BIN) on an ephemeral port with its own data dir,
// seeds it with a real control/head comparison run by the fake runner
// (CAPD_HELPER_DIR/fake_runner; the head build sets FAKE_PERTURB_KEY so one
// layer diverges), and drives Debian's Chromium headless through
// playwright-core: the job grid's colours, the comparison's verdict, grid
// and divergence plot, a job submitted during the test appearing without a
// reload (via the event stream), and the token being sent. Screenshots of
// every page go to CAPD_BROWSER_ARTIFACTS (ctest: build/tests/browser-artifacts).
//
// Run by ctest (tests/CMakeLists.txt); needs `npm ci` in tests/browser
// (scripts/test does it) and /usr/bin/chromium (scripts/install-deps.sh).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

let chromium;
try {
  ({ chromium } = await import("playwright-core"));
} catch (e) {
  console.error("playwright-core is not installed: run `npm ci` in tests/browser (scripts/test does)");
  process.exit(1);
}

const CAPD = process.env.CAPD_BIN;
const HELPERS = process.env.CAPD_HELPER_DIR;
const CHROMIUM = process.env.CAPD_CHROMIUM || "/usr/bin/chromium";
const ART = process.env.CAPD_BROWSER_ARTIFACTS;
const PERTURBED = "layer2.0.forward.output.0";
// The op-granularity comparison: fake:ops__3's first op result is moved,
// and the head's provenance scan found two wrappers of its kernel's file.
const OPS_MODEL = "fake:ops__3";
const OPS_PERTURBED = "layer0.0.forward/op.aten::hardswish.0.output.0";
const STALE = ["aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp", "aten/src/ATen/native/cpu/Activation.cpp.AVX2.cpp"];

// The colours web/style.css gives outcomes and comparison statuses.
const RGB = {
  ok: "rgb(46, 125, 50)",
  failed: "rgb(198, 40, 40)",
  crashed: "rgb(106, 27, 26)",
  identical: "rgb(46, 125, 50)",
  diverged: "rgb(198, 40, 40)",
  incomparable: "rgb(158, 158, 158)",
};

const MODELS = ["fake:ok__5", "fake:ok__2", "fake:failed", "fake:segv"];
const WIDTHS = ["avx2", "default"];

let dir, capd, base, browser, artifacts, adminToken;
let ctlJob, headJob, statsJob, opsCtlJob, opsHeadJob, opsPairJob;

function startCapd() {
  return new Promise((resolve, reject) => {
    const p = spawn(CAPD, ["--listen", "127.0.0.1:0", "--data-dir", path.join(dir, "data")], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "", err = "";
    const timer = setTimeout(() => reject(new Error("capd did not start: " + err)), 15000);
    p.stderr.on("data", (d) => { err += d; });
    p.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/capd listening on [\d.]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ proc: p, port: Number(m[1]), log: () => err });
      }
    });
    p.on("exit", (code) => reject(new Error("capd exited " + code + ": " + err)));
  });
}

// capd needs a token by default: the one it wrote at its first start.
function authed(extra) {
  return Object.assign({ Authorization: "Bearer " + adminToken }, extra || {});
}

async function api(method, p, body) {
  const res = await fetch(base + p, {
    method,
    headers: authed(body ? { "Content-Type": "application/json" } : {}),
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch (e) { /* not JSON */ }
  if (!res.ok) throw new Error(method + " " + p + " -> " + res.status + " " + text);
  return json;
}

async function waitJob(id, timeoutMs = 60000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const j = await api("GET", "/v1/jobs/" + id);
    if (j.state === "done" || j.state === "cancelled") return j;
    if (Date.now() > end) throw new Error("job " + id + " did not finish: " + JSON.stringify(j.counts));
    // The long-poll: wakes as soon as the job changes.
    await fetch(base + "/v1/jobs/" + id + "?wait=5", { headers: authed() });
  }
}

async function submit(build, commit, models, extra) {
  const j = await api("POST", "/v1/jobs", Object.assign({
    project: "demo",
    commit,
    branch: "feature/x",
    build,
    matrix: { models, widths: WIDTHS, passes: ["forward"] },
    options: { iterations: 12, warmup: 1, capture: "sample" },
  }, extra || {}));
  return j.id;
}

// A page whose tab already holds the admin token (what the Token dialog
// stores, per tab, in sessionStorage); ANONYMOUS leaves it out.
async function newPage(anonymous) {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  if (!anonymous)
    await ctx.addInitScript((t) => { sessionStorage.setItem("capd.token", t); }, adminToken);
  const page = await ctx.newPage();
  page.on("pageerror", (e) => console.error("page error:", e.message));
  return page;
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(artifacts, name), fullPage: true });
}

// Ready means the route of this hash has rendered: a hash-only goto returns
// before the hashchange event, while the previous page still reads ready.
async function gotoReady(page, hash) {
  await page.goto(base + "/" + hash);
  const want = new URL(base + "/" + hash).hash;
  await page.waitForFunction((w) => document.body.dataset.ready === "1" && document.body.dataset.route === w, want, { timeout: 15000 });
}

before(async () => {
  assert.ok(CAPD && existsSync(CAPD), "CAPD_BIN must name the built capd");
  assert.ok(HELPERS && existsSync(path.join(HELPERS, "fake_runner")), "CAPD_HELPER_DIR must hold fake_runner");
  assert.ok(existsSync(CHROMIUM), CHROMIUM + " is missing (apt-get install chromium)");
  dir = mkdtempSync(path.join(tmpdir(), "capd-browser-"));
  // capd running as root runs cells as run_as_user (nobody), which must be
  // able to reach the data dir's scratch, and to list DIR: it is the
  // builds' model root, which capd checks at registration.
  chmodSync(dir, 0o755);
  artifacts = ART || path.join(dir, "artifacts");
  mkdirSync(artifacts, { recursive: true });
  const c = await startCapd();
  capd = c;
  adminToken = readFileSync(path.join(dir, "data", "admin.token"), "utf8").trim();
  base = "http://127.0.0.1:" + c.port;
  const fake = path.join(HELPERS, "fake_runner");
  await api("POST", "/v1/builds", { name: "ctl", python: fake, env: {}, model_roots: [dir] });
  await api("POST", "/v1/builds", {
    name: "head", python: fake,
    // 1.6x slower too: the comparison grid shows its perf-regression mark.
    env: { FAKE_PERTURB_KEY: PERTURBED, FAKE_TIMING_SCALE: "1.6", PYTHONPATH: path.join(dir, "perturbed-build") },
    model_roots: [dir],
  });
  ctlJob = await submit("ctl", "c0ffee1", MODELS);
  headJob = await submit("head", "abcdef1", MODELS, { control_commit: "c0ffee1" });
  // The same head at the default capture (statistics only): its diverged
  // layer has no element error, only sizes derived from the statistics.
  statsJob = await submit("head", "5a75a75", ["fake:ok__5"],
    { options: { iterations: 12, warmup: 1, capture: "stats" } });
  await api("POST", "/v1/builds", {
    name: "head-ops", python: fake, env: { FAKE_PERTURB_KEY: OPS_PERTURBED }, model_roots: [dir],
  });
  // replay off: the panel's button asks for the replay (the automatic one is
  // test_api_replay's)
  const opsOptions = { options: { iterations: 12, warmup: 1, capture: "sample", granularity: "op", replay: "off" }, project: "ops" };
  opsCtlJob = await submit("ctl", "0b5c0001", [OPS_MODEL], opsOptions);
  const findings = [...STALE, "aten/src/ATen/native/cpu/BinaryOpsKernel.cpp.AVX2.cpp"].map((p) => (
    { kind: "generated_source", path: p, message: "untracked generated dispatch source " + p }));
  opsHeadJob = await submit("head-ops", "0b5e0001", [OPS_MODEL], Object.assign({ provenance: { findings } }, opsOptions));
  // The same head paired with its control: its diverged op can be replayed.
  opsPairJob = await submit("head-ops", "0b5e0002", [OPS_MODEL],
    Object.assign({ control_commit: "0b5c0001" }, opsOptions));
  await waitJob(ctlJob);
  await waitJob(headJob);
  await waitJob(statsJob);
  await waitJob(opsCtlJob);
  await waitJob(opsHeadJob);
  await waitJob(opsPairJob);
  await seedHistory();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
      "--disable-default-apps", "--disable-extensions"],
  });
});

after(async () => {
  if (browser) await browser.close();
  if (capd) {
    const exited = new Promise((r) => capd.proc.once("exit", r));
    capd.proc.kill("SIGTERM");
    await exited;
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test("the job page colours the model × width × pass grid by outcome", async () => {
  const page = await newPage();
  await gotoReady(page, "#/jobs/" + headJob);
  const want = { "fake:ok__5": "ok", "fake:ok__2": "ok", "fake:failed": "failed", "fake:segv": "crashed" };
  for (const m of MODELS) {
    for (const w of WIDTHS) {
      const td = page.locator(`#job-grid td.gcell[data-model="${m}"][data-width="${w}"][data-pass="forward"]`);
      await td.waitFor();
      const cls = await td.getAttribute("class");
      assert.ok(cls.includes("st-" + want[m]), `${m}/${w}: class ${cls}, want st-${want[m]}`);
      const bg = await td.evaluate((e) => getComputedStyle(e).backgroundColor);
      assert.equal(bg, RGB[want[m]], `${m}/${w} is coloured ${bg}`);
    }
  }
  // A cell's details and log.
  await page.locator(`#job-grid td.gcell[data-model="fake:segv"][data-width="avx2"]`).click();
  await page.waitForSelector("#cell-detail pre.log");
  const detail = await page.locator("#cell-detail").innerText();
  assert.match(detail, /crashed/);
  assert.match(detail, /SIGSEGV/);
  await shot(page, "job.png");
  await page.context().close();
});

test("the job page's width self-check names the width that left the scalar path", async () => {
  // A build perturbed at avx2 only: its own default cells are the baseline.
  await api("POST", "/v1/builds", {
    name: "head-width", python: path.join(HELPERS, "fake_runner"),
    env: { FAKE_PERTURB_KEY: PERTURBED, FAKE_PERTURB_WIDTH: "avx2" }, model_roots: [dir],
  });
  const id = await submit("head-width", "a1d7c0de", ["fake:ok__5"],
    { options: { iterations: 0, warmup: 0, capture: "sample" } });
  await waitJob(id);
  const page = await newPage();
  await gotoReady(page, "#/jobs/" + id);
  const row = page.locator(`#width-check-table tr[data-width="avx2"]`);
  await row.waitFor({ timeout: 15000 });
  assert.equal(await row.getAttribute("data-verdict"), "diverged");
  const text = await row.innerText();
  assert.ok(text.includes(PERTURBED) && text.includes("layer layer2"), text);
  assert.equal(await page.locator("#width-check-verdict").getAttribute("data-verdict"), "diverged");
  assert.match(await page.locator("#width-check").innerText(), /judged by the tolerance rule/);
  await shot(page, "job-widths.png");
  await page.context().close();
});

test("the job page's mode self-check names the compiled mode that left eager", async () => {
  // A build whose inductor cells move the model's output: the job's own
  // eager cells are the baseline (fake:ok__5 records layer4 alone compiled).
  await api("POST", "/v1/builds", {
    name: "head-mode", python: path.join(HELPERS, "fake_runner"),
    env: { FAKE_PERTURB_KEY: "layer4.0.forward.output.0", FAKE_PERTURB_MODE: "inductor" }, model_roots: [dir],
  });
  const j = await api("POST", "/v1/jobs", {
    project: "demo", commit: "a1d7c0df", build: "head-mode",
    matrix: { models: ["fake:ok__5"], widths: ["avx2"], passes: ["forward"], modes: ["eager", "aot_eager", "inductor"] },
    options: { iterations: 0, warmup: 0, capture: "sample" },
  });
  await waitJob(j.id);
  const page = await newPage();
  await gotoReady(page, "#/jobs/" + j.id);
  const row = page.locator(`#mode-check-table tr[data-mode="inductor"]`);
  await row.waitFor({ timeout: 15000 });
  assert.equal(await row.getAttribute("data-verdict"), "diverged");
  const text = await row.innerText();
  assert.ok(text.includes("fake:ok__5 forward at avx2") && text.includes("layer layer4"), text);
  assert.equal(await page.locator(`#mode-check-table tr[data-mode="aot_eager"]`).getAttribute("data-verdict"), "pass");
  assert.equal(await page.locator("#mode-check-verdict").getAttribute("data-verdict"), "diverged");
  assert.equal(await page.locator("#width-check").count(), 0, "one width: no width self-check");
  await shot(page, "job-modes.png");
  await page.context().close();
});

test("the comparison page shows the verdict, the status grid and marks the first divergent layer", async () => {
  const page = await newPage();
  await gotoReady(page, "#/diff/abcdef1");
  const verdict = await page.locator("#verdict").getAttribute("data-verdict");
  assert.equal(verdict, "regression");
  // What else differs: the head build's extra PYTHONPATH, and nothing else.
  const envRows = page.locator("#env-diffs tbody tr");
  assert.equal(await envRows.count(), 1);
  assert.equal(await envRows.first().getAttribute("data-field"), "env.PYTHONPATH");
  assert.match(await envRows.first().innerText(), /perturbed-build/);
  const want = { "fake:ok__5": "diverged", "fake:ok__2": "identical", "fake:failed": "incomparable", "fake:segv": "incomparable" };
  for (const m of MODELS) {
    for (const w of WIDTHS) {
      const td = page.locator(`#cmp-grid td.gcell[data-model="${m}"][data-width="${w}"][data-pass="forward"]`);
      const cls = await td.getAttribute("class");
      assert.ok(cls.includes("cs-" + want[m]), `${m}/${w}: class ${cls}, want cs-${want[m]}`);
      const bg = await td.evaluate((e) => getComputedStyle(e).backgroundColor);
      assert.equal(bg, RGB[want[m]], `${m}/${w} is coloured ${bg}`);
    }
  }
  // The first diverged cell is selected; its plot marks the perturbed layer
  // and no other, above every identical layer.
  for (const w of WIDTHS) {
    await page.locator(`#cmp-grid td.gcell[data-model="fake:ok__5"][data-width="${w}"]`).click();
    await page.waitForSelector("#divergence-plot circle.first-divergence");
    await page.waitForSelector("#timing-plot");
    await shot(page, `compare-${w}.png`);
    const marked = await page.locator("#divergence-plot circle.first-divergence").evaluateAll(
      (cs) => cs.map((c) => ({ key: c.dataset.key, cy: Number(c.getAttribute("cy")) })));
    assert.equal(marked.length, 1, "exactly one point is marked");
    assert.equal(marked[0].key, PERTURBED);
    const pts = await page.locator("#divergence-plot circle.pt").evaluateAll(
      (cs) => cs.map((c) => ({ key: c.dataset.key, status: c.dataset.status, cy: Number(c.getAttribute("cy")) })));
    assert.equal(pts.length, 5, "one point per layer");
    assert.deepEqual(pts.map((p) => p.key), [0, 1, 2, 3, 4].map((i) => `layer${i}.0.forward.output.0`),
      "points are in execution order");
    for (const p of pts) {
      if (p.key === PERTURBED) assert.equal(p.status, "diverged");
      else {
        assert.equal(p.status, "identical");
        assert.ok(p.cy > marked[0].cy, `the divergent layer sits above the identical ones (log scale): ${JSON.stringify(pts)}`);
      }
    }
    const label = await page.locator("#divergence-plot text.fd-label").textContent();
    assert.ok(label.includes(PERTURBED), "the marker is labelled with the layer: " + label);
    assert.match(await page.locator("#first-divergence").innerText(), /layer2\.0\.forward\.output\.0/);
    // Control and head timing distributions, every sample drawn: the 12
    // iterations of each timing process (at least the default 5; a paired
    // head cell has more), never a partial process.
    await page.waitForSelector("#timing-plot");
    for (const side of ["ctl", "hd"]) {
      const n = await page.locator(`#timing-plot circle.${side}`).count();
      assert.ok(n >= 12 * 5 && n % 12 === 0, `${side}: ${n} samples drawn`);
    }
  }
  // An identical cell has nothing marked.
  await page.locator(`#cmp-grid td.gcell[data-model="fake:ok__2"][data-width="avx2"]`).click();
  await page.waitForSelector("#divergence-plot");
  assert.equal(await page.locator("#divergence-plot circle.first-divergence").count(), 0);
  // The same comparison by job ids.
  await gotoReady(page, `#/compare?control=${ctlJob}&head=${headJob}`);
  assert.equal(await page.locator("#verdict").getAttribute("data-verdict"), "regression");
  await page.context().close();
});

test("a job submitted while the list is open appears and updates without a reload", async () => {
  const page = await newPage();
  await gotoReady(page, "#/");
  await page.waitForSelector("#live[data-state='on']", { timeout: 15000 });
  assert.equal(await page.locator(`tr[data-job-id="${headJob}"]`).count(), 1);
  await page.evaluate(() => { window.__noReload = 42; });
  const id = await submit("ctl", "fee1dead", ["fake:slow__300"]);
  const row = page.locator(`tr[data-job-id="${id}"]`);
  await row.waitFor({ timeout: 15000 });
  // Live state: the row follows the job to done.
  await page.waitForSelector(`tr[data-job-id="${id}"][data-state="done"]`, { timeout: 30000 });
  assert.equal(await page.evaluate(() => window.__noReload), 42, "the page was not reloaded");
  assert.match(await row.innerText(), /2\/2/);
  // Newest first: the new job is the first row.
  assert.equal(await page.locator("#jobs-body tr").first().getAttribute("data-job-id"), id);
  await shot(page, "jobs.png");
  // And the job page follows a running job cell by cell.
  const id2 = await submit("ctl", "fee1deaf", ["fake:slow__400"]);
  await gotoReady(page, "#/jobs/" + id2);
  await page.waitForSelector(`#job-grid td.gcell.st-ok[data-width="default"]`, { timeout: 30000 });
  assert.equal(await page.evaluate(() => window.__noReload), 42);
  await shot(page, "job-live.png");
  await page.context().close();
});

// Emoji and symbol blocks a stock Chromium may have no font for (the
// perf-regression stopwatch used to render as an empty box).
const FONT_DEPENDENT = /[\u{1F000}-\u{1FAFF}\u{2300}-\u{23FF}\u{2600}-\u{27BF}\u{2B00}-\u{2BFF}\u{FE0F}]/u;
const UNIT = /^[+-]?\d+(\.\d+)? (ns|µs|ms|s)$/;

test("no font-dependent glyphs, human units with sign, the same columns on job and diff pages", async () => {
  const page = await newPage();
  const texts = {};
  await gotoReady(page, "#/");
  texts.jobs = await page.locator("body").innerText();
  await gotoReady(page, "#/jobs/" + headJob);
  const jobCols = await page.locator("#job-grid thead tr:first-child th").allInnerTexts();
  await page.locator(`#job-grid td.gcell[data-model="fake:ok__5"][data-width="avx2"]`).click();
  await page.waitForSelector("#cell-detail pre.log");
  texts.job = await page.locator("body").innerText();
  const duration = await page.evaluate(() => [...document.querySelectorAll("#cell-detail dt")]
    .find((d) => d.textContent === "duration").nextElementSibling.textContent);
  assert.match(duration, UNIT, "a cell's duration in human units: " + duration);
  await gotoReady(page, "#/diff/abcdef1");
  const diffCols = await page.locator("#cmp-grid thead tr:first-child th").allInnerTexts();
  assert.deepEqual(diffCols, jobCols, "the job and diff pages order their columns alike");
  assert.deepEqual(jobCols.map((x) => x.trim()), ["", "default", "avx2"], "in the width table's order");
  // The perf regression mark is an inline SVG, not a character.
  assert.ok(await page.locator("#cmp-grid svg.perf-mark").count() > 0, "the slower head is marked");
  await page.locator(`#cmp-grid td.gcell[data-model="fake:ok__2"][data-width="avx2"]`).click();
  await page.waitForSelector("#timing-plot");
  // The slower head's profiled pair: the module that explains it first.
  const prof = await page.locator("#profile tbody tr").evaluateAll((rs) =>
    rs.map((r) => [r.dataset.kind, r.children[1].textContent, r.children[6].textContent]));
  assert.deepEqual(prof.slice(0, 3).map((r) => r.slice(0, 2)), [["module", "body"], ["module", "(model)"], ["outside", "outside the modules"]],
    "modules by change, then the outside time: " + JSON.stringify(prof));
  assert.equal(prof[0][2], "80%", "body's share of the change");
  texts.diff = await page.locator("body").innerText();
  const shift = texts.diff.match(/Hodges-Lehmann shift (\S+ \S+) \(head/);
  assert.ok(shift && UNIT.test(shift[1]) && shift[1].startsWith("+"), "a signed shift: " + (shift && shift[1]));
  const ticks = await page.locator("#timing-plot text").allTextContents();
  assert.ok(ticks.some((t) => UNIT.test(t)), "timing axis in human units: " + ticks.join("|"));
  await shot(page, "diff-units.png");
  for (const [name, t] of Object.entries(texts)) {
    const bad = t.match(FONT_DEPENDENT);
    assert.equal(bad, null, `${name} page shows a font-dependent glyph U+${bad && bad[0].codePointAt(0).toString(16)}`);
    assert.doesNotMatch(t, /\d{4,} ns\b/, `${name} page prints a raw nanosecond count`);
  }
  // The formatter itself: negative shifts keep their sign and their unit.
  const got = await page.evaluate(() => [fmtNs(-79344), fmtNs(1.5e6), fmtNs(12), fmtNs(-2.5e9), fmtNs(1302, true), fmtMs(250), fmtNs(999960), fmtNs(4.2e12)]);
  assert.deepEqual(got, ["-79.3 µs", "1.50 ms", "12 ns", "-2.50 s", "+1.30 µs", "250 ms", "1.00 ms", "4200 s"]);
  await page.context().close();
});

test("a statistics-only divergence is drawn at its size derived from stats, labelled", async () => {
  const page = await newPage();
  await gotoReady(page, `#/compare?control=${ctlJob}&head=${statsJob}`);
  await page.locator(`#cmp-grid td.gcell[data-model="fake:ok__5"][data-width="avx2"]`).click();
  const pt = page.locator(`#divergence-plot circle[data-key="${PERTURBED}"]`);
  await pt.waitFor();
  assert.equal(await pt.getAttribute("data-derived-from"), "stats");
  const cy = Number(await pt.getAttribute("cy"));
  assert.ok(cy > 15, "drawn at its size, not pinned to the top line (cy " + cy + ")");
  assert.match(await pt.locator("title").textContent(), /max rel >= \S+ \(derived from stats; capture sample for elementwise\)/);
  assert.match(await page.locator("#divergence-plot text.derived-label").textContent(), /derived from stats/);
  assert.match(await page.locator("#first-divergence").innerText(), /max rel >= \S+, l2 rel >= \S+, derived from stats; rerun at capture sample/);
  await shot(page, "compare-stats.png");
  await page.context().close();
});

test("a diverged op shows its kernel, the stale wrappers of its file and where the error grew", async () => {
  const q = `control=${opsCtlJob}&head=${opsHeadJob}`;
  const r = await api("GET", "/v1/compare?" + q);
  const cell = r.cells.find((x) => x.model === OPS_MODEL && x.width === "avx2");
  assert.equal(cell.status, "diverged");
  const fd = cell.first_divergence, k = fd.kernel, amp = cell.max_amplification;
  assert.equal(fd.key, OPS_PERTURBED);
  assert.equal(k.stub, "hardswish_stub");
  assert.deepEqual(k.stale_wrapper_paths, STALE, "only the wrappers of the kernel's own file");
  assert.equal(cell.first_divergence_growth.kind, "introduced", "the op's input was exact");
  assert.ok(amp && amp.ratio > 1, "a later layer amplified the error: " + JSON.stringify(amp));

  const page = await newPage();
  await gotoReady(page, "#/compare?" + q);
  await page.locator(`#cmp-grid td.gcell[data-model="${OPS_MODEL}"][data-width="avx2"]`).click();
  await page.waitForSelector("#fd-kernel");
  assert.equal(await page.locator("#fd-op").innerText(), "aten::hardswish in layer0");
  assert.equal(await page.locator("#fd-kernel").innerText(), "hardswish_stub, " + k.file);
  const prov = page.locator("#fd-provenance");
  assert.match(await prov.innerText(), /^2 stale generated wrappers of this file in the source tree: /);
  assert.deepEqual(await prov.locator("code.stale-path").allInnerTexts(), STALE);
  const growth = page.locator("#fd-growth");
  assert.equal(await growth.getAttribute("data-kind"), "introduced");
  assert.match(await growth.innerText(), /^introduced here: inputs exact, relative error \S+$/);
  const shown = page.locator("#max-amplification");
  assert.equal(await shown.getAttribute("data-key"), amp.key);
  const text = await shown.innerText();
  assert.ok(text.startsWith(amp.key + " (" + amp.op + " in " + amp.module + "): relative error "), text);
  assert.ok(text.endsWith(", fed by " + amp.input_key), text);
  assert.match(text, / → \S+, ×\S+, fed by /);
  await shot(page, "compare-ops.png");
  await page.context().close();

  // The Markdown report says the same.
  const res = await fetch(base + "/v1/compare?" + q + "&format=md", { headers: authed() });
  const md = await res.text();
  assert.ok(md.includes("`aten::hardswish` in `layer0` → hardswish_stub, " + k.file +
    " — 2 stale generated wrappers of this file in the source tree: `" + STALE[0] + "`, `" + STALE[1] + "`"), md);
  assert.ok(md.includes("; error introduced here: inputs exact, relative error "), md);
  assert.ok(md.includes("### Error amplification\n\n- `" + OPS_MODEL + "` / avx2 / forward: largest at `" + amp.key + "`"), md);
});

test("a diverged op is replayed from its cell's panel, which then says what the replay found", async () => {
  const page = await newPage();
  const cellOf = async () => {
    await gotoReady(page, "#/diff/0b5e0002");
    await page.locator(`#cmp-grid td.gcell[data-model="${OPS_MODEL}"][data-width="avx2"]`).click();
  };
  await cellOf();
  const ask = page.locator("#replay-ask");
  await ask.waitFor();
  await ask.click();
  await page.locator("#replay p[data-state='pending'], #replay-conclusion").first().waitFor();
  // Asked again through the API: the same two replay jobs, which we wait for.
  const j = await api("GET", "/v1/jobs/" + opsPairJob);
  const cell = j.cells.find((c) => c.width === "avx2");
  const replay = "/v1/jobs/" + opsPairJob + "/cells/" + cell.id + "/replay";
  const r = await api("POST", replay, {});
  await waitJob(r.control.job);
  await waitJob(r.head.job);
  await cellOf();
  // the panel looks again while the op runs alone on the control's inputs
  const done = page.locator("#replay-conclusion");
  await done.waitFor({ timeout: 120000 });
  assert.equal(await done.getAttribute("data-conclusion"), "kernel_changed");
  assert.match(await done.innerText(), /^kernel_changed at ([a-z0-9_]+, )*avx2\b/);
  const alone = page.locator('#replay-widths tr[data-width="avx2"] td.isolated');
  assert.notEqual(await alone.innerText(), "—", "the op alone ran at avx2");
  assert.equal(await page.locator("#repro-link").getAttribute("data-url"),
    "/v1/jobs/" + opsPairJob + "/cells/" + cell.id + "/repro");
  await shot(page, "compare-replay.png");
  await page.context().close();
});

// ---- history, alerts, bisection ----
//
// A branch of HN commits on a template build (DIR/hist/<commit>/python, a
// link to the fake runner, with FAKE_ENV_FILE=DIR/hist/<commit>/env): from
// commit HK on one layer is perturbed, from HM on the timings are 1.5x.
// The bisection's commit list also holds HS, which has no build directory
// (its build does not start) and is not on the branch.
const HN = 16, HK = 5, HM = 9;
const hsha = (i) => "d0c5" + i.toString(16).padStart(4, "0") + "f".repeat(32);
const HS = "d0c5dead" + "f".repeat(32);
const BISECT_COMMITS = () => { const c = []; for (let i = 0; i < HN; i++) { c.push(hsha(i)); if (i === 3) c.push(HS); } return c; };
const SERIES = "#/history?project=hist&branch=main&model=fake%3Aok&width=default&pass=forward";

// Called by the first before(): node:test runs root hooks concurrently.
async function seedHistory() {
  const fake = path.join(HELPERS, "fake_runner");
  for (let i = 0; i < HN; i++) {
    const d = path.join(dir, "hist", hsha(i));
    mkdirSync(d, { recursive: true });
    symlinkSync(fake, path.join(d, "python"));
    writeFileSync(path.join(d, "env"), (i >= HK ? "FAKE_PERTURB_KEY=" + PERTURBED + "\n" : "") + (i >= HM ? "FAKE_TIMING_SCALE=1.5\n" : ""));
  }
  chmodSync(path.join(dir, "hist"), 0o755);
  await api("POST", "/v1/builds", {
    name: "hist", python: path.join(dir, "hist", "{commit}", "python"),
    env: { FAKE_ENV_FILE: path.join(dir, "hist", "{commit}", "env") }, model_roots: [dir],
  });
  const ids = [];
  for (let i = 0; i < HN; i++) {
    const t = new Date(Date.UTC(2024, 0, 1, 0, i)).toISOString().replace(".000", "");
    ids.push((await api("POST", "/v1/jobs", {
      project: "hist", commit: hsha(i), branch: "main", build: "hist", commit_time: t,
      parents: i ? [hsha(i - 1)] : [],
      matrix: { models: ["fake:ok"], widths: ["default"], passes: ["forward"] }, options: { iterations: 7 },
    })).id);
  }
  for (const id of ids) await waitJob(id, 120000);
}

test("the history page plots a cell along the branch with its change point and numerics event", async () => {
  const page = await newPage();
  await gotoReady(page, SERIES);
  const sec = page.locator("section.series[data-model='fake:ok']");
  assert.equal(await sec.getAttribute("data-status"), "ok");
  const perf = sec.locator("svg[data-kind='perf']");
  const commits = await perf.locator("circle.hpt").evaluateAll((cs) => cs.map((c) => c.dataset.commit));
  assert.deepEqual(commits, Array.from({ length: HN }, (_, i) => hsha(i)), "one point per commit, in commit order");
  // Every point is higher from HM on: the plot's y grows downwards.
  const ys = await perf.locator("circle.hpt").evaluateAll((cs) => cs.map((c) => Number(c.getAttribute("cy"))));
  assert.ok(Math.max(...ys.slice(HM)) < Math.min(...ys.slice(0, HM)), "the slower commits sit above: " + ys.join(","));
  const cps = await perf.locator("line.cp-marker").evaluateAll((ls) => ls.map((l) => ({ c: l.dataset.commit, label: l.dataset.label })));
  assert.deepEqual(cps, [{ c: hsha(HM), label: "regression" }], "one perf change point, at HM");
  assert.equal(await perf.locator("rect.seg-band").count(), 2, "the levels before and after, with their spread");
  const ev = await sec.locator("svg[data-kind='numerics'] path.ev-marker").evaluateAll((ps) => ps.map((p) => ({ c: p.dataset.commit, k: p.dataset.kind })));
  assert.deepEqual(ev, [{ c: hsha(HK), k: "numerics" }], "one numerics event, at HK");
  const diverged = await sec.locator("svg[data-kind='numerics'] rect.num-diverged").evaluateAll((rs) => rs.map((r) => r.dataset.commit));
  assert.deepEqual(diverged, [hsha(HK)]);
  assert.match(await sec.locator("svg[data-kind='numerics'] text.ev-label").textContent(), new RegExp(PERTURBED.replace(/\./g, "\\.")));
  assert.equal(await sec.locator("svg[data-kind='memory'] circle.hpt").count(), HN);
  assert.ok(await sec.locator(`table.hist-alerts tr[data-kind='perf'] a`).first().textContent() === hsha(HM).slice(0, 10));
  await shot(page, "history.png");
  // A point links to its commit's diff.
  await perf.locator(`circle.hpt[data-commit="${hsha(HM)}"]`).click();
  await page.waitForFunction(() => location.hash.startsWith("#/diff/"));
  assert.equal(await page.evaluate(() => location.hash), "#/diff/" + hsha(HM));
  // The branch alone: a plot per cell of its newest job.
  await gotoReady(page, "#/history?project=hist&branch=main");
  assert.equal(await page.locator("section.series").count(), 1);
  await page.locator("section.series[data-status='ok'] svg[data-kind='perf'] line.cp-marker").waitFor({ state: "attached" });
  // Nothing named: the form, and no request for a series.
  await gotoReady(page, "#/history");
  assert.equal(await page.locator("#history-form").count(), 1);
  assert.equal(await page.locator("section.series").count(), 0);
  await page.context().close();
});

test("the alerts page lists the open alerts with links, and an admin marks one", async () => {
  const page = await newPage();
  await gotoReady(page, "#/alerts?project=hist");
  const rows = page.locator("#alerts-body tr");
  const got = await rows.evaluateAll((trs) => trs.map((tr) => ({ kind: tr.dataset.kind, bad: tr.querySelector("a.diff-link").title })));
  const named = got.filter((a) => a.kind !== "memory").sort((a, b) => (a.kind < b.kind ? -1 : 1));
  // The fake runner's peak RSS is not steered: memory alerts are left out.
  assert.deepEqual(named, [{ kind: "numerics", bad: hsha(HK) }, { kind: "perf", bad: hsha(HM) }], JSON.stringify(got));
  const num = page.locator("#alerts-body tr[data-kind='numerics']");
  assert.equal(await num.locator("a.diff-link").getAttribute("href"), "#/diff/" + hsha(HK));
  const series = await num.locator("a.series-link").getAttribute("href");
  assert.equal(series, "#/history?project=hist&branch=main&model=fake%3Aok&width=default&pass=forward");
  assert.match(await num.innerText(), /first divergent layer2\.0\.forward\.output\.0/);
  assert.match(await page.locator("#alerts-body tr[data-kind='perf']").innerText(), /regression[\s\S]*\+\d+\.\d%/);
  await shot(page, "alerts.png");
  // Marking: the row says so, and capd has it.
  await num.locator("button[data-action='false_positive']").click();
  await page.waitForSelector("#alerts-body tr[data-kind='numerics'][data-status='false_positive']");
  const id = await num.getAttribute("data-alert-id");
  const all = await api("GET", "/v1/alerts?project=hist&status=all");
  assert.equal(all.alerts.find((a) => a.id === id).status, "false_positive");
  // No longer open; listed under its status.
  await gotoReady(page, "#/alerts?project=hist&status=open");
  assert.equal(await page.locator(`#alerts-body tr[data-alert-id="${id}"]`).count(), 0);
  await gotoReady(page, "#/alerts?project=hist&status=false_positive");
  assert.equal(await page.locator(`#alerts-body tr[data-alert-id="${id}"][data-status="false_positive"]`).count(), 1);
  // And from the history page's link, its series.
  await gotoReady(page, "#/alerts?project=hist");
  await page.locator("#alerts-body tr[data-kind='perf'] a.series-link").click();
  await page.waitForSelector("section.series[data-status='ok'] svg[data-kind='perf']");
  await page.context().close();
  // A read token sees the alerts but no buttons.
  const ro = (await api("POST", "/v1/tokens", { scope: "read", name: "dashboard-ro" })).token;
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  await ctx.addInitScript((t) => { sessionStorage.setItem("capd.token", t); }, ro);
  const rpage = await ctx.newPage();
  await gotoReady(rpage, "#/alerts?project=hist");
  assert.ok(await rpage.locator("#alerts-body tr[data-kind='perf']").count() === 1);
  assert.equal(await rpage.locator("#alerts-body button").count(), 0, "no feedback buttons without admin scope");
  await shot(rpage, "alerts-read.png");
  await ctx.close();
});

test("the bisection page follows a bisection live to its first bad commit, skipping a missing build", async () => {
  const page = await newPage();
  await gotoReady(page, "#/bisect");
  const commits = BISECT_COMMITS();
  // Another project: no job of the branch is reused, so every probe runs.
  // Cells of 2 s: the ends alone outlast the page's first load by far, so
  // the page sees events after it loaded however slow the host is.
  const b = await api("POST", "/v1/bisect", {
    project: "hist-bisect", build: "hist", good: hsha(0), bad: hsha(HN - 1), commits,
    matrix: { models: ["fake:slow__2000"], widths: ["default"], passes: ["forward"] },
    options: { iterations: 0 }, predicate: "numerics",
  });
  // The list hears of it.
  await page.waitForSelector(`tr[data-bisect-id="${b.id}"]`, { timeout: 15000 });
  await page.locator(`tr[data-bisect-id="${b.id}"] a`).click();
  await page.waitForSelector("#bisect-state");
  await page.evaluate(() => { window.__noReload = 7; });
  await page.waitForSelector("#bisect-state[data-state='done']", { timeout: 90000 });
  assert.equal(await page.evaluate(() => window.__noReload), 7, "followed without a reload");
  assert.ok(Number(await page.locator("#bisect").getAttribute("data-loads")) > 1, "updated from the events");
  assert.equal(await page.locator("#first-bad").getAttribute("data-commit"), hsha(HK));
  const final = await api("GET", "/v1/bisect/" + b.id);
  assert.ok(final.round <= Math.ceil(Math.log2(commits.length)) + 1, "rounds: " + final.round);
  // Every probe, by round; the commit without a build is skipped, saying why.
  const probes = await page.locator("#probes tbody tr").evaluateAll((trs) => trs.map((tr) => ({
    i: Number(tr.dataset.index), round: Number(tr.dataset.round), state: tr.dataset.state, why: tr.querySelector("td.why").textContent })));
  assert.equal(probes.length, final.probes.length);
  assert.deepEqual(probes.map((p) => p.round), probes.map((p) => p.round).slice().sort((x, y) => x - y), "ordered by round");
  const skipped = probes.find((p) => p.i === commits.indexOf(HS));
  assert.ok(skipped, "the commit without a build was probed: " + JSON.stringify(probes));
  assert.equal(skipped.state, "skipped");
  assert.match(skipped.why, /did not start/);
  assert.equal(probes.find((p) => p.i === commits.indexOf(hsha(HK))).state, "bad");
  assert.equal(await page.locator("#bisect-strip rect.first-bad").count(), 1);
  assert.equal(await page.locator("#bisect-strip rect.probe-skipped").count(), 1);
  await shot(page, "bisect.png");
  await gotoReady(page, "#/bisect");
  assert.equal(await page.locator(`tr[data-bisect-id="${b.id}"][data-state="done"]`).count(), 1);
  await shot(page, "bisect-list.png");
  await page.context().close();
});

test("a screenshot of every page is kept", () => {
  for (const f of ["jobs.png", "job.png", "job-live.png", "job-widths.png", "compare-avx2.png", "compare-default.png", "diff-units.png", "compare-stats.png", "compare-ops.png",
    "history.png", "alerts.png", "alerts-read.png", "bisect.png", "bisect-list.png"])
    assert.ok(existsSync(path.join(artifacts, f)), f + " is in " + artifacts);
});

test("a token entered in the dialog is sent as a bearer token", async () => {
  const page = await newPage(true);
  // Without a token the page's API calls are 401: it offers the dialog.
  await page.goto(base + "/#/");
  await page.waitForSelector("#token-button", { timeout: 15000 });
  await page.click("#token-button");
  await page.fill("#token-input", "capd_testtoken");
  const seen = page.waitForRequest((r) => r.url().includes("/v1/jobs") &&
    r.headers().authorization === "Bearer capd_testtoken", { timeout: 10000 });
  await page.click("#token-save");
  await seen;
  assert.equal(await page.evaluate(() => sessionStorage.getItem("capd.token")), "capd_testtoken");
  assert.equal(await page.evaluate(() => localStorage.getItem("capd.token")), null,
    "the token stays in this tab (sessionStorage), not in localStorage");
  await page.context().close();
});
