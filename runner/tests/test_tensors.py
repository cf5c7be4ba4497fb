"""In-process tests of stats, hashing, raw bytes, samples, widths, specs."""

import hashlib
import math
import unittest

import torch

from capd_runner import capture, spec as specmod, tensors as T, width
from tests import util

try:
    import numpy  # noqa: F401
    HAVE_NUMPY = True
except Exception:
    HAVE_NUMPY = False


def hand_stats(values):
    fin = [v for v in values if math.isfinite(v)]
    n = len(fin)
    out = {"nan": sum(1 for v in values if v != v),
           "pinf": sum(1 for v in values if v == float("inf")),
           "ninf": sum(1 for v in values if v == float("-inf")),
           "zeros": sum(1 for v in values if v == 0)}
    if not n:
        out.update(dict.fromkeys(["min", "max", "mean", "std", "l2"]))
        return out
    mean = math.fsum(fin) / n
    out.update({"min": min(fin), "max": max(fin), "mean": mean,
                "std": math.sqrt(math.fsum((v - mean) ** 2 for v in fin) / n),
                "l2": math.sqrt(math.fsum(v * v for v in fin))})
    return out


class EngineChoice(object):
    """Runs a test class's cases on the torch engine (NATIVE False) or on
    the native library (capd_runner/native.py; its subclasses)."""
    NATIVE = False

    def make(self):
        if self.NATIVE:
            util.require_native(self)
        return T.StatsEngine(use_native=self.NATIVE)


class StatsTest(EngineChoice, unittest.TestCase):
    def setUp(self):
        self.engine = self.make()

    def assertStats(self, got, want, rel=1e-12):
        for k in ("nan", "pinf", "ninf", "zeros"):
            self.assertEqual(got[k], want[k], k)
        for k in ("min", "max", "mean", "std", "l2"):
            if want[k] is None:
                self.assertIsNone(got[k], k)
            else:
                self.assertTrue(math.isclose(got[k], want[k], rel_tol=rel, abs_tol=1e-300),
                                "%s: %r != %r" % (k, got[k], want[k]))

    def test_hand_computed_with_nan_inf(self):
        vals = [1.5, -2.0, 0.0, float("nan"), float("inf"), 3.25, float("-inf"), 0.0, -0.5,
                float("nan")]
        got = self.engine.stats(torch.tensor(vals, dtype=torch.float64))
        self.assertStats(got, hand_stats(vals))
        self.assertEqual((got["nan"], got["pinf"], got["ninf"], got["zeros"]), (2, 1, 1, 2))
        self.assertEqual(got["min"], -2.0)
        self.assertEqual(got["max"], 3.25)
        self.assertAlmostEqual(got["mean"], (1.5 - 2.0 + 3.25 - 0.5) / 6, places=15)

    def test_finite_float32_exact_values(self):
        vals = [0.25, -1.0, 2.0, 0.0, 4.5, -3.75]
        got = self.engine.stats(torch.tensor(vals, dtype=torch.float32).reshape(2, 3))
        self.assertStats(got, hand_stats(vals))
        self.assertEqual(got["zeros"], 1)

    def test_all_nonfinite(self):
        got = self.engine.stats(torch.tensor([float("nan"), float("inf")]))
        self.assertEqual([got[k] for k in ("min", "max", "mean", "std", "l2")], [None] * 5)
        self.assertEqual((got["nan"], got["pinf"]), (1, 1))

    def test_empty(self):
        got = self.engine.stats(torch.zeros(0, 3))
        self.assertIsNone(got["min"])
        self.assertEqual(got["zeros"], 0)

    def test_ints_bools_halfs(self):
        self.assertStats(self.engine.stats(torch.tensor([3, 0, -7, 12], dtype=torch.int64)),
                         hand_stats([3.0, 0.0, -7.0, 12.0]))
        self.assertStats(self.engine.stats(torch.tensor([True, False, True])),
                         hand_stats([1.0, 0.0, 1.0]))
        v = [0.5, -1.25, 0.0, 3.0]
        for dt in (torch.float16, torch.bfloat16):
            self.assertStats(self.engine.stats(torch.tensor(v, dtype=dt)), hand_stats(v))

    def test_large_mean_small_spread(self):
        # E[x^2]-mean^2 would cancel: the centred pass must kick in.
        vals = [1e6 + i * 1e-3 for i in range(1000)]
        got = self.engine.stats(torch.tensor(vals, dtype=torch.float64))
        self.assertStats(got, hand_stats(vals), rel=1e-9)

    def test_chunked(self):
        old = T.CHUNK
        try:
            T.CHUNK = 1000
            g = T.generator(5)
            x = T.det_normalish((4321,), g, torch.float64)
            x[17] = float("nan")
            x[3000] = 0.0
            got = self.make().stats(x)
            self.assertStats(got, hand_stats(x.tolist()), rel=1e-10)
            y = T.det_normalish((4321,), g, torch.float64) + 5
            self.assertStats(self.make().stats(y), hand_stats(y.tolist()), rel=1e-10)
        finally:
            T.CHUNK = old

    def test_noncontiguous_and_complex(self):
        x = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2]
        self.assertStats(self.engine.stats(x), hand_stats(x.contiguous().reshape(-1).tolist()))
        c = torch.tensor([1 + 2j, -3 + 0j], dtype=torch.complex64)
        self.assertStats(self.engine.stats(c), hand_stats([1.0, 2.0, -3.0, 0.0]))


class FusedStatsTest(EngineChoice, unittest.TestCase):
    """The fused StatsEngine against the straightforward implementation it
    replaced (tests/refstats.py): counts, min and max exactly, the rest to
    float64 precision (on torch 1.13 they are bit-identical)."""

    def assertSame(self, got, want, what):
        self.assertEqual(sorted(got), sorted(want), what)
        for k in ("nan", "pinf", "ninf", "zeros"):
            self.assertEqual(got[k], want[k], "%s %s" % (what, k))
            self.assertIs(type(got[k]), int, "%s %s" % (what, k))
        for k in ("min", "max"):
            self.assertEqual(got[k], want[k], "%s %s" % (what, k))
            if want[k] is not None:
                self.assertIs(type(got[k]), float, "%s %s" % (what, k))
        for k in ("mean", "std", "l2"):
            if want[k] is None:
                self.assertIsNone(got[k], "%s %s" % (what, k))
            else:
                self.assertTrue(math.isclose(got[k], want[k], rel_tol=1e-11, abs_tol=1e-300),
                                "%s %s: %r != %r" % (what, k, got[k], want[k]))

    def cases(self):
        g = T.generator(11)
        for n in (1, 2, 7, 1000, 4096, 40000):
            base = T.det_normalish((n,), g, torch.float64) * 3.0
            relu = base.clamp(min=0)
            withbad = base.clone()
            if n >= 7:
                withbad[1] = float("nan")
                withbad[3] = float("inf")
                withbad[5] = float("-inf")
                withbad[6] = 0.0
            for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
                yield "randn %d %s" % (n, dt), base.to(dt)
                yield "relu %d %s" % (n, dt), relu.to(dt)
                yield "nonfinite %d %s" % (n, dt), withbad.to(dt)
                yield "negzero %d %s" % (n, dt), (-relu).to(dt)
            for dt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
                yield "int %d %s" % (n, dt), (base * 20).clamp(-100, 100).to(dt).abs()
                yield "sint %d %s" % (n, dt), (base * 20).clamp(-100, 100).to(dt)
            yield "bool %d" % n, base > 0
        yield "empty", torch.zeros(0, 3)
        yield "empty bf16", torch.zeros(0, dtype=torch.bfloat16)
        yield "constant", torch.full((5000,), 1e6, dtype=torch.float32)
        yield "all zero", torch.zeros(300, dtype=torch.float16)
        yield "all nan", torch.full((9,), float("nan"))
        yield "big", T.det_normalish((4, 1000), g, torch.float32) * 1e30
        yield "tiny", T.det_normalish((1000,), g, torch.float32) * 1e-40  # subnormal float32
        x = T.det_normalish((6, 50, 7), g, torch.float32)
        yield "transposed", x.transpose(0, 2)
        yield "strided", x[:, ::3, 1:]
        yield "expanded", torch.ones(1, 30).expand(40, 30)
        yield "complex", torch.complex(x, -x)

    def test_against_reference(self):
        from tests.refstats import ReferenceStats
        ref, eng = ReferenceStats(), self.make()
        for what, x in self.cases():
            self.assertSame(eng.stats(x), ref.stats(x), what)

    def test_chunked_against_reference(self):
        from tests import refstats
        old, old_ref = T.CHUNK, refstats.CHUNK
        try:
            T.CHUNK = refstats.CHUNK = 1000
            ref, eng = refstats.ReferenceStats(), self.make()
            for what, x in self.cases():
                self.assertSame(eng.stats(x), ref.stats(x), "chunked " + what)
        finally:
            T.CHUNK, refstats.CHUNK = old, old_ref

    def test_scratch_reuse_across_sizes(self):
        eng = self.make()
        from tests.refstats import ReferenceStats
        ref = ReferenceStats()
        g = T.generator(2)
        for n in (10, 5000, 3, 70000, 17, 5000):
            x = T.det_normalish((n,), g, torch.float32)
            self.assertSame(eng.stats(x), ref.stats(x), "n=%d" % n)

    def test_fallbacks(self):
        # The paths for builds where a comparison cannot write a float64 out,
        # aminmax has no out= (or no aminmax at all: torch 1.10).
        saved = (T._NE_FLOAT_OUT, T._AMINMAX_OUT, T._HAS_AMINMAX)
        from tests.refstats import ReferenceStats
        ref = ReferenceStats()
        try:
            for flags in ((False, False, True), (True, False, True), (False, True, True),
                          (True, False, False)):
                T._NE_FLOAT_OUT, T._AMINMAX_OUT, T._HAS_AMINMAX = flags
                eng = self.make()
                for what, x in self.cases():
                    self.assertSame(eng.stats(x), ref.stats(x), "%s %s" % (flags, what))
        finally:
            T._NE_FLOAT_OUT, T._AMINMAX_OUT, T._HAS_AMINMAX = saved


class NativeStatsTest(StatsTest):
    NATIVE = True


class NativeFusedStatsTest(FusedStatsTest):
    """The native library against the same reference: counts, min and max
    exactly, mean/std/l2 to float64 precision."""
    NATIVE = True
    test_fallbacks = None  # torch-engine paths only

    def test_native_is_used_and_independent_of_chunking(self):
        from capd_runner import native
        eng = self.make()
        self.assertTrue(eng.native)
        x = T.det_normalish((3 * T.CHUNK + 5,), T.generator(4), torch.float32)
        self.assertTrue(native.supports(x))
        whole = eng.stats(x)
        # The same bytes give the same bits, whatever the call.
        self.assertEqual(native.stats(x.clone()), whole)
        self.assertFalse(native.supports(x[::2]), "a strided view goes through torch")

    def test_float32_sums_keep_the_lane_order(self):
        """Whatever loop the CPU gets (AVX2 or generic), float32 sums are the
        documented ones: lane i % 8, a double sum and sum of squares each,
        then the lanes in order; min, max and zeros exact, -0.0 included."""
        from capd_runner import native
        for n in (2, 7, 8, 9, 10, 64, 1003):
            x = T.det_normalish((n,), T.generator(n), torch.float32) * 3 + 0.25
            x[::5] = 0.0
            x[1::7] = -0.0
            for t in (x, x[1:].clone()):
                vals = [float(v) for v in t.tolist()]
                s, q = [0.0] * 8, [0.0] * 8
                for i, v in enumerate(vals):
                    s[i % 8] += v
                    q[i % 8] += v * v
                total, sumsq = 0.0, 0.0
                for j in range(8):
                    total += s[j]
                    sumsq += q[j]
                got = native.stats(t)
                self.assertEqual(got["mean"], total / len(vals), n)
                self.assertEqual(got["l2"], math.sqrt(sumsq), n)
                self.assertEqual(got["min"], min(vals), n)
                self.assertEqual(got["max"], max(vals), n)
                self.assertEqual(got["zeros"], sum(1 for v in vals if v == 0), n)


class BytesHashTest(unittest.TestCase):
    def test_raw_bytes_match_struct(self):
        x = torch.tensor([1.0, -2.5, 3.25], dtype=torch.float32)
        self.assertEqual(bytes(T.raw_bytes(x)), util.struct.pack("<3f", 1.0, -2.5, 3.25))
        self.assertEqual(T.content_hash(x), util.blake(util.struct.pack("<3f", 1.0, -2.5, 3.25)))

    def test_bfloat16_bytes_are_int16_view(self):
        x = torch.tensor([1.0, -2.0, 0.5, 3.140625], dtype=torch.bfloat16)
        raw = bytes(T.raw_bytes(x))
        # bfloat16 is the top half of the float32 pattern.
        want = b"".join(util.struct.pack("<I", util.struct.unpack("<I", util.struct.pack("<f", v))[0])[2:]
                        for v in [1.0, -2.0, 0.5, 3.140625])
        self.assertEqual(raw, want)
        if HAVE_NUMPY:
            self.assertEqual(raw, x.view(torch.int16).numpy().tobytes())

    @unittest.skipUnless(HAVE_NUMPY, "numpy not installed")
    def test_all_dtypes_against_numpy(self):
        g = T.generator(3)
        base = T.det_uniform((5, 7), g, 100.0, torch.float64)
        for dt in (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32,
                   torch.int16, torch.int8, torch.uint8, torch.bool):
            x = base.to(dt)
            self.assertEqual(bytes(T.raw_bytes(x)), x.numpy().tobytes(), dt)
            xt = x.t()  # non-contiguous: hash of the C-contiguous copy
            self.assertEqual(T.content_hash(T.cpu_contiguous(xt)),
                             hashlib.blake2b(xt.contiguous().numpy().tobytes(),
                                             digest_size=16).hexdigest())

    def test_offset_view(self):
        x = torch.arange(10, dtype=torch.float64)[3:7]
        self.assertEqual(util.floats(bytes(T.raw_bytes(x)), "float64"), [3.0, 4.0, 5.0, 6.0])

    def test_empty(self):
        self.assertEqual(T.content_hash(torch.zeros(0)), util.blake(b""))


class SampleTest(unittest.TestCase):
    def test_positions(self):
        self.assertEqual(T.sample_positions(10, 4), [0, 2, 5, 7])
        self.assertEqual(T.sample_positions(3, 256), [0, 1, 2])
        self.assertEqual(T.sample_positions(1000, 7), [0, 142, 285, 428, 571, 714, 857])
        self.assertEqual(T.sample_positions(0, 5), [])
        pos = T.sample_positions(10 ** 12 + 7, 256)
        self.assertEqual(len(pos), 256)
        self.assertEqual(pos[255], (255 * (10 ** 12 + 7)) // 256)
        self.assertEqual(sorted(set(pos)), pos)


class DeterministicTest(unittest.TestCase):
    def test_det_uniform(self):
        a = T.det_uniform((1000,), T.generator(1), 0.5)
        b = T.det_uniform((1000,), T.generator(1), 0.5)
        self.assertTrue(torch.equal(a, b))
        self.assertLess(float(a.abs().max()), 0.5)
        # A known value: independent of the build (mt19937 integers, exact arithmetic).
        ints = torch.randint(0, 1 << 24, (3,), generator=T.generator(1), dtype=torch.int64)
        want = [((i + 0.5) * (2.0 / (1 << 24)) - 1.0) for i in ints.tolist()]
        got = T.det_uniform((3,), T.generator(1), 1.0, torch.float64).tolist()
        self.assertEqual(got, want)


class FlattenTest(unittest.TestCase):
    def test_flatten_rebuild(self):
        a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
        obj = (a, [None, {"z": c, "a": b}], "x", 3)
        flat = capture.flatten(obj)
        self.assertEqual([t.numel() for t in flat], [1, 2, 3])  # dict by sorted key
        new = capture.rebuild(obj, iter([t + 1 for t in flat]))
        self.assertEqual(new[2:], ("x", 3))
        self.assertTrue(torch.equal(new[1][1]["z"], c + 1))


class WidthTest(unittest.TestCase):
    def test_normalize(self):
        for raw, want in [("NO AVX", "default"), ("DEFAULT", "default"), ("AVX2", "avx2"),
                          ("AVX512", "avx512"), ("VSX", "vsx"), ("ZVECTOR", "zvector"),
                          ("SVE256", "sve256"), ("avx512", "avx512")]:
            self.assertEqual(width.normalize(raw), want)

    def test_config_line(self):
        class FakeTorch(object):
            pass
        text = "PyTorch built with:\n  - CPU capability usage: NO AVX\n  - Build settings: x\n"
        raw, source = width.raw_capability(FakeTorch(), text)
        if source == "torch.__config__.show":
            self.assertEqual(raw, "NO AVX")
        self.assertEqual(width.normalize(width._LINE.search(text).group(1)), "default")

    def test_host_missing(self):
        avx2_host = {"machine": "x86_64", "flags": ["avx", "avx2", "fma", "sse4_1"]}
        need = ["avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"]
        self.assertEqual(width.host_missing(need, avx2_host),
                         ["avx512f", "avx512bw", "avx512vl", "avx512dq"])
        self.assertEqual(width.host_missing(["avx2", "fma"], avx2_host), [])
        self.assertEqual(width.host_missing([], avx2_host), [])
        # Off x86 the kernel's flag names are not the width's: capd decides.
        self.assertEqual(width.host_missing(["sve", "sve256"],
                                            {"machine": "aarch64", "flags": ["fp", "asimd"]}), [])
        # No flags line read: nothing to say.
        self.assertEqual(width.host_missing(need, {"machine": "x86_64", "flags": []}), [])


class SpecTest(unittest.TestCase):
    def test_width_requires(self):
        base = {"protocol": 1, "model": "mlp", "width": "avx2", "pass": "forward"}
        self.assertEqual(specmod.check(base).width_requires, [])
        s = specmod.check(dict(base, width_requires=["avx2", "fma"]))
        self.assertEqual(s.width_requires, ["avx2", "fma"])
        with self.assertRaises(specmod.SpecError):
            specmod.check(dict(base, width_requires="avx2"))

    def test_defaults_and_errors(self):
        s = specmod.check({"protocol": 1, "model": "mlp", "width": "avx2", "pass": "forward"})
        self.assertEqual((s.iterations, s.capture, s.frame_fd, s.device), (20, "stats", 3, "cpu"))
        bad = [{"protocol": 2, "model": "mlp", "width": "x", "pass": "forward"},
               {"protocol": 1, "model": "mlp", "width": "x", "pass": "sideways"},
               {"protocol": 1, "model": "mlp", "width": "x", "pass": "forward",
                "options": {"capture": "everything"}},
               {"protocol": 1, "model": "mlp", "width": "x", "pass": "forward",
                "options": {"batch": 0}},
               {"protocol": 1, "model": "mlp", "width": "x", "pass": "forward",
                "options": {"iterations": True}},
               {"protocol": 1, "model": "", "width": "x", "pass": "forward"}]
        for raw in bad:
            with self.assertRaises(specmod.SpecError):
                specmod.check(raw)


if __name__ == "__main__":
    unittest.main()
