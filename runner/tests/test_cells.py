"""Cells run as real subprocesses: widths, capture levels, dtypes, user
models, failures, the frame pipe."""

import json
import os
import platform
import subprocess
import sys
import unittest

from tests import util
from tests.framereader import RUNNER_DIR

USER_MODELS = {
    "mypkg/__init__.py": "",
    "mypkg/models.py": util.LIN_MODEL + '''
class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 1.0

class Two(torch.nn.Module):
    def __init__(self):
        super(Two, self).__init__()
        self.scale = Scale()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        return self.lin(self.scale(x) + y)

def arange(seed, batch, dtype):
    return Scale(), torch.arange(1000, dtype=dtype).reshape(10, 100)

def two(seed, batch, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, generator=g).requires_grad_(True)
    return Two(), (x, torch.randn(batch, 4, generator=g))

class Boom(Lin):
    SIZES = (4, 4)

    def forward(self, x):
        x = self.lin(x)
        raise ValueError("boom in forward")

def boom(seed, batch, dtype):
    return Boom(), torch.zeros(batch, 4)

def nonfinite(seed, batch, dtype):
    x = torch.tensor([[1.0, float("nan"), float("inf")], [0.0, -2.0, float("-inf")]], dtype=dtype)
    return Scale(), x
''',
}
OUTSIDE = {"evilpkg/__init__.py": "", "evilpkg/m.py": "def f(seed, batch, dtype):\n    raise SystemExit(7)\n"}


def _avx512():
    # What PyTorch requires for its AVX512 kernels.
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= util.cpu_flags()


class WidthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        jobs = []
        cls.widths = ["default", "avx2"] + (["avx512"] if _avx512() else [])
        for w in cls.widths:
            jobs.append((util.make_spec("mlp", width=w, iterations=1, warmup=0),
                         {"env": {"ATEN_CPU_CAPABILITY": w}}))
        jobs.append((util.make_spec("mlp", width="avx512", iterations=1),
                     {"env": {"ATEN_CPU_CAPABILITY": "default"}}))
        jobs.append((util.make_spec("mlp", width="native", iterations=1), {}))
        # A width whose features this host lacks (capd's width table sends
        # them as width_requires): refused before torch runs anything.
        lacking = dict(util.make_spec("mlp", width="avx512", iterations=1),
                       width_requires=["avx2", "capd_no_such_flag"])
        jobs.append((lacking, {"env": {"ATEN_CPU_CAPABILITY": "avx512"}}))
        cls.results = util.run_many(jobs)

    def test_each_width_effective(self):
        for w, r in zip(self.widths, self.results):
            self.assertEqual(r.status, "ok", r.describe())
            self.assertEqual(r.one("env")["effective_width"], w)
            fp = r.one("env")["fingerprint"]
            self.assertEqual(fp["env"].get("ATEN_CPU_CAPABILITY"), w)

    def test_same_values_across_widths_inputs_and_params(self):
        # Inputs and initial parameters come from integer draws: bit-identical
        # whatever the width (torch's own float RNG kernels are not).
        by_width = [dict((t["key"], t["hash"]) for t in r.tensors) for r in
                    self.results[:len(self.widths)]]
        for key in ("fc1.0.init.param.weight", "fc3.0.init.param.bias", "model.0.forward.input.0"):
            self.assertEqual(len(set(h[key] for h in by_width)), 1, key)

    def test_unsupported(self):
        r = self.results[len(self.widths)]
        util.assert_ended(self, r, 0, ["hello", "env", "end"], "unsupported",
                          "avx512", "default")
        self.assertEqual(r.one("env")["effective_width"], "default")

    def test_host_lacks_width(self):
        r = self.results[-1]
        if platform.machine() not in ("x86_64", "i686", "i386"):
            self.skipTest("the runner's own check reads x86 flags only")
        util.assert_ended(self, r, 0, ["hello", "end"], "unsupported", "capd_no_such_flag")
        self.assertNotIn("avx2,", r.end["reason"])

    def test_native(self):
        r = self.results[-2]
        self.assertEqual(r.status, "ok", r.describe())
        self.assertIn(r.one("env")["effective_width"],
                      ("default", "avx2", "avx512", "vsx", "zvector", "sve256"))


class CaptureLevelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = util.model_tree(USER_MODELS)
        roots = [cls.root]
        cls.jobs = {
            "sample": util.make_spec("mypkg.models:arange", model_roots=roots, capture="sample",
                                     sample_size=7, iterations=1),
            "sample_all": util.make_spec("mypkg.models:arange", model_roots=roots,
                                         capture="sample", sample_size=5000, iterations=1),
            "full_cap": util.make_spec("mlp", capture="full", max_payload_bytes=40000,
                                       iterations=1),
            "full_one": util.make_spec("mlp", capture="full", max_one_payload_bytes=1024,
                                       iterations=1),
            "full_bf16": util.make_spec("mlp", pass_="backward", capture="full",
                                        dtype="bfloat16", iterations=1),
            "bf16_fwd": util.make_spec("transformer", dtype="bfloat16", iterations=1),
            "fp16_user": util.make_spec("mypkg.models:arange", model_roots=roots,
                                        capture="full", dtype="float16", iterations=1),
            "fp16_mlp": util.make_spec("mlp", dtype="float16", iterations=1,
                                       device=util.DEVICE),
            "nonfinite": util.make_spec("mypkg.models:nonfinite", model_roots=roots,
                                        capture="full", iterations=1),
            "float64": util.make_spec("cnn", pass_="backward", dtype="float64", iterations=1),
        }
        names = list(cls.jobs)
        res = util.run_many([(cls.jobs[n], {}) for n in names])
        cls.res = dict(zip(names, res))

    def ok(self, name):
        r = self.res[name]
        self.assertEqual(r.status, "ok", r.describe())
        return r

    def test_sample_positions_stride(self):
        r = self.ok("sample")
        t = [t for t in r.tensors if t["key"] == "model.0.forward.input.0"][0]
        self.assertEqual(t["capture"], "sample")
        self.assertEqual(t["sample_positions"], "stride")
        self.assertEqual(t["nbytes"], 7 * 4)
        self.assertEqual(util.floats(t.payload, "float32"),
                         [float((i * 1000) // 7) for i in range(7)])

    def test_sample_larger_than_numel_is_everything(self):
        r = self.ok("sample_all")
        t = [t for t in r.tensors if t["key"] == "model.0.forward.output.0"][0]
        self.assertEqual(t["nbytes"], 1000 * 4)
        self.assertEqual(util.floats(t.payload, "float32"), [float(i) for i in range(1000)])
        self.assertEqual(util.record_hash(t, t.payload), t["hash"])

    def test_full_past_one_payload_limit_falls_back(self):
        # capd's frame_max_payload reaches the runner as max_one_payload_bytes:
        # a tensor bigger than one frame may carry goes out as a sample (the
        # frame would end the cell protocol_error), with a note saying why.
        r = self.ok("full_one")
        caps = [t["capture"] for t in r.tensors]
        self.assertEqual(caps[0], "sample", "fc1.weight is 32768 bytes, past 1024")
        self.assertNotIn("full", caps)
        self.assertTrue(all(t.get("nbytes", 0) <= 1024 for t in r.tensors))
        warns = r.notes("warn")
        self.assertTrue(any("max_one_payload_bytes 1024" in m and "falling back to sample" in m
                            for m in warns), warns)

    def test_full_capture_is_deterministic(self):
        # The determinism run hashes the way the capture run did: at level
        # full both take the Python path, whose hash_alg differs from the
        # native pipe's, so equal tensors must not be called nondeterministic.
        for name in ("full_cap", "full_one", "fp16_user"):
            r = self.ok(name)
            self.assertEqual(r.one("nondeterministic")["keys"], [], name)
            self.assertTrue(name == "full_one" or any(t["capture"] == "full" for t in r.tensors),
                            name)

    def test_full_with_payload_cap_fallback(self):
        r = self.ok("full_cap")
        ts = r.tensors
        caps = [t["capture"] for t in ts]
        self.assertEqual(caps[:2], ["full", "full"])  # fc1.weight (32768 B), fc1.bias (512 B)
        for t in ts:
            if t["capture"] == "full":
                self.assertEqual(t["nbytes"], t["numel"] * 4)
                self.assertEqual(util.record_hash(t, t.payload), t["hash"])
        first_sample = caps.index("sample")
        self.assertNotIn("full", caps[first_sample:])
        self.assertIn("stats", caps)  # budget exhausted in the end
        self.assertNotIn("sample", caps[caps.index("stats"):])
        total = sum(t.get("nbytes", 0) for t in ts)
        self.assertLessEqual(total, 40000)
        warns = r.notes("warn")
        self.assertTrue(any("falling back to sample" in m for m in warns), warns)
        self.assertTrue(any("stats only" in m for m in warns), warns)
        # The fallback note comes before the first sample frame.
        kinds = [(f.kind, f.get("capture")) for f in r.frames]
        self.assertLess(kinds.index(("note", None)), kinds.index(("tensor", "sample")))

    def test_bfloat16_full_backward(self):
        r = self.ok("full_bf16")
        floats = [t for t in r.tensors if t["dtype"] == "bfloat16"]
        self.assertTrue(floats)
        for t in floats:
            self.assertEqual(t["nbytes"], t["numel"] * 2)
            self.assertEqual(util.record_hash(t, t.payload), t["hash"])
        w = [t for t in r.tensors if t["key"] == "fc1.0.init.param.weight"][0]
        vals = util.floats(w.payload, "bfloat16")
        self.assertAlmostEqual(min(vals), w["stats"]["min"])
        self.assertAlmostEqual(max(vals), w["stats"]["max"])
        self.assertTrue(any(t["role"] == "param_grad" and t["dtype"] == "bfloat16" for t in r.tensors))

    def test_bfloat16_transformer(self):
        r = self.ok("bf16_fwd")
        self.assertEqual(r.one("nondeterministic")["keys"], [])
        self.assertTrue(all(t["dtype"] == "bfloat16" for t in r.tensors))

    def test_float16(self):
        r = self.ok("fp16_user")
        t = [t for t in r.tensors if t["key"] == "model.0.forward.output.0"][0]
        self.assertEqual(t["dtype"], "float16")
        self.assertEqual(util.floats(t.payload, "float16"), [float(i) for i in range(1000)])
        self.assertEqual(util.record_hash(t, t.payload), t["hash"])
        # The zoo in float16: fine on GPU and recent CPU builds; older CPU builds
        # lack half matmul, which must end failed with the reason, not crash.
        r = self.res["fp16_mlp"]
        if r.status != "ok":
            self.assertEqual(r.status, "failed", r.describe())
            self.assertEqual(r.returncode, 1)
            self.assertIn("Half", r.end["reason"])
            self.assertTrue(r.tensors, "the records reached before the failure are kept")
            self.assertTrue(any("Traceback" in m for m in r.notes("error")))
        else:
            self.assertTrue(all(t["dtype"] in ("float16", "int64") for t in r.tensors))

    def test_nonfinite_stats(self):
        r = self.ok("nonfinite")
        t = [t for t in r.tensors if t["key"] == "model.0.forward.input.0"][0]
        s = t["stats"]
        self.assertEqual((s["nan"], s["pinf"], s["ninf"], s["zeros"]), (1, 1, 1, 1))
        self.assertEqual((s["min"], s["max"]), (-2.0, 1.0))
        self.assertAlmostEqual(s["mean"], -1.0 / 3)
        self.assertAlmostEqual(s["std"], (((1 + 1 / 3.0) ** 2 + (1 / 3.0) ** 2 + (-2 + 1 / 3.0) ** 2) / 3) ** 0.5)
        self.assertAlmostEqual(s["l2"], 5 ** 0.5)
        self.assertEqual(util.record_hash(t, t.payload), t["hash"])

    def test_float64(self):
        r = self.ok("float64")
        self.assertTrue(all(t["dtype"] in ("float64",) for t in r.tensors))


class UserModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = util.model_tree(USER_MODELS)
        cls.outside = util.model_tree(OUTSIDE)
        r = [cls.root]
        cases = {
            "ok_fwd": util.make_spec("mypkg.models:two", model_roots=r, iterations=1),
            "ok_bwd": util.make_spec("mypkg.models:two", pass_="backward", model_roots=r,
                                     iterations=1),
            "outside": util.make_spec("evilpkg.m:f", model_roots=r),
            "stdlib": util.make_spec("json:loads", model_roots=r),
            "dotdot": util.make_spec("..mypkg.models:two", model_roots=r),
            "root_dotdot": util.make_spec("mypkg.models:two",
                                          model_roots=[os.path.join(cls.outside, "..",
                                                                    os.path.basename(cls.root))]),
            "boom": util.make_spec("mypkg.models:boom", model_roots=r),
            "unknown_zoo": util.make_spec("alexnet"),
        }
        names = list(cases)
        # Also put the outside directory on the child's PYTHONPATH: still refused.
        env = {"PYTHONPATH": RUNNER_DIR + os.pathsep + cls.outside}
        res = util.run_many([(cases[n], {"env": env}) for n in names])
        cls.res = dict(zip(names, res))

    def test_user_model_forward_and_backward(self):
        for name in ("ok_fwd", "ok_bwd"):
            r = self.res[name]
            self.assertEqual(r.status, "ok", r.describe())
            keys = [t["key"] for t in r.tensors]
            self.assertIn("model.0.forward.input.1", keys)
            self.assertIn("scale.0.forward.output.0", keys)
        keys = [t["key"] for t in self.res["ok_bwd"].tensors]
        bw = [k for k in keys if ".backward." in k]
        # x requires grad, y does not: grad_input only where x flows.
        self.assertEqual(bw, ["model.0.backward.grad_output.0", "lin.0.backward.grad_output.0",
                              "lin.0.backward.grad_input.0", "scale.0.backward.grad_output.0",
                              "scale.0.backward.grad_input.0", "model.0.backward.grad_input.0",
                              "lin.0.backward.param_grad.weight",
                              "lin.0.backward.param_grad.bias"])

    def refused(self, name, *words):
        r = self.res[name]
        self.assertEqual(r.status, "failed", r.describe())
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.tensors, [])
        for w in words:
            self.assertIn(w, r.end["reason"])
        return r

    def test_outside_roots_refused(self):
        r = self.refused("outside", "refused")
        self.assertNotIn("SystemExit", r.stderr)  # its code never ran
        self.refused("stdlib", "refused")

    def test_dotdot_refused(self):
        self.refused("dotdot", "refused")
        self.refused("root_dotdot", "refused", "..")

    def test_unknown_zoo_model(self):
        self.refused("unknown_zoo", "unknown model", "mlp")

    def test_exception_in_model_code(self):
        r = self.res["boom"]
        self.assertEqual(r.status, "failed", r.describe())
        self.assertEqual(r.returncode, 1)
        self.assertIn("ValueError: boom in forward", r.end["reason"])
        errs = r.notes("error")
        self.assertTrue(errs and "Traceback" in errs[0] and "boom in forward" in errs[0], errs)
        keys = [t["key"] for t in r.tensors]
        self.assertIn("lin.0.forward.output.0", keys)  # layers reached are kept
        self.assertEqual(r.frames[-2].kind, "note")


class MiscTest(unittest.TestCase):
    def test_list_models(self):
        out = subprocess.check_output([util.PYTHON, "-m", "capd_runner", "--list-models"],
                                      env={"PYTHONPATH": RUNNER_DIR, "PATH": "/usr/bin:/bin"})
        models = json.loads(out.decode("utf-8"))
        self.assertEqual([m["name"] for m in models], util.ZOO)
        for m in models:
            self.assertEqual(sorted(m), ["description", "name", "needs"])
            self.assertIn(m["needs"], (None, "torchvision"))
            self.assertTrue(m["description"])

    def test_spec_problems(self):
        r = util.run(None, spec_text="{not json")
        self.assertEqual([f.kind for f in r.frames], ["hello", "end"])
        self.assertEqual(r.status, "failed")
        self.assertEqual(r.returncode, 1)
        self.assertIn("not valid JSON", r.end["reason"])
        r = util.run(None, spec_text=json.dumps(dict(util.make_spec(), protocol=2)))
        self.assertIn("protocol", r.end["reason"])
        r = util.run(None, spec_text="{}", env={"CAPD_CELL_SPEC": "/nonexistent/spec.json"})
        self.assertEqual(r.status, "failed")
        self.assertIn("cannot read cell spec", r.end["reason"])

    def test_gpu_unavailable(self):
        r = util.run(util.make_spec("mlp", device="gpu"))
        if r.status == "ok":
            self.assertEqual(r.one("env")["fingerprint"]["device"]["type"], "cuda")
            self.skipTest("a GPU is available")
        self.assertEqual(r.status, "failed")
        self.assertEqual(r.returncode, 1)
        self.assertIn("cuda", r.end["reason"])
        self.assertEqual([f.kind for f in r.frames], ["hello", "env", "end"])

    def test_broken_pipe_exits_quietly(self):
        r = util.run(util.make_spec("cnn", capture="full", iterations=1), close_after=1)
        self.assertNotEqual(r.returncode, 0)
        self.assertGreater(r.returncode, 0, "killed by a signal instead of exiting")
        self.assertNotIn("Traceback", r.stderr)

    def test_no_frame_fd(self):
        spec = util.make_spec("mlp")
        spec["frame_fd"] = 97
        r = util.run(spec, expect_frames=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot write frames to fd 97", r.stderr)


class OutOfMemoryTest(unittest.TestCase):
    """Allocation failures the framework reports end the cell "oom"."""

    def test_classification(self):
        from capd_runner import cell
        self.assertTrue(cell.is_out_of_memory(MemoryError()))
        self.assertTrue(cell.is_out_of_memory(RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 1024 bytes.")))
        self.assertTrue(cell.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to ...")))
        self.assertFalse(cell.is_out_of_memory(RuntimeError("could not create a primitive")))
        self.assertFalse(cell.is_out_of_memory(ValueError("shapes do not match")))
        try:
            try:
                raise MemoryError()
            except MemoryError:
                raise RuntimeError("could not create a primitive")
        except RuntimeError as e:
            self.assertTrue(cell.is_out_of_memory(e), "oneDNN failing after an allocation")

    def test_memory_error_in_model_ends_oom(self):
        root = util.tempdir()
        util.write_tree(root, {"hog/__init__.py": "", "hog/m.py": (
            "import torch\n"
            "class Hog(torch.nn.Module):\n"
            "    def forward(self, x):\n"
            "        raise MemoryError()\n"
            "def make(spec, batch, dtype):\n"
            "    return Hog(), (torch.zeros(batch, 4, dtype=dtype),)\n")})
        r = util.run(util.make_spec("hog.m:make", model_roots=[root], iterations=1, warmup=0))
        self.assertEqual(r.status, "oom", r.describe())
        self.assertIn("MemoryError", r.end["reason"])


if __name__ == "__main__":
    unittest.main()


class ImportDispatchesNothingTest(unittest.TestCase):
    """A prefork zygote imports the runner and torch, then forks; the child
    sets its width and only then runs its first operator. An operator run by
    importing the runner would fix the capability in the zygote already."""

    def test_width_chosen_after_import_still_applies(self):
        code = (
            "import importlib, os, pkgutil, sys\n"
            "os.environ.pop('ATEN_CPU_CAPABILITY', None)\n"
            "import torch, capd_runner\n"
            "for m in pkgutil.iter_modules(capd_runner.__path__):\n"
            "    if m.name != '__main__':\n"
            "        importlib.import_module('capd_runner.' + m.name)\n"
            "os.environ['ATEN_CPU_CAPABILITY'] = 'default'\n"
            "from capd_runner import width\n"
            "torch.ones(4).sum()\n"
            "print(width.effective(torch))\n")
        env = dict(os.environ)
        env.pop("ATEN_CPU_CAPABILITY", None)
        env["PYTHONPATH"] = RUNNER_DIR
        out = subprocess.run([util.PYTHON, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "default",
                         "an operator ran while the runner was imported: " + out.stderr)


# A forward pass of 1 ms, busy-waited.
SPIN_MODEL = '''
import time, torch

class Spin(torch.nn.Module):
    def forward(self, x):
        end = time.perf_counter_ns() + 1000000
        while time.perf_counter_ns() < end:
            pass
        return x * 2

def make(seed, batch, dtype):
    return Spin(), torch.ones(2, 2, dtype=dtype)
'''


class TimingProcessesTest(unittest.TestCase):
    """options.timing_processes: one timing frame per process, each from a
    process of its own (a fork of the template), the capture once."""

    def test_processes_and_their_frames(self):
        spec = util.make_spec("mlp", iterations=3, warmup=1, timing_processes=4)
        spec["cpus"] = sorted(os.sched_getaffinity(0))[-1:]
        r = util.run_runner(spec)
        self.assertEqual(r.status, "ok", r.describe())
        ts = r.kinds("timing")
        self.assertEqual([t["process"] for t in ts], [0, 1, 2, 3])
        self.assertTrue(all(t["processes"] == 4 for t in ts))
        self.assertTrue(all(len(t["samples_ns"]) == 3 for t in ts))
        self.assertTrue(all(t["cpus"] == spec["cpus"] for t in ts),
                        "each timing process is pinned to the CPUs it was given")
        keys = [t["key"] for t in r.tensors]
        self.assertEqual(len(keys), len(set(keys)), "numerics captured once")
        self.assertEqual(r.frames[-1].kind, "end")

    def test_short_iterations_are_timed_in_loops_up_to_timing_min_ms(self):
        # Busy-waits of 1 ms, 3 samples, 20 ms: a sample must last 6.7 ms,
        # so it times 2..7 iterations back to back (7 when the fastest
        # warmup iteration took its 1 ms; fewer only if the host slowed it).
        root = util.tempdir()
        util.write_tree(root, {"spin/__init__.py": "", "spin/m.py": SPIN_MODEL})
        spec = util.make_spec("spin.m:make", model_roots=[root], iterations=3, warmup=3,
                              timing_processes=2, timing_min_ms=20)
        r = util.run_runner(spec)
        self.assertEqual(r.status, "ok", r.describe())
        for t in r.kinds("timing"):
            self.assertEqual((len(t["samples_ns"]), t["iterations"]), (3, 3))
            self.assertTrue(2 <= t["loops"] <= 7, t["loops"])
            self.assertTrue(all(x >= 1000000 for x in t["samples_ns"]), "a sample is the mean")
        # The default (schema/options.json) applies when the spec leaves it out.
        del spec["options"]["timing_min_ms"]
        from capd_runner import spec as specmod
        self.assertEqual(specmod.DEFAULT_OPTIONS["timing_min_ms"], 50)
        r = util.run_runner(spec)
        self.assertEqual(r.status, "ok", r.describe())
        self.assertTrue(all(2 <= t["loops"] <= 17 for t in r.kinds("timing")))
        # 0: one iteration a sample.
        spec["options"]["timing_min_ms"] = 0
        r = util.run_runner(spec)
        self.assertEqual([t["loops"] for t in r.kinds("timing")], [1, 1])
        # Out of range: a spec error that names the option.
        spec["options"]["timing_min_ms"] = 60001
        r = util.run_runner(spec)
        self.assertNotEqual(r.status, "ok")
        self.assertIn("timing_min_ms", r.describe())

    def test_no_iterations_is_one_empty_frame(self):
        r = util.run_runner(util.make_spec("mlp", iterations=0, timing_processes=3))
        self.assertEqual(r.status, "ok", r.describe())
        t = r.one("timing")
        self.assertEqual((t["process"], t["processes"], t["samples_ns"]), (0, 1, []))

    def test_failing_timing_process_fails_the_cell(self):
        root = util.tempdir()
        util.write_tree(root, {"late/__init__.py": "", "late/m.py": '''
import os, torch

class Late(torch.nn.Module):
    def forward(self, x):
        # the capture runs in the cell process, which holds the frame pipe;
        # a timing process does not
        try:
            os.fstat(3)
        except OSError:
            os.kill(os.getpid(), 9)
        return x * 2

def make(seed, batch, dtype):
    return Late(), torch.ones(2, 2, dtype=dtype)
'''})
        spec = util.make_spec("late.m:make", model_roots=[root], iterations=2,
                              timing_processes=2)
        r = util.run_runner(spec)
        self.assertEqual(r.status, "failed", r.describe())
        self.assertIn("timing process 0 of 2", r.end["reason"])
        self.assertEqual(r.kinds("timing"), [])
