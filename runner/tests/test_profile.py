"""The profiled pair (docs/runner.md, "The profiled pair"): after the timing
pairs of a paired head cell, one profiled process of each build, per-module
and per-operator times, where the pairs say regression (profile auto),
always, or never (off)."""

import json
import os
import subprocess
import sys
import unittest

from tests import util
from tests.framereader import RUNNER_DIR
from capd_runner import profile

# A root with a cheap submodule and one, nap, that busy-waits NAP_MS (the
# side's environment) milliseconds of its thread's CPU time: a wait on the
# wall clock would end on time however long the host held the thread off
# its CPU, and its own time (wall less that delay) would fall short by as
# much. NAP_FAIL_PROFILED makes nap raise under the profiled process's
# module hooks (a timing process has none).
MODEL = {"napmodels/__init__.py": "", "napmodels/m.py": '''
import os, time, torch

class Nap(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ns = int(float(os.environ.get("NAP_MS", "1")) * 1e6)

    def forward(self, x):
        if os.environ.get("NAP_FAIL_PROFILED") and self._forward_hooks:
            raise RuntimeError("this build cannot be profiled")
        end = time.thread_time_ns() + self.ns
        while time.thread_time_ns() < end:
            pass
        return x * 2

class Root(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cheap = torch.nn.Linear(4, 4)
        self.nap = Nap()

    def forward(self, x):
        return self.nap(self.cheap(x))

def make(seed, batch, dtype):
    return Root(), torch.ones(batch, 4, dtype=dtype)
'''}
ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": RUNNER_DIR, "LANG": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1"}


def _spec(root, ref_env=None, pass_="forward", **options):
    """A cell of the nap model on this host's last CPU; paired with a
    control build of REF_ENV (this interpreter, the same model) unless
    None."""
    opts = dict(iterations=3, warmup=1, timing_pairs=2, max_timing_rounds=1)
    opts.update(options)
    spec = util.make_spec("napmodels.m:make", pass_=pass_, model_roots=[root], **opts)
    if ref_env is not None:
        spec["reference"] = {"build": "control", "job": "jcontrol", "commit": "abcdef0",
                             "python": sys.executable, "model_roots": [root],
                             "env": dict(ENV, HOME=root, **ref_env)}
    spec["cpus"] = sorted(os.sched_getaffinity(0))[-1:]
    return spec


def _modules(f):
    return dict((m["path"], m) for m in f["modules"])


class ProfiledPairTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = util.model_tree(MODEL)

    def _run(self, spec, **env):
        r = util.run(spec, env=env)
        self.assertEqual(r.status, "ok", r.describe())
        return r

    def test_regression_gets_a_profiled_pair(self):
        # 3 ms more a forward in the head's nap: regression, and the
        # profiles say it is nap's own time (timing_min_ms: the profiles'
        # means are of 8 iterations or more, which one preemption moves
        # less).
        spec = _spec(self.root, {"NAP_MS": "1"}, timing_pairs=3, max_timing_rounds=2,
                     timing_min_ms=30)
        r = self._run(spec, NAP_MS="4")
        kinds = [f.kind for f in r.frames]
        ps = r.kinds("profile")
        self.assertEqual([p["side"] for p in ps], ["control", "head"], r.describe())
        last_timing = max(i for i, k in enumerate(kinds) if k == "timing")
        self.assertGreater(kinds.index("profile"), last_timing)
        self.assertLess(kinds.index("profile") + 1, kinds.index("memory"))
        pairs = sorted(set(t["pair"] for t in r.kinds("timing")))
        self.assertEqual([p["pair"] for p in ps], [len(pairs)] * 2)
        self.assertIn("profiled pair: ran because the pairs say regression", r.notes("info"))
        for p in ps:
            self.assertEqual(p["phase"], "forward")
            self.assertGreaterEqual(p["iterations"], profile.MIN_ITERATIONS)
            self.assertEqual(p["profiler"], "torch.profiler")
            self.assertIn(p["start"], ("fork", "exec"))
            self.assertEqual((p["modules_left_out"], p["ops_left_out"]), (0, 0))
            self.assertLess(len(json.dumps(p.header)), profile.MAX_JSON)
            self.assertEqual(set(_modules(p)), {"", "cheap", "nap"})
            self.assertEqual(_modules(p)[""]["type"], "Root")
            self.assertTrue(all(m["calls"] == 1 for m in p["modules"]), p["modules"])
            self.assertTrue(any(o["name"].startswith("aten::") for o in p["ops"]), p["ops"])
            self.assertTrue(all(o["self_ns"] > 0 for o in p["ops"]))
            self.assertEqual([m["self_ns"] for m in p["modules"]],
                             sorted((m["self_ns"] for m in p["modules"]), reverse=True))
            # The root's inclusive time holds its children's.
            mods = _modules(p)
            self.assertGreaterEqual(mods[""]["total_ns"],
                                    mods["nap"]["total_ns"] + mods["cheap"]["total_ns"])
            self.assertLessEqual(mods[""]["total_ns"], p["total_ns"])
        ctl, head = _modules(ps[0]), _modules(ps[1])
        diff = dict((k, head[k]["self_ns"] - ctl[k]["self_ns"]) for k in ctl)
        self.assertGreaterEqual(diff["nap"], 2000000, diff)
        self.assertEqual(max(diff, key=diff.get), "nap", diff)

    def test_identical_builds_get_none(self):
        r = self._run(_spec(self.root, {"NAP_MS": "1"}), NAP_MS="1")
        self.assertEqual(len(r.kinds("timing")), 4)
        self.assertEqual(r.kinds("profile"), [])
        self.assertFalse(any("profiled" in n for n in r.notes()), r.notes())

    def test_off_gets_none(self):
        r = self._run(_spec(self.root, {"NAP_MS": "1"}, profile="off"), NAP_MS="4")
        self.assertEqual(len(r.kinds("timing")), 4)
        self.assertEqual(r.kinds("profile"), [])

    def test_always_unpaired_backward(self):
        # Unpaired, profile always: one profiled process of the cell's own
        # build, after its timing processes; the backward and the loss are
        # outside every module's forward.
        spec = _spec(self.root, None, pass_="backward", timing_processes=2, profile="always")
        r = self._run(spec, NAP_MS="0.2")
        p = r.one("profile")
        self.assertEqual((p["side"], p["process"], p["phase"]), ("head", 2, "backward"))
        self.assertNotIn("pair", p.header)
        self.assertIn("profiled process: ran because profile=always", r.notes("info"))
        self.assertGreater(p["outside_ns"], 0)
        self.assertLessEqual(p["outside_ns"], p["total_ns"])
        names = [o["name"] for o in p["ops"]]
        self.assertTrue(any("Backward" in n for n in names), names)
        self.assertTrue(any(n.startswith("aten::") for n in names), names)

    def test_failing_profiled_process_leaves_the_cell_ok(self):
        spec = _spec(self.root, {"NAP_MS": "1", "NAP_FAIL_PROFILED": "1"}, profile="always")
        r = self._run(spec, NAP_MS="1")
        self.assertEqual(len(r.kinds("timing")), 4, "the timing processes have no hooks")
        self.assertEqual(r.kinds("profile"), [])
        warns = [n for n in r.notes("warn") if n.startswith("profiled pair 2:")]
        self.assertEqual(len(warns), 1, r.notes())
        self.assertIn("the control build's profiled process failed", warns[0])
        self.assertIn("this build cannot be profiled", warns[0])
        self.assertIn("profiled pair: ran because profile=always", r.notes("info"))

    def test_exec_profiled_process(self):
        # Where the template has other threads, a fresh interpreter:
        # --timing-process INDEX 3 --profile answers with the profile.
        d = util.tempdir()
        path = os.path.join(d, "cell.json")
        with open(path, "w") as f:
            json.dump(_spec(self.root, None, profile="always"), f)
        r, w = os.pipe()
        err = open(os.path.join(d, "stderr"), "w+")
        p = subprocess.Popen([util.PYTHON, "-m", "capd_runner", "--timing-process", "7", "3",
                              "--profile"], env=dict(ENV, HOME=d, CAPD_CELL_SPEC=path),
                             pass_fds=(3, w), stdin=subprocess.DEVNULL, stderr=err,
                             preexec_fn=lambda: os.dup2(w, 3))
        os.close(w)
        with os.fdopen(r, "rb") as f:
            line = f.read()
        self.assertEqual(p.wait(timeout=120), 0, line[-3000:])
        # No Python warning in the cell's log (the official wheel's kineto
        # writes its own lines there, which no Python filter reaches).
        err.seek(0)
        self.assertNotIn("Warning", err.read())
        err.close()
        res = json.loads(line.decode())
        self.assertEqual(res["process"], 7)
        self.assertEqual(set(m["path"] for m in res["modules"]), {"", "cheap", "nap"})


class InProcessTest(unittest.TestCase):
    def test_frame_stays_well_under_the_header_limit(self):
        # Many long module paths: the frame keeps the most self time of each
        # list, alternately, and counts what it left out.
        modules = [{"path": "layers.%d.%s" % (i, "x" * 200), "type": "Linear",
                    "self_ns": 10000 - i, "total_ns": 10000, "calls": 1} for i in range(2000)]
        ops = [{"name": "aten::op%d" % i, "self_ns": 5000 - i, "calls": 2.5} for i in range(300)]
        res = {"iterations": 3, "total_ns": 1, "outside_ns": 0, "modules": modules, "ops": ops,
               "profiler": "torch.profiler", "start": "fork"}
        f = profile.frame({"phase": "forward"}, res, "head", pair=4)
        size = len(json.dumps(f, separators=(",", ":")))
        self.assertLess(size, profile.MAX_JSON)
        self.assertGreater(size, profile.MAX_JSON - 1024)
        self.assertEqual(f["modules"], modules[:len(f["modules"])])
        self.assertEqual(f["ops"], ops[:len(f["ops"])])
        self.assertEqual(f["modules_left_out"] + len(f["modules"]), 2000)
        self.assertEqual(f["ops_left_out"] + len(f["ops"]), 300)
        self.assertIn(len(f["modules"]) - len(f["ops"]), (0, 1))
        # Short entries: MAX_ENTRIES of each.
        for m in modules:
            m["path"] = "m"
        f = profile.frame({"phase": "forward"}, res, "head", pair=4)
        self.assertEqual((len(f["modules"]), len(f["ops"])), (256, 256))
        self.assertEqual((f["modules_left_out"], f["ops_left_out"]), (2000 - 256, 300 - 256))

    def test_iterations(self):
        self.assertEqual([profile.iterations_for(50, n) for n in (0, 10 ** 9, 10 ** 6, 1)],
                         [3, 3, 50, 1000])

    def test_profiler_that_will_not_start(self):
        # In this process: the iterations run and the modules count all
        # the same; the frame says why it has no operators.
        import torch
        import torch.profiler

        class Refuses(object):
            def __init__(self, **kw):
                pass

            def __enter__(self):
                raise RuntimeError("another profiler is running")

        class Spec(object):
            pass_, warmup, timing_min_ms = "forward", 1, 0

        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        saved = torch.profiler.profile
        torch.profiler.profile = Refuses
        try:
            res = profile.measure(torch, model, lambda m: m(torch.ones(2, 4)), Spec(), None,
                                  torch.device("cpu"))
        finally:
            torch.profiler.profile = saved
        self.assertEqual((res["ops"], res["profiler"], res["iterations"]), ([], None, 3))
        self.assertEqual(res["profiler_why"], "the profiler would not start: RuntimeError: "
                                              "another profiler is running")
        self.assertEqual(sorted(m["path"] for m in res["modules"]), ["", "0", "1"])
        self.assertEqual(model._forward_hooks, {}, "the hooks are gone")
        f = profile.frame({"phase": "forward"}, dict(res, start="fork"), "control", pair=0)
        self.assertEqual((f["ops"], f["profiler"], f["profiler_why"]),
                         ([], None, res["profiler_why"]))


if __name__ == "__main__":
    unittest.main()
