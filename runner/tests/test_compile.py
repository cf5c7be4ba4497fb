"""Compiled cells (spec "mode": aot_eager, inductor; docs/runner.md,
"Compiled cells (mode)") as real cells. Under a torch without
torch.compile (Debian's 1.13) they end unsupported; under torch 2 (the
official wheel: CAPD_TEST_PYTHON or run this module with its interpreter)
they run, recording the model's inputs, outputs and gradients as the eager
cell's records of the same keys."""

import errno
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor

import torch

from capd_runner import compiled, fingerprint, spec as specmod
from tests import util

HAS_COMPILE = hasattr(torch, "compile")
RUNNER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_COMPILE_WHY = "torch %s has no torch.compile (torch 2.0 or later)" % torch.__version__
AVX2 = {"avx2", "fma"} <= util.cpu_flags()
# As capd sets it for one thread (the official wheel's numpy OpenBLAS would
# start a pool, and the timing processes would be exec'd, not forked).
ENV = {"OPENBLAS_NUM_THREADS": "1"}
TOL = 1e-5
# A user model whose first input requires grad: its grad_input is recorded
# outside the compiled region too.
USER_MODELS = {
    "cmpkg/__init__.py": "",
    "cmpkg/models.py": util.LIN_MODEL + '''
class Two(Lin):
    SIZES = (4, 3)

    def forward(self, x, y):
        return torch.tanh(self.lin(x * 2.0 + y))

def two(seed, batch, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-8, 8, (batch, 4), generator=g).to(dtype).requires_grad_(True)
    return Two(), (x, torch.randint(-8, 8, (batch, 4), generator=g).to(dtype) / 4)
''',
}


def _spec(mode, pass_="forward", model="mlp", width="native", **options):
    opts = {"iterations": 2, "warmup": 1, "timing_processes": 1, "capture": "full"}
    opts.update(options)
    s = util.make_spec(model, width=width, pass_=pass_, **opts)
    if mode is not None:
        s["mode"] = mode
    s["scratch"] = util.tempdir()
    return s


def _env(width="native"):
    env = dict(ENV)
    if width != "native":
        env["ATEN_CPU_CAPABILITY"] = width
    return env


def _run(spec, **kw):
    """util.run, started again where Popen failed with EBADF: run_runner
    (framereader.py) passes the parent's fd 3 to the child, which another
    thread's cell may be closing at that moment (run_many's threads)."""
    for attempt in range(3):
        try:
            return util.run(spec, **kw)
        except OSError as e:
            if e.errno != errno.EBADF or attempt == 2:
                raise


def _run_many(jobs):
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as ex:
        futs = [ex.submit(_run, spec, **kw) for spec, kw in jobs]
        return [f.result() for f in futs]


def _records(r):
    return [t for t in r.tensors if not t["key"].startswith("ref.")]


def _values(t):
    return util.floats(t.payload, t["dtype"])


def _compile_notes(r):
    return [m for m in r.notes("info") if m.startswith("compile_s=")]


def _cache_dir(r, spec):
    """The cell's compile cache directory, from its fingerprint."""
    c = r.one("env")["fingerprint"]["compile"]["cache_dir"]
    assert re.match(r"^<scratch>/capd-compile/[0-9a-f]{12}$", c), c
    return spec["scratch"] + c[len("<scratch>"):]


def _note_fields(msg):
    return dict(w.split("=", 1) for w in msg.split())


# --- the spec ----------------------------------------------------------------------

class SpecModeTest(unittest.TestCase):
    def _check(self, **extra):
        raw = dict(util.make_spec("mlp"), **extra)
        return specmod.check(raw)

    def test_absent_and_null_are_eager(self):
        self.assertEqual(self._check().mode, "eager")
        self.assertEqual(self._check(mode=None).mode, "eager")
        for m in ("eager", "aot_eager", "inductor"):
            self.assertEqual(self._check(mode=m).mode, m)

    def test_anything_else_refused(self):
        for bad in ("", "jit", "Inductor", 3, ["inductor"], {"mode": "eager"}):
            with self.assertRaises(specmod.SpecError) as cm:
                self._check(mode=bad)
            self.assertIn("eager/aot_eager/inductor", str(cm.exception))

    def test_bad_mode_is_a_failed_cell(self):
        r = _run(dict(util.make_spec("mlp"), mode="jit"))
        util.assert_ended(self, r, 1, ["hello", "end"], "failed",
                          "'mode' must be one of eager/aot_eager/inductor", "'jit'")

    def test_eager_fingerprint_has_no_compile(self):
        fp = fingerprint.collect(torch, "", "default", {"type": "cpu"}, mode="eager")
        self.assertNotIn("compile", fp)
        fp = fingerprint.collect(torch, "", "default", {"type": "cpu"})
        self.assertNotIn("compile", fp)

    def test_compile_fingerprint_never_raises(self):
        d = compiled.describe(torch, "inductor", "/nonexistent")
        self.assertEqual(d["mode"], "inductor")
        self.assertEqual(d["available"], HAS_COMPILE)

    def test_cache_dir_in_scratch_per_build(self):
        s = specmod.check(dict(util.make_spec("mlp"), mode="aot_eager",
                               scratch="/x/scratch/c1-1"))
        d = compiled.cache_dir(s, torch)
        self.assertTrue(d.startswith("/x/scratch/c1-1/capd-compile/"), d)
        self.assertEqual(os.path.basename(d), compiled.build_key(torch))
        self.assertTrue(re.match(r"^[0-9a-f]{12}$", compiled.build_key(torch)))


# --- eager cells are unchanged -------------------------------------------------------

class EagerUnchangedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.results = _run_many([(_spec(m, "backward"), {"env": _env()})
                                     for m in (None, "eager")])

    def test_same_records_no_compile_traces(self):
        a, b = self.results
        for r in (a, b):
            self.assertEqual(r.status, "ok", r.describe())
            self.assertNotIn("compile", r.one("env")["fingerprint"])
            self.assertEqual(_compile_notes(r), [])
            for t in r.kinds("timing"):
                self.assertNotIn("compile_ns", t.header)
            fp = r.one("env")["fingerprint"]
            self.assertNotIn("TORCHINDUCTOR_CACHE_DIR", fp["env_per_cell"])
        self.assertEqual([(t.header, t.payload) for t in a.tensors],
                         [(t.header, t.payload) for t in b.tensors])
        # every module's records, as ever
        self.assertIn("fc1.0.forward.output.0", [t["key"] for t in a.tensors])


# --- a torch without torch.compile ------------------------------------------------

@unittest.skipIf(HAS_COMPILE, "torch %s has torch.compile" % torch.__version__)
class NoCompileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.modes = ("aot_eager", "inductor")
        cls.results = _run_many([(_spec(m, p), {"env": _env()})
                                     for m in cls.modes for p in ("forward", "backward")])

    def test_unsupported_with_the_reason(self):
        for i, r in enumerate(self.results):
            mode = self.modes[i // 2]
            self.assertEqual(r.returncode, 0, r.describe())
            self.assertEqual([f.kind for f in r.frames], ["hello", "env", "end"])
            self.assertEqual(r.status, "unsupported")
            self.assertEqual(r.end["reason"],
                             "mode %s needs torch.compile (torch 2.0 or later); this is torch %s"
                             % (mode, torch.__version__))
            c = r.one("env")["fingerprint"]["compile"]
            self.assertEqual(c["mode"], mode)
            self.assertFalse(c["available"])
            self.assertEqual(c["unsupported"], r.end["reason"])


# --- torch 2: refusals, aot_eager, inductor --------------------------------------

@unittest.skipUnless(HAS_COMPILE, NO_COMPILE_WHY)
class RefusedTest(unittest.TestCase):
    """What a compiled cell does not do: refused before anything compiles."""

    @classmethod
    def setUpClass(cls):
        cls.results = _run_many([
            (_spec("aot_eager", granularity="op"), {"env": _env()}),
            (_spec("inductor", device="gpu"), {"env": _env()}),
            (_spec("aot_eager", target_op="fc1.0.forward"), {"env": _env()}),
        ])

    def _unsupported(self, r, *words):
        self.assertEqual(r.returncode, 0, r.describe())
        self.assertEqual(r.status, "unsupported", r.describe())
        self.assertEqual([f.kind for f in r.frames], ["hello", "env", "end"])
        for w in words:
            self.assertIn(w, r.end["reason"])
        self.assertEqual(r.one("env")["fingerprint"]["compile"]["unsupported"], r.end["reason"])

    def test_granularity_op(self):
        self._unsupported(self.results[0], "mode aot_eager", "granularity op",
                          "not defined under torch.compile")

    def test_gpu(self):
        self._unsupported(self.results[1], "mode inductor runs on the CPU only",
                          "device is gpu")

    def test_target_op(self):
        self._unsupported(self.results[2], "target_op")


@unittest.skipUnless(HAS_COMPILE, NO_COMPILE_WHY)
class AotEagerTest(unittest.TestCase):
    """aot_eager forward and backward beside the eager cells of the same
    model, width and pass."""

    @classmethod
    def setUpClass(cls):
        cls.specs = {}
        jobs = []
        for mode in ("eager", "aot_eager"):
            for p in ("forward", "backward"):
                extra = {"reference": "float64"} if (mode, p) == ("aot_eager", "backward") else {}
                s = _spec(mode, p, **extra)
                cls.specs[(mode, p)] = s
                jobs.append((s, {"env": _env()}))
        root = util.model_tree(USER_MODELS)
        for mode in ("eager", "aot_eager"):
            s = _spec(mode, "backward", model="cmpkg.models:two")
            s["model_roots"] = [root]
            cls.specs[(mode, "user")] = s
            jobs.append((s, {"env": _env()}))
        got = _run_many(jobs)
        cls.results = dict(zip([(m, p) for m in ("eager", "aot_eager")
                                for p in ("forward", "backward")]
                               + [("eager", "user"), ("aot_eager", "user")], got))

    def test_ok(self):
        for k, r in self.results.items():
            self.assertEqual(r.status, "ok", "%s: %s" % (k, r.describe()))
            self.assertEqual(r.one("nondeterministic")["keys"], [], k)

    def _pair(self, p):
        return self.results[("eager", p)], self.results[("aot_eager", p)]

    def test_keys_are_the_eager_cells_outside_the_model(self):
        for p in ("forward", "backward", "user"):
            eager, comp = self._pair(p)
            want = [t["key"] for t in eager.tensors
                    if t["module"] == "model" or t["role"] in ("param", "param_grad")]
            got = [t["key"] for t in _records(comp)]
            self.assertEqual(got, want, p)
            self.assertIn("model.0.forward.input.0", got)
            self.assertIn("model.0.forward.output.0", got)
            if p == "backward":
                self.assertIn("model.0.backward.grad_output.0", got)
                self.assertIn("fc1.0.backward.param_grad.weight", got)
            if p == "user":  # x requires grad, y does not
                self.assertIn("model.0.backward.grad_input.0", got)
                self.assertNotIn("model.0.backward.grad_input.1", got)
                self.assertIn("lin.0.backward.param_grad.weight", got)

    def test_no_inner_module_records(self):
        for p in ("forward", "backward", "user"):
            for t in _records(self._pair(p)[1]):
                if t["role"] not in ("param", "param_grad"):
                    self.assertEqual(t["module"], "model", t["key"])

    def test_headers_and_values_match_eager(self):
        fields = ("module", "call", "phase", "role", "index", "dtype", "shape", "numel",
                  "capture", "hash_alg", "nbytes")
        for p in ("forward", "backward", "user"):
            eager, comp = self._pair(p)
            by_key = dict((t["key"], t) for t in eager.tensors)
            for t in _records(comp):
                e = by_key[t["key"]]
                for f in fields:
                    self.assertEqual(t.get(f), e.get(f), "%s %s" % (t["key"], f))
                a, b = _values(t), _values(e)
                self.assertEqual(len(a), len(b))
                worst = max([abs(x - y) for x, y in zip(a, b)] or [0.0])
                self.assertLessEqual(worst, TOL,
                                     "%s: max |compiled - eager| %g" % (t["key"], worst))
                self.assertEqual(util.record_hash(t.header, t.payload), t["hash"])
                for s in ("min", "max", "mean", "l2"):
                    self.assertAlmostEqual(t["stats"][s], e["stats"][s], delta=1e-4 * max(
                        1.0, abs(e["stats"][s])))

    def test_reference_run_records_the_same_keys(self):
        comp = self.results[("aot_eager", "backward")]
        own = [t["key"] for t in _records(comp) if t["phase"] != "init"]
        ref = [t["key"] for t in comp.tensors if t["key"].startswith("ref.float64/")]
        self.assertEqual(ref, ["ref.float64/" + k for k in own])
        self.assertTrue(all(t["dtype"] == "float64" for t in comp.tensors
                            if t["key"].startswith("ref.")))

    def test_compile_time_record(self):
        for p in ("forward", "backward"):
            eager, comp = self._pair(p)
            self.assertEqual(_compile_notes(eager), [])
            notes = _compile_notes(comp)
            self.assertEqual(len(notes), 1, comp.notes())
            f = _note_fields(notes[0])
            self.assertGreater(float(f["compile_s"]), 0)
            self.assertEqual((f["mode"], f["backend"], f["pass"]), ("aot_eager", "aot_eager", p))
            # before the forward records, after the init ones
            kinds = [(fr.kind, fr.get("phase")) for fr in comp.frames
                     if fr.kind == "tensor" or (fr.kind == "note" and fr["message"] == notes[0])]
            at = kinds.index(("note", None))
            self.assertTrue(all(ph == "init" for _k, ph in kinds[:at]))
            self.assertEqual(kinds[at + 1], ("tensor", "forward"))

    def test_timing_processes_compile_outside_the_samples(self):
        for p in ("forward", "backward"):
            eager, comp = self._pair(p)
            t = comp.one("timing")
            self.assertEqual(t["start"], "fork", comp.describe())
            self.assertIsInstance(t["compile_ns"], int)
            self.assertGreater(t["compile_ns"], 0)
            self.assertEqual(len(t["samples_ns"]), 2)
            self.assertNotIn("compile_ns", eager.one("timing").header)

    def test_fingerprint_and_cache_in_scratch(self):
        eager, comp = self._pair("forward")
        self.assertNotIn("compile", eager.one("env")["fingerprint"])
        fp = comp.one("env")["fingerprint"]
        c = fp["compile"]
        self.assertEqual((c["mode"], c["backend"], c["dynamic"], c["available"]),
                         ("aot_eager", "aot_eager", False, True))
        self.assertNotIn("unsupported", c)
        self.assertNotIn("vec_isa", c)  # no Inductor in aot_eager
        d = _cache_dir(comp, self.specs[("aot_eager", "forward")])
        for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            self.assertIn(name, fp["env_per_cell"])
            self.assertNotIn(name, fp["env"])
        for sub in ("inductor", "triton"):
            self.assertTrue(os.path.isdir(os.path.join(d, sub)), d)


@unittest.skipUnless(HAS_COMPILE, NO_COMPILE_WHY)
@unittest.skipUnless(AVX2, "this host's CPU lacks AVX2")
class InductorTest(unittest.TestCase):
    """One inductor forward cell at width avx2 (each compile costs seconds),
    beside the eager cell."""

    @classmethod
    def setUpClass(cls):
        cls.spec = _spec("inductor", width="avx2")
        cls.eager, cls.r = _run_many([(_spec("eager", width="avx2"), {"env": _env("avx2")}),
                                          (cls.spec, {"env": _env("avx2")})])

    def test_ok_root_records_close_to_eager(self):
        r = self.r
        self.assertEqual(r.status, "ok", r.describe())
        self.assertEqual(r.one("env")["effective_width"], "avx2")
        by_key = dict((t["key"], t) for t in self.eager.tensors)
        keys = [t["key"] for t in r.tensors]
        self.assertEqual(keys, [k for k in by_key if k.split(".")[0] == "model"
                                or ".init.param." in k])
        for t in r.tensors:
            a, b = _values(t), _values(by_key[t["key"]])
            worst = max([abs(x - y) for x, y in zip(a, b)] or [0.0])
            self.assertLessEqual(worst, 1e-4, t["key"])

    def test_fingerprint_names_the_isa(self):
        fp = self.r.one("env")["fingerprint"]
        c = fp["compile"]
        self.assertEqual((c["mode"], c["backend"]), ("inductor", "inductor"))
        self.assertEqual(c["vec_isa"], "avx2")
        self.assertEqual(c["isa"], "avx2")
        self.assertIn("ATEN_CPU_CAPABILITY=avx2", c["vec_isa_source"])
        self.assertTrue(c["cxx"]["works"], c["cxx"])
        self.assertTrue(c["cxx"]["path"] and os.path.isabs(c["cxx"]["path"]), c["cxx"])
        self.assertTrue(c["cxx"]["version"], c["cxx"])
        for k in ("fx_graph_cache", "freezing", "cpp.simdlen"):
            self.assertIn(k, c["config"])
        self.assertEqual(c["config"].get("compile_threads"), 1)
        # the libraries' read-back saw Inductor's ISA (held to the width's ceiling)
        ind = fp["libraries"]["inductor"]
        self.assertTrue(ind["read"], ind)
        self.assertEqual(ind["isa"], "avx2")

    def test_compile_note_and_timing(self):
        notes = _compile_notes(self.r)
        self.assertEqual(len(notes), 1, self.r.notes())
        f = _note_fields(notes[0])
        self.assertEqual((f["mode"], f["backend"], f["pass"]), ("inductor", "inductor", "forward"))
        self.assertGreater(float(f["compile_s"]), 0)
        t = self.r.one("timing")
        self.assertGreater(t["compile_ns"], 0)

    def test_cache_inside_scratch(self):
        d = _cache_dir(self.r, self.spec)
        files = sum(len(fs) for _r, _d, fs in os.walk(os.path.join(d, "inductor")))
        self.assertGreater(files, 0, "Inductor wrote nothing under %s" % d)


@unittest.skipUnless(HAS_COMPILE, NO_COMPILE_WHY)
@unittest.skipUnless({"avx512f", "avx512bw"} <= util.cpu_flags(), "this host's CPU lacks AVX-512")
class HoldIsaTest(unittest.TestCase):
    """Inductor held to width avx512 (compiled.hold_isa), in a fresh
    interpreter (the hold changes a per-process cache): no AMX in its pick,
    and on a host with AMX the AMX ISA named as taken out."""

    def _pick(self, width):
        code = ("import json, types, torch\n"
                "from capd_runner import compiled\n"
                "held = compiled.hold_isa(types.SimpleNamespace(width=%r))\n"
                "print(json.dumps([held, compiled._vec_isa_text()]))\n" % width)
        env = dict(os.environ, ATEN_CPU_CAPABILITY="avx512", PYTHONPATH=RUNNER_DIR,
                   TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="capd-test-isa-"), **ENV)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def test_avx512_picks_no_amx(self):
        held, pick = self._pick("avx512")
        self.assertNotIn("amx", pick)
        self.assertTrue(pick.startswith("avx512"), pick)
        if "amx_tile" in util.cpu_flags():
            self.assertEqual(len(held), 1, held)
            self.assertIn("amx_tile", held[0])
        else:
            self.assertEqual(held, [])

    def test_other_widths_hold_nothing(self):
        held, _pick = self._pick("amx")
        self.assertEqual(held, [])


if __name__ == "__main__":
    unittest.main()
