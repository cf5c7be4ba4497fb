"""The compiler bisection of a compiled cell that departs from eager
(capd_runner/compbisect.py). Under a torch without torch.compile (Debian's
1.13) only the command line's refusal runs; under torch 2 (the official
wheel) a clean model has nothing to bisect, and a fault planted in one of
Inductor's lowerings, in this process (the bisector runs its test function
in-process), is narrowed to that lowering."""

import json
import os
import subprocess
import time
import unittest

import torch

from capd_runner import compbisect as cb
from tests import util

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


if __name__ == "__main__":
    unittest.main()
