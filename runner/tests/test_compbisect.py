"""The compiler bisection of a compiled cell that departs from eager
(capd_runner/compbisect.py). Under a torch without torch.compile (Debian's
1.13) only the refusals run (the command line's, and a cell's with option
compiler_bisect run); under torch 2 (the official wheel) a clean model has
nothing to bisect, and a fault planted in one of Inductor's lowerings, in
this process (the bisector runs its test function in-process) or in a real
cell (tests/helpers/planted_inductor_fault/sitecustomize.py on its
PYTHONPATH), is narrowed to that lowering."""

import json
import os
import signal
import subprocess
import time
import unittest

import torch

from capd_runner import compbisect as cb
from tests import plant_relu_fault, util
from tests.test_compile import _run_many

HAS_COMPILE = hasattr(torch, "compile")
NO_COMPILE_WHY = "torch %s has no torch.compile (torch 2.0 or later)" % torch.__version__
try:
    from torch._inductor.compiler_bisector import CompilerBisector
except Exception as e:  # torch 1.x, or 2.x before the bisector
    CompilerBisector = None
    NO_BISECTOR_WHY = "no torch._inductor.compiler_bisector in torch %s: %s" % (
        torch.__version__, e)
else:
    NO_BISECTOR_WHY = None
RUNNER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# As capd sets it for one thread (the official wheel's numpy OpenBLAS would
# start a pool).
ENV = {"OPENBLAS_NUM_THREADS": "1"}
# The planted fault: relu's lowering scaled by 1 + 2**-8, far beyond the rule.
FAULT = 1 + 2 ** -8


def _cli(*args, **env):
    """(returncode, stdout, stderr) of the command line in a subprocess."""
    e = dict(os.environ, PYTHONPATH=RUNNER, **ENV)
    e.update(env)
    p = subprocess.run([util.PYTHON, "-m", "capd_runner.compbisect"] + list(args),
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=e, cwd=RUNNER, timeout=600)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def _skip_unless_bisector(cls):
    cls = unittest.skipUnless(NO_BISECTOR_WHY is None, NO_BISECTOR_WHY or "")(cls)
    return unittest.skipUnless(HAS_COMPILE, NO_COMPILE_WHY)(cls)


class CommandLineRefusalTest(unittest.TestCase):
    """Exit 2 with the reason on stderr and nothing on stdout: under a torch
    without torch.compile, that; under torch 2, bad arguments."""

    def _refused(self, args, *words):
        rc, out, err = _cli(*args)
        self.assertEqual(rc, 2, err)
        self.assertEqual(out, "")
        for w in words:
            self.assertIn(w, err)

    def test_exit_2_with_the_reason(self):
        base = ["--model", "mlp", "--pass", "forward", "--mode", "inductor"]
        if not HAS_COMPILE:
            self._refused(base, "capd_runner.compbisect: mode inductor needs torch.compile "
                          "(torch 2.0 or later); this is torch %s" % torch.__version__)
            return
        self._refused(base + ["--width", "nosuch"], "unknown width 'nosuch'")
        self._refused(["--model", "mlp", "--pass", "forward", "--mode", "eager"],
                      "invalid choice: 'eager'")
        self._refused(base + ["--timeout-s", "0"], "--timeout-s must be positive")


@_skip_unless_bisector
class JudgeTest(unittest.TestCase):
    """The float64 rule: err(compiled) <= k * err(eager) + tol."""

    def test_rule(self):
        ref = {"a": torch.zeros(100, dtype=torch.float64)}
        eager = {"a": torch.full((100,), 1e-6, dtype=torch.float64)}
        ok = cb.judge(eager, {"a": torch.full((100,), 3e-6, dtype=torch.float64)}, ref)
        self.assertTrue(ok["passed"], ok)  # 3e-6 <= 2 * 1e-6 + 1e-6
        self.assertEqual((ok["k"], ok["tol"], ok["worst_key"]), (2.0, 1e-6, "a"))
        self.assertAlmostEqual(ok["err_eager"], 1e-6)
        self.assertAlmostEqual(ok["err_compiled"], 3e-6)
        bad = cb.judge(eager, {"a": torch.full((100,), 3.2e-6, dtype=torch.float64)}, ref)
        self.assertFalse(bad["passed"], bad)
        self.assertEqual(bad["failed_keys"], ["a"])

    def test_small_and_half_take_k_3(self):
        ref = {"a": torch.zeros(10, dtype=torch.float64)}
        v = cb.judge(ref, ref, ref)
        self.assertEqual(v["k"], 3.0)
        ref = {"a": torch.zeros(11, dtype=torch.float64)}
        self.assertEqual(cb.judge(ref, ref, ref, "bfloat16")["k"], 3.0)
        self.assertEqual(cb.judge(ref, ref, ref)["k"], 2.0)

    def test_nonfinite_and_missing_fail(self):
        ref = {"a": torch.zeros(20, dtype=torch.float64)}
        nan = torch.zeros(20, dtype=torch.float64)
        nan[3] = float("nan")
        self.assertFalse(cb.judge(ref, {"a": nan}, ref)["passed"])
        self.assertTrue(cb.judge({"a": nan}, {"a": nan}, ref)["passed"])
        self.assertFalse(cb.judge(ref, {}, ref)["passed"])


@_skip_unless_bisector
class CleanModelTest(unittest.TestCase):
    """The zoo's mlp under inductor, by the command line in a subprocess:
    nothing to bisect."""

    def test_nothing_to_bisect(self):
        t0 = time.monotonic()
        rc, out, err = _cli("--model", "mlp", "--pass", "forward", "--mode", "inductor",
                            "--timeout-s", "120")
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        self.assertEqual(r["reason"], cb.NOTHING)
        self.assertEqual(r["reason"], "compiled passes the float64 rule: nothing to bisect")
        self.assertFalse(r["narrowed"])
        self.assertEqual(r["trials"], 0)  # no bisection ran
        for k in ("backend", "subsystem", "bisect_number", "debug_info"):
            self.assertIsNone(r[k], k)
        j = r["judgement"]
        self.assertTrue(j["passed"], j)
        self.assertEqual((j["worst_key"], j["k"], j["tol"]), ("model.0.forward.output.0", 2.0,
                                                             1e-6))
        self.assertLessEqual(j["err_compiled"], 2 * j["err_eager"] + 1e-6)
        self.assertIn("-m capd_runner.compbisect --model mlp --pass forward --mode inductor",
                      r["command"])
        self.assertGreater(r["elapsed_s"], 0)
        self.assertLess(r["elapsed_s"], time.monotonic() - t0)


@_skip_unless_bisector
class PlantedLoweringTest(unittest.TestCase):
    """A faulty lowering of aten.relu (its result scaled by FAULT), planted
    in this process while run() bisects the mlp under inductor."""

    @classmethod
    def setUpClass(cls):
        import torch._inductor.lowering as L
        torch.set_num_threads(1)
        aten = torch.ops.aten
        op, orig = aten.relu.default, L.lowerings[aten.relu.default]
        cls.calls = [0]

        def faulty(*args, **kwargs):
            cls.calls[0] += 1
            return L.lowerings[aten.mul.Tensor](orig(*args, **kwargs), FAULT)

        L.lowerings[op] = faulty
        cls.results, cls.calls_at = {}, {}
        try:
            for p in ("forward", "backward"):
                cls.results[p] = cb.run(cb.make_spec("mlp", p, "inductor"), timeout_s=240)
                cls.calls_at[p] = cls.calls[0]
            aot = cb.make_spec("mlp", "forward", "aot_eager")
            cls.results["aot_eager"] = cb.run(aot, timeout_s=240)
            cls.results["limit"] = cb.run(cb.make_spec("mlp", "forward", "inductor"),
                                          timeout_s=0.001)
        finally:
            L.lowerings[op] = orig

    def test_narrowed_to_the_lowering(self):
        for p in ("forward", "backward"):
            r = self.results[p]
            self.assertFalse(r["judgement"]["passed"], r)
            self.assertIn("model.0.forward.output.0", r["judgement"]["failed_keys"])
            self.assertTrue(r["narrowed"], r)
            self.assertIsNone(r["reason"], r)
            # What the wheel's bisector reports: the FX node of the first
            # faulty lowering (the graph's calls: permute, addmm, relu, ...).
            self.assertEqual((r["backend"], r["subsystem"], r["bisect_number"], r["debug_info"]),
                             ("inductor", "lowerings", 2, "relu"), r)
            self.assertGreater(r["trials"], 5)
            self.assertEqual(r["trial_errors"], 0, r["first_trial_error"])
            self.assertIn("-m capd_runner.compbisect --model mlp --pass %s --mode inductor" % p,
                          r["command"])
            self.assertIn("PYTHONPATH=", r["command"])
        self.assertTrue(any(k.endswith("param_grad.weight")
                            for k in self.results["backward"]["judgement"]["failed_keys"]))
        self.assertGreater(self.calls_at["forward"], 1)  # the trials ran in this process

    def test_bisector_state_left_clean(self):
        self.assertFalse(CompilerBisector.bisection_enabled)
        self.assertIsNone(CompilerBisector.in_process_cache)
        self.assertIsNone(CompilerBisector.get_backend())

    def test_aot_eager_does_not_lower(self):
        r = self.results["aot_eager"]
        self.assertEqual(r["reason"], cb.NOTHING, r)
        self.assertEqual(r["trials"], 0)

    def test_time_limit(self):
        r = self.results["limit"]
        self.assertFalse(r["judgement"]["passed"])
        self.assertFalse(r["narrowed"])
        self.assertIsNone(r["backend"])
        self.assertIn("time limit of 0.001s", r["reason"])
        self.assertIn("could not narrow", r["reason"])
        self.assertIn("--timeout-s 0.001", r["command"])


@_skip_unless_bisector
class HardLimitTest(unittest.TestCase):
    """A trial still running when the limit expires is interrupted."""

    def test_trial_interrupted(self):
        t0 = time.monotonic()
        result, state = cb.bisect(lambda backend: time.sleep(30), t0 + 0.5)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIsNone(result)
        self.assertTrue(state["expired"])
        self.assertEqual(state["trials"], 1)
        self.assertEqual(state["where"], ("eager", None))
        self.assertFalse(CompilerBisector.bisection_enabled)
        self.assertIsNone(CompilerBisector.in_process_cache)


# --- in a cell (options.compiler_bisect run) -----------------------------------------

AVX2 = {"avx2", "fma"} <= util.cpu_flags()


def _cell_spec(mode, width="native", pass_="forward", **options):
    s = util.make_spec("mlp", width=width, pass_=pass_, compiler_bisect="run", **options)
    if mode is not None:
        s["mode"] = mode
    s["scratch"] = util.tempdir()
    return s


def _cell_env(width="native", **extra):
    env = dict(ENV, **extra)
    if width != "native":
        env["ATEN_CPU_CAPABILITY"] = width
    return env


def _bisect_notes(r):
    return [m for m in r.notes("info") if m.startswith(cb.NOTE_PREFIX)]


def _bisect_result(test, r):
    """The cell's one compile_bisect note, parsed."""
    notes = _bisect_notes(r)
    test.assertEqual(len(notes), 1, r.describe())
    return json.loads(notes[0][len(cb.NOTE_PREFIX):])


class NoteTest(unittest.TestCase):
    """The note's message and the cell's time limit (no torch.compile needed)."""

    def _result(self, **changes):
        r = {"narrowed": False, "backend": None, "subsystem": None, "bisect_number": None,
             "debug_info": None, "reason": cb.NOTHING, "trials": 0, "command": "python -m x",
             "judgement": {"passed": True, "failed_keys": [], "ratio": 0.5, "worst_key": "k"}}
        r.update(changes)
        return r

    def test_compact_sorted_strict(self):
        msg = cb.note_message(self._result())
        self.assertTrue(msg.startswith("compile_bisect={\"backend\":null,\"bisect_number\":null,"),
                        msg)
        self.assertNotIn(" ", msg.replace(cb.NOTHING, "").replace("python -m x", ""))
        self.assertEqual(json.loads(msg[len(cb.NOTE_PREFIX):]), self._result())
        inf = cb.note_message(self._result(judgement={"ratio": float("inf"),
                                                      "err_compiled": float("nan")}))
        self.assertEqual(json.loads(inf[len(cb.NOTE_PREFIX):])["judgement"],
                         {"ratio": "inf", "err_compiled": "nan"})

    def test_truncated_to_fit(self):
        big = self._result(narrowed=True, backend="inductor", subsystem="lowerings",
                           bisect_number=3, reason=None, debug_info="x\"" * 50000,
                           first_trial_error="e" * 70000,
                           judgement={"passed": False, "failed_keys": ["k" * 9000] * 10})
        msg = cb.note_message(big)
        self.assertLessEqual(len(json.dumps(msg)), cb.NOTE_MAX)
        r = json.loads(msg[len(cb.NOTE_PREFIX):])
        self.assertEqual(sorted(r["truncated"]), ["debug_info", "first_trial_error", "judgement"])
        self.assertTrue(r["debug_info"].startswith("x\"x\"") and
                        r["debug_info"].endswith("...[truncated]"), r["debug_info"][-40:])
        self.assertEqual((r["narrowed"], r["backend"], r["subsystem"], r["bisect_number"]),
                         (True, "inductor", "lowerings", 3))
        self.assertFalse(r["judgement"]["passed"])
        small = cb.note_message(self._result())
        self.assertNotIn("truncated", json.loads(small[len(cb.NOTE_PREFIX):]))

    def test_cell_time_limit(self):
        def limit(t):
            return cb.cell_timeout_s(_spec_obj(timeout_s=t))
        self.assertEqual(limit(600), 540.0)
        self.assertEqual(limit(30), 10.0)
        self.assertEqual(limit(1), 10.0)
        self.assertEqual(limit(86400), 2.0 * cb.DEFAULT_TIMEOUT_S)

    def test_alarm_left_to_its_owner(self):
        calls = []
        old = signal.signal(signal.SIGALRM, lambda *a: calls.append(a))
        try:
            undo = cb._alarm({"expired": False, "in_trial": False}, 0.05)
            time.sleep(0.2)
            undo()
            self.assertEqual(signal.getitimer(signal.ITIMER_REAL)[0], 0)
            self.assertEqual(calls, [])  # no timer was set over the owner's handler
            self.assertNotIn(signal.getsignal(signal.SIGALRM),
                             (signal.SIG_DFL, signal.SIG_IGN))
        finally:
            signal.signal(signal.SIGALRM, old)
        state = {"expired": False, "in_trial": False}
        undo = cb._alarm(state, 0.05)
        time.sleep(0.2)
        undo()
        self.assertTrue(state["expired"])
        self.assertIs(signal.getsignal(signal.SIGALRM), old)


def _spec_obj(**options):
    from capd_runner import spec as specmod
    return specmod.check(dict(util.make_spec("mlp", **options), mode="inductor"))


class PlantedSiteTest(unittest.TestCase):
    """The planted fault's sitecustomize.py: one file, and torch not imported
    at interpreter start."""

    def test_one_file(self):
        with open(os.path.join(plant_relu_fault.SITE_DIR, "sitecustomize.py")) as f:
            self.assertEqual(f.read(), plant_relu_fault.SITECUSTOMIZE)
        d = plant_relu_fault.write_site(os.path.join(util.tempdir(), "site"))
        with open(os.path.join(d, "sitecustomize.py")) as f:
            self.assertEqual(f.read(), plant_relu_fault.SITECUSTOMIZE)

    def test_torch_not_imported_at_start(self):
        p = subprocess.run([util.PYTHON, "-c", "import sys, sitecustomize; "
                            "print(sitecustomize.__file__, 'torch' in sys.modules)"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
                           env=dict(os.environ, PYTHONPATH=plant_relu_fault.SITE_DIR))
        self.assertEqual(p.returncode, 0, p.stderr)
        path, imported = p.stdout.decode().split()
        self.assertEqual(os.path.dirname(path), plant_relu_fault.SITE_DIR)
        self.assertEqual(imported, "False")


class CellRefusedTest(unittest.TestCase):
    """A cell with compiler_bisect run that cannot bisect ends unsupported
    after its env frame (exit 0), as a compiled cell that cannot run does:
    an eager cell under any torch; under torch 1.x a compiled cell for want
    of torch.compile; under torch 2 a compiled cell's own refusals, and the
    bisector's."""

    @classmethod
    def setUpClass(cls):
        jobs = [(_cell_spec("eager"), {"env": _cell_env()}),
                (_cell_spec(None), {"env": _cell_env()})]
        if not HAS_COMPILE:
            jobs.append((_cell_spec("inductor"), {"env": _cell_env()}))
        else:
            jobs += [(_cell_spec("aot_eager", granularity="op"), {"env": _cell_env()}),
                     (_cell_spec("aot_eager"), {"env": _cell_env(TORCH_BISECT_BACKEND="eager")})]
        cls.results = _run_many(jobs)

    def _unsupported(self, r, reason):
        self.assertEqual(r.returncode, 0, r.describe())
        self.assertEqual([f.kind for f in r.frames], ["hello", "env", "end"], r.describe())
        self.assertEqual(r.status, "unsupported")
        self.assertEqual(r.end["reason"], reason)

    def test_eager_cell(self):
        for r in self.results[:2]:
            self._unsupported(r, "option compiler_bisect run needs a compiled mode "
                              "(aot_eager or inductor)")
            self.assertEqual(r.end["reason"], cb.EAGER_WHY)
            self.assertNotIn("compile", r.one("env")["fingerprint"])

    @unittest.skipIf(HAS_COMPILE, "torch %s has torch.compile" % torch.__version__)
    def test_no_compile(self):
        self._unsupported(self.results[2], "mode inductor needs torch.compile (torch 2.0 or "
                          "later); this is torch %s" % torch.__version__)

    @unittest.skipUnless(HAS_COMPILE, NO_COMPILE_WHY)
    def test_compiled_cell_refusal_first(self):
        self._unsupported(self.results[2], "mode aot_eager records the model's inputs and "
                          "outputs only: per-op capture (granularity op) is not defined under "
                          "torch.compile")

    @unittest.skipUnless(HAS_COMPILE, NO_COMPILE_WHY)
    def test_bisector_refusal(self):
        r = self.results[3]
        self._unsupported(r, "TORCH_BISECT_BACKEND set in the environment: the bisector would "
                          "follow it, not its own state")
        self.assertEqual(r.one("env")["fingerprint"]["compile"]["unsupported"], r.end["reason"])


@_skip_unless_bisector
@unittest.skipUnless(AVX2, "this host's CPU lacks AVX2")
class CellTest(unittest.TestCase):
    """The zoo's mlp, mode inductor, width avx2, forward, compiler_bisect
    run, as real cells: a clean build (nothing to bisect), and one with the
    planted relu fault (narrowed to it); then the planted cell's command
    line, outside any cell."""

    @classmethod
    def setUpClass(cls):
        planted_env = _cell_env("avx2", PYTHONPATH=os.pathsep.join(
            [plant_relu_fault.SITE_DIR, RUNNER]))
        cls.specs = [_cell_spec("inductor", "avx2"), _cell_spec("inductor", "avx2")]
        t0 = time.monotonic()
        cls.clean, cls.planted = _run_many([(cls.specs[0], {"env": _cell_env("avx2"),
                                                            "timeout": 900}),
                                            (cls.specs[1], {"env": planted_env,
                                                            "timeout": 900})])
        cls.wall_s = time.monotonic() - t0

    def _ok(self, r):
        self.assertEqual(r.returncode, 0, r.describe())
        self.assertEqual(r.status, "ok", r.describe())
        # no tensor, nondeterministic or timing frame
        self.assertEqual([f.kind for f in r.frames if f.kind != "note"],
                         ["hello", "env", "memory", "end"], r.describe())
        self.assertEqual(r.one("env")["effective_width"], "avx2")
        c = r.one("env")["fingerprint"]["compile"]
        self.assertEqual((c["mode"], c["isa"]), ("inductor", "avx2"))
        self.assertNotIn("unsupported", c)
        res = _bisect_result(self, r)
        self.assertEqual((res["model"], res["pass"], res["mode"]), ("mlp", "forward", "inductor"))
        self.assertEqual(res["timeout_s"], 540.0)  # options.timeout_s 600 less the margin
        self.assertLess(res["elapsed_s"], self.wall_s)
        cmd = res["command"]
        self.assertTrue(cmd.startswith("PYTHONPATH=%s" % RUNNER), cmd)
        self.assertIn(" %s -m capd_runner.compbisect --model mlp --pass forward --mode inductor "
                      "--width avx2 --timeout-s 540 --seed 0 --batch 2 --dtype float32 "
                      "--threads 1" % util.PYTHON, cmd)
        self.assertNotIn("--scratch", cmd)
        return res

    def test_clean_nothing_to_bisect(self):
        r = self._ok(self.clean)
        self.assertFalse(r["narrowed"])
        self.assertEqual(r["reason"], "compiled passes the float64 rule: nothing to bisect")
        self.assertEqual(r["trials"], 0)
        for k in ("backend", "subsystem", "bisect_number", "debug_info"):
            self.assertIsNone(r[k], k)
        self.assertTrue(r["judgement"]["passed"], r["judgement"])
        self.assertNotIn("planted_inductor_fault", self.clean.stderr)

    def test_planted_fault_narrowed(self):
        r = self._ok(self.planted)
        self.assertIn("planted_inductor_fault: torch._inductor.lowering", self.planted.stderr)
        self.assertFalse(r["judgement"]["passed"], r["judgement"])
        self.assertEqual(r["judgement"]["failed_keys"], ["model.0.forward.output.0"])
        self.assertTrue(r["narrowed"], r)
        self.assertIsNone(r["reason"], r)
        self.assertEqual((r["backend"], r["subsystem"], r["debug_info"]),
                         ("inductor", "lowerings", "relu"), r)
        self.assertIsInstance(r["bisect_number"], int)
        self.assertGreater(r["trials"], 5)
        self.assertEqual(r["trial_errors"], 0, r["first_trial_error"])
        self.assertIn(plant_relu_fault.SITE_DIR, r["command"].split()[0])

    def test_command_line_repeats_it(self):
        """The planted cell's command line, run by a shell outside the cell
        (its PYTHONPATH names the planted fault's directory)."""
        cmd = _bisect_result(self, self.planted)["command"]
        env = {"PATH": "/usr/bin:/bin", "HOME": util.tempdir(), "LANG": "C.UTF-8"}
        env.update(ENV)
        p = subprocess.run(["/bin/sh", "-c", cmd], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                           cwd=util.tempdir(), timeout=900)
        err = p.stderr.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 0, err[-3000:])
        r = json.loads(p.stdout.decode())
        self.assertEqual((r["narrowed"], r["backend"], r["subsystem"], r["debug_info"]),
                         (True, "inductor", "lowerings", "relu"), r)
        self.assertEqual(r["command"], cmd)


if __name__ == "__main__":
    unittest.main()
