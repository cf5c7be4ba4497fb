"""What the libraries ran (capd_runner/libs.py): the mappings to levels, the
width's ceiling and its reason, the fd-1 capture, the spec's width fields,
and the read-back in both framework builds' interpreters."""

import json
import os
import subprocess
import sys
import unittest

from capd_runner import libs
from capd_runner import spec as specmod
from tests import util
from tests.framereader import RUNNER_DIR

OFFICIAL = os.environ.get("CAPD_OFFICIAL_PYTHON", "/var/cache/capd/official-torch/bin/python")
DEBIAN = os.environ.get("CAPD_TEST_PYTHON", "/usr/bin/python3")
# A directory holding OpenBLAS's libblas.so.3 (Debian's openblas-pthread),
# put first on LD_LIBRARY_PATH so that Debian's torch loads it.
OPENBLAS_DIR = os.environ.get("CAPD_TEST_OPENBLAS_DIR",
                              "/usr/lib/x86_64-linux-gnu/openblas-pthread")

READ = ("import json, sys, torch\n"
        "from capd_runner import libs\n"
        "print('before')\n"
        "r = libs.read(torch)\n"
        "w = libs.ceiling(r, sys.argv[1] if len(sys.argv) > 1 else None)\n"
        "print('after')\n"
        "sys.stdout.flush()\n"
        "why = libs.reason(sys.argv[2], sys.argv[1], w) if w else None\n"
        "sys.stderr.write(json.dumps({'libraries': r, 'reason': why}))\n")


def _read_in(python, env=None, width_isa=None, width="w"):
    """libs.read in a fresh PYTHON with ENV added: (its output, stdout)."""
    child = {"PATH": "/usr/bin:/bin", "PYTHONPATH": RUNNER_DIR, "LANG": "C.UTF-8",
             "OMP_NUM_THREADS": "1"}
    child.update(env or {})
    args = [python, "-c", READ] + ([width_isa, width] if width_isa else [])
    p = subprocess.run(args, env=child, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=300)
    if p.returncode != 0:
        raise AssertionError("%s failed (%d): %s" % (python, p.returncode, p.stderr[-3000:]))
    err = p.stderr.decode("utf-8", "replace")
    return json.loads(err[err.rindex('{"libraries"'):]), p.stdout.decode("utf-8", "replace")


def _has_torch(python):
    if not os.path.exists(python):
        return False
    try:
        return subprocess.run([python, "-c", "import torch"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=300).returncode == 0
    except Exception:
        return False


class LevelTest(unittest.TestCase):
    def test_order(self):
        self.assertEqual(libs.LEVELS[0], "sse2")
        self.assertEqual(libs.LEVELS[-1], "amx")
        self.assertTrue(libs.above("avx512", "avx2"))
        self.assertTrue(libs.above("amx", "avx512_fp16"))
        self.assertFalse(libs.above("avx2", "avx2"))
        self.assertFalse(libs.above("sse4_1", "sse4_2"))

    def test_unknown_is_never_above(self):
        self.assertFalse(libs.above(None, "avx2"))
        self.assertFalse(libs.above("avx512", None))
        self.assertFalse(libs.above("neon", "avx2"))


class MKLTest(unittest.TestCase):
    def test_branch_names(self):
        self.assertEqual(libs.mkl_branch_name(1), "OFF")
        self.assertEqual(libs.mkl_branch_name(10), "AVX2")
        self.assertEqual(libs.mkl_branch_name(14), "AVX512_E1")
        self.assertEqual(libs.mkl_branch_name(15), "code 15")
        self.assertIsNone(libs.mkl_branch_name(None))

    def test_levels(self):
        want = {3: "sse2", 4: "sse2", 6: "sse4_1", 7: "sse4_1", 8: "sse4_2", 9: "avx",
                10: "avx2", 11: "avx512", 12: "avx512", 13: "avx512_vnni", 14: "avx512_vnni"}
        for code, level in want.items():
            self.assertEqual(libs.mkl_level(code), level, code)
        for code in (1, 2, 5, 15, None):
            self.assertIsNone(libs.mkl_level(code), code)

    def test_effective_branch(self):
        # As read on the official wheel (MKL 2024.2) on an AMX host.
        self.assertEqual(libs.mkl_effective(10, 14), 10)  # MKL_CBWR=AVX2,STRICT
        self.assertEqual(libs.mkl_effective(1, 8), 8)     # MKL_ENABLE_INSTRUCTIONS=SSE4_2
        self.assertEqual(libs.mkl_effective(12, 14), 12)  # MKL_CBWR=AVX512
        self.assertEqual(libs.mkl_effective(1, 14), 14)   # nothing set
        self.assertEqual(libs.mkl_effective(2, 8), 8)     # AVX2 under SSE4_2: AUTO
        self.assertEqual(libs.mkl_effective(3, 14), 3)    # COMPATIBLE


class MapTest(unittest.TestCase):
    # Every ISA line oneDNN 2.6.3 (Debian) and 3.12.0 (the wheel) printed for
    # each ONEDNN_MAX_CPU_ISA on an AMX host.
    ONEDNN = [
        ("Intel SSE4.1", "sse4_1"),
        ("Intel AVX", "avx"),
        ("Intel AVX2", "avx2"),
        ("Intel AVX2 with Intel DL Boost", "avx2_vnni"),
        ("Intel AVX2 with Intel DL Boost, float16 and bfloat16 support", "avx2_vnni"),
        ("Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions", "avx512"),
        ("Intel AVX-512 with Intel DL Boost", "avx512_vnni"),
        ("Intel AVX-512 with Intel DL Boost and bfloat16 support", "avx512_bf16"),
        ("Intel AVX-512 with float16, Intel DL Boost and bfloat16 support", "avx512_fp16"),
        ("Intel AVX 10.1", "avx512_fp16"),
        ("Intel AVX10.1/512 with float16, Intel DL Boost and bfloat16 support", "avx512_fp16"),
        ("Intel AVX-512 with Intel DL Boost and bfloat16 support and Intel AMX with bfloat16 "
         "and 8-bit integer support", "amx"),
        ("Intel AVX10.1 and Intel AMX with bfloat16 and 8-bit integer support", "amx"),
        ("AArch64 SVE (256 bits)", None),
        ("", None),
        (None, None),
    ]

    def test_onednn_text(self):
        for text, level in self.ONEDNN:
            self.assertEqual(libs.onednn_level(text), level, text)

    def test_openblas_cores(self):
        want = {"Prescott": "sse4_1", "Core2": "sse4_1", "Penryn": "sse4_1",
                "Nehalem": "sse4_2", "Sandybridge": "avx", "Haswell": "avx2", "Zen": "avx2",
                "SkylakeX": "avx512", "Cooperlake": "avx512_bf16",
                "SapphireRapids": "amx", "skylakex": "avx512", "ARMV8": None, "": None}
        for core, level in want.items():
            self.assertEqual(libs.openblas_level(core), level, core)

    def test_blis_arches(self):
        self.assertEqual(libs.blis_level("haswell"), "avx2")
        self.assertEqual(libs.blis_level("skx"), "avx512")
        self.assertIsNone(libs.blis_level("cortexa57"))

    def test_inductor_vec_isa(self):
        want = {"avx512 avx512_vnni amx_tile": "amx", "avx512 avx512_vnni": "avx512_vnni",
                "avx512": "avx512", "avx2": "avx2", "INVALID_VEC_ISA": None, "neon": None}
        for text, level in want.items():
            self.assertEqual(libs.inductor_level(text), level, text)

    def test_library_by_name(self):
        d = "/usr/lib/x86_64-linux-gnu/"
        self.assertEqual(libs.kind_of(d + "blas/libblas.so.3.11.0"), "reference")
        self.assertEqual(libs.kind_of(d + "lapack/liblapack.so.3.11.0"), "reference")
        self.assertEqual(libs.kind_of(d + "openblas-pthread/libblas.so.3"), "openblas")
        self.assertEqual(libs.kind_of(d + "blis-pthread/libblas.so.3"), "blis")
        self.assertEqual(libs.kind_of("/opt/intel/lib/libmkl_rt.so.2"), "mkl")
        self.assertEqual(libs.kind_of(d + "atlas/libblas.so.3"), "unknown")


def _mkl(branch, level, source):
    return {"blas": {"library": "mkl", "branch": branch, "isa": level, "has_width": True,
                     "source": source},
            "onednn": {"available": True, "isa": "avx2", "source": "onednn_verbose isa"},
            "inductor": {"available": True, "isa": None, "read": False}}


class CeilingTest(unittest.TestCase):
    def test_reason_names_library_level_source_and_width(self):
        lib = _mkl("AVX512", "avx512", "mkl_serv_cbwr_get: AVX512; MKL_CBWR=AVX512")
        wider = libs.ceiling(lib, "avx2")
        self.assertEqual([w["library"] for w in wider], ["MKL"])
        self.assertEqual(libs.reason("avx2", "avx2", wider),
                         "width avx2 allows instructions up to avx2, but MKL ran its AVX512 "
                         "branch (mkl_serv_cbwr_get: AVX512; MKL_CBWR=AVX512)")
        self.assertEqual(lib["ceiling"], {
            "width_isa": "avx2", "unread": [],
            "wider": [{"library": "MKL", "isa": "avx512",
                       "source": "mkl_serv_cbwr_get: AVX512; MKL_CBWR=AVX512"}]})

    def test_every_offender_listed(self):
        lib = _mkl("AVX512_E1", "avx512_vnni", "s1")
        lib["onednn"].update(isa="amx", source="s2")
        lib["inductor"].update(isa="amx", read=True, source="s3")
        wider = libs.ceiling(lib, "avx512")
        self.assertEqual([w["library"] for w in wider], ["MKL", "oneDNN", "Inductor"])
        self.assertEqual(libs.reason("avx512", "avx512", wider),
                         "width avx512 allows instructions up to avx512, but MKL ran its "
                         "AVX512_E1 branch, avx512_vnni (s1); oneDNN dispatches up to amx (s2); "
                         "Inductor vectorises for amx (s3)")

    def test_openblas_kernels(self):
        lib = {"blas": {"library": "openblas", "branch": "SkylakeX", "isa": "avx512",
                        "source": "openblas_get_corename: SkylakeX; OPENBLAS_CORETYPE=SkylakeX"}}
        wider = libs.ceiling(lib, "avx2")
        self.assertIn("OpenBLAS ran its SkylakeX kernels, avx512 (openblas_get_corename",
                      libs.reason("avx2", "avx2", wider))

    def test_at_or_below_the_ceiling_and_no_ceiling(self):
        lib = _mkl("AVX2", "avx2", "s")
        self.assertEqual(libs.ceiling(lib, "avx2"), [])
        self.assertEqual(libs.ceiling(lib, "amx"), [])
        lib["onednn"]["isa"] = "amx"
        self.assertEqual(libs.ceiling(lib, None), [])  # native
        self.assertEqual(lib["ceiling"]["width_isa"], None)
        self.assertEqual(lib["ceiling"]["wider"], [])

    def test_unread_libraries_listed(self):
        lib = {"blas": {"library": "blis", "has_width": True, "isa": None},
               "onednn": {"available": True, "isa": None}}
        self.assertEqual(libs.ceiling(lib, "avx2"), [])
        self.assertEqual(lib["ceiling"]["unread"], ["BLIS", "oneDNN"])
        ref = {"blas": {"library": "reference", "has_width": False, "isa": None},
               "onednn": {"available": False, "isa": None}}
        libs.ceiling(ref, "avx2")
        self.assertEqual(ref["ceiling"]["unread"], [])


class CaptureTest(unittest.TestCase):
    def _fd1(self):
        st = os.fstat(1)
        return st.st_dev, st.st_ino

    def test_captures_and_restores(self):
        before = self._fd1()
        data, exc = libs.capture_fd1(lambda: os.write(1, b"to the file\n"))
        self.assertEqual(data, b"to the file\n")
        self.assertIsNone(exc)
        self.assertEqual(self._fd1(), before)

    def test_restores_on_exception(self):
        before = self._fd1()

        def boom():
            os.write(1, b"partial\n")
            raise RuntimeError("in the probe")

        data, exc = libs.capture_fd1(boom)
        self.assertEqual(data, b"partial\n")
        self.assertIsInstance(exc, RuntimeError)
        self.assertEqual(self._fd1(), before)

    def test_c_stdio_flushed_into_the_file(self):
        import ctypes
        libc = ctypes.CDLL(None)
        data, _exc = libs.capture_fd1(lambda: libc.printf(b"from printf\n"))
        self.assertEqual(data, b"from printf\n")


class InProcessTest(unittest.TestCase):
    def test_read_never_raises_and_has_every_part(self):
        import torch
        r = libs.read(torch)
        self.assertEqual(sorted(r), ["blas", "inductor", "lapack", "onednn"])
        self.assertIn(r["blas"]["library"], ("mkl", "openblas", "blis", "reference", "unknown"))
        again = libs.read(torch)  # oneDNN's header is printed once a process
        self.assertEqual(again["onednn"]["isa"], r["onednn"]["isa"])

    def test_a_failing_part_is_recorded(self):
        class Broken(object):
            __version__ = "0"
            _C = None

            class backends(object):
                mkldnn = None

            class __config__(object):
                @staticmethod
                def show():
                    raise RuntimeError("no config")

        r = libs.read(Broken)
        self.assertIn("reason", r["onednn"])
        self.assertIsNone(r["onednn"]["isa"])
        self.assertFalse(r["inductor"]["read"])
        self.assertIn(r["blas"]["library"], ("unknown", "reference", "mkl", "openblas", "blis"))

    def test_inductor_not_probed_in_an_eager_cell(self):
        import torch
        r = libs.read_inductor(torch)
        self.assertFalse(r["read"])
        self.assertIsNone(r["isa"])
        self.assertIn("eager cell", r["reason"])


class SpecFieldsTest(unittest.TestCase):
    def _spec(self, **kw):
        return dict(util.make_spec("mlp", width="amx"), **kw)

    def test_absent_and_null(self):
        s = specmod.check(util.make_spec("mlp", width="avx2"))
        self.assertIsNone(s.width_isa)
        self.assertIsNone(s.width_effective)
        self.assertEqual(specmod.expected_capability(s), "avx2")
        s = specmod.check(self._spec(width_isa=None, width_effective=None))
        self.assertEqual(specmod.expected_capability(s), "amx")

    def test_values(self):
        s = specmod.check(self._spec(width_isa="amx", width_effective="avx512"))
        self.assertEqual(s.width_isa, "amx")
        self.assertEqual(specmod.expected_capability(s), "avx512")
        native = specmod.check(dict(util.make_spec("mlp", width="native"), width_isa=None))
        self.assertIsNone(specmod.expected_capability(native))

    def test_refused(self):
        for field, bad in (("width_isa", 3), ("width_isa", ""), ("width_isa", "avx3"),
                           ("width_effective", ["avx2"]), ("width_effective", "")):
            with self.assertRaises(specmod.SpecError) as cm:
                specmod.check(self._spec(**{field: bad}))
            self.assertIn(field, str(cm.exception))

    def test_width_table_rows(self):
        row = specmod.width_row("avx2")
        if not row:
            self.skipTest("no schema/widths.json beside the runner")
        self.assertEqual(row.get("isa"), "avx2")
        self.assertEqual(specmod.width_row("no-such-width"), {})


INTEL = libs.cpu_vendor() == "GenuineIntel"


@unittest.skipUnless("avx2" in util.cpu_flags(), "the host has no AVX2")
class OfficialBuildTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not _has_torch(OFFICIAL):
            raise unittest.SkipTest("no official build at %s (CAPD_OFFICIAL_PYTHON; "
                                    "scripts/official-torch.sh makes it)" % OFFICIAL)

    def test_avx2_width_reads_back_avx2(self):
        out, stdout = _read_in(OFFICIAL, {"MKL_CBWR": "AVX2,STRICT", "MKL_ENABLE_INSTRUCTIONS":
                                          "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "avx2", "avx2")
        blas = out["libraries"]["blas"]
        self.assertEqual(blas["library"], "mkl", blas)
        self.assertTrue(blas["path"].endswith("(static)"), blas)
        if not INTEL:
            # MKL keeps its own path and does not say which: unread, said so
            self.assertEqual((blas["branch"], blas["isa"], blas["cbwr"]),
                             ("AUTO", None, "AUTO"), blas)
            self.assertIn("on Intel CPUs only: on this %s CPU" % libs.cpu_vendor(),
                          blas["reason"])
            self.assertEqual(out["libraries"]["ceiling"]["unread"], ["MKL"])
        else:
            self.assertEqual((blas["branch"], blas["isa"], blas["cbwr"], blas["strict"]),
                             ("AVX2", "avx2", "AVX2", True))
            self.assertNotIn("reason", blas)
        self.assertIn("Math Kernel Library", blas["version"])
        self.assertEqual(out["libraries"]["lapack"]["library"], "mkl")
        onednn = out["libraries"]["onednn"]
        self.assertEqual((onednn["isa"], onednn["isa_text"]), ("avx2", "Intel AVX2"))
        self.assertIsNone(out["reason"])
        # Nothing of oneDNN's verbose output reaches stdout; the rest does.
        self.assertEqual(stdout, "before\nafter\n")

    def test_mkl_above_the_width(self):
        out, _ = _read_in(OFFICIAL, {"MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX2"},
                          "avx2", "avx2")
        blas = out["libraries"]["blas"]
        if blas["cbwr"] != "AVX512":
            self.skipTest("MKL did not take the AVX512 branch here: %s" % blas)
        self.assertEqual(out["reason"], "width avx2 allows instructions up to avx2, but MKL "
                         "ran its AVX512 branch (mkl_serv_cbwr_get: AVX512; MKL_CBWR=AVX512)")
        self.assertEqual(out["libraries"]["ceiling"]["wider"][0]["library"], "MKL")

    @unittest.skipUnless(INTEL, "MKL takes MKL_CBWR branches on Intel CPUs only: nothing "
                         "makes it run wider than a width on this one")
    def test_cell_ends_unsupported(self):
        spec = dict(util.make_spec("mlp", width="avx2", iterations=0, warmup=0),
                    width_isa="avx2", width_effective="avx2")
        env = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
               "MKL_CBWR": "AVX2,STRICT", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
        ok = util.run(spec, env=env, python=OFFICIAL)
        self.assertEqual(ok.status, "ok", ok.describe())
        blas = ok.one("env")["fingerprint"]["libraries"]["blas"]
        self.assertEqual((blas["library"], blas["branch"]), ("mkl", "AVX2"))
        # Under MKL_ENABLE_INSTRUCTIONS=AVX2, MKL_CBWR=AVX512 falls back to
        # AUTO (AVX2): only without the cap does MKL run wider.
        capped = util.run(spec, env=dict(env, MKL_CBWR="AVX512"), python=OFFICIAL)
        self.assertEqual(capped.status, "ok", capped.describe())
        del env["MKL_ENABLE_INSTRUCTIONS"]
        bad = util.run(spec, env=dict(env, MKL_CBWR="AVX512"), python=OFFICIAL)
        self.assertEqual(bad.status, "unsupported", bad.describe())
        self.assertEqual(bad.end["reason"], "width avx2 allows instructions up to avx2, but MKL "
                         "ran its AVX512 branch (mkl_serv_cbwr_get: AVX512; MKL_CBWR=AVX512)")

    @unittest.skipUnless(INTEL, "MKL takes MKL_CBWR and MKL_ENABLE_INSTRUCTIONS on Intel CPUs "
                         "only")
    def test_conflicting_mkl_variables_read_as_mkl_ran_them(self):
        out, _ = _read_in(OFFICIAL, {"MKL_CBWR": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"})
        blas = out["libraries"]["blas"]
        self.assertEqual((blas["cbwr"], blas["branch"], blas["isa"]),
                         ("AUTO", "SSE4_2", "sse4_2"), blas)


class DebianBuildTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not _has_torch(DEBIAN):
            raise unittest.SkipTest("no torch in %s" % DEBIAN)

    @unittest.skipUnless("avx2" in util.cpu_flags(), "the host has no AVX2")
    def test_onednn_cap_read_back(self):
        out, stdout = _read_in(DEBIAN, {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"},
                               "avx2", "avx2")
        onednn = out["libraries"]["onednn"]
        self.assertEqual(onednn["isa"], "avx2", onednn)
        self.assertIn("ONEDNN_MAX_CPU_ISA=AVX2", onednn["source"])
        self.assertEqual(stdout, "before\nafter\n")
        blas = out["libraries"]["blas"]
        if blas["library"] == "reference":
            self.assertFalse(blas["has_width"])
            self.assertIsNone(blas["isa"])
        self.assertTrue(blas["path"], blas)

    def test_sse41_cap(self):
        out, _ = _read_in(DEBIAN, {"ONEDNN_MAX_CPU_ISA": "SSE41", "DNNL_MAX_CPU_ISA": "SSE41"},
                          "sse4_2", "default")
        self.assertEqual(out["libraries"]["onednn"]["isa"], "sse4_1")
        self.assertIsNone(out["reason"])

    def test_openblas_core_read_back(self):
        lib = os.path.join(OPENBLAS_DIR, "libblas.so.3")
        if not os.path.exists(lib) or "avx2" not in util.cpu_flags():
            self.skipTest("no OpenBLAS libblas.so.3 in %s (CAPD_TEST_OPENBLAS_DIR), or no AVX2"
                          % OPENBLAS_DIR)
        env = {"LD_LIBRARY_PATH": OPENBLAS_DIR, "ONEDNN_MAX_CPU_ISA": "AVX2"}
        out, _ = _read_in(DEBIAN, dict(env, OPENBLAS_CORETYPE="Haswell"), "avx2", "avx2")
        blas = out["libraries"]["blas"]
        self.assertEqual((blas["library"], blas["branch"], blas["isa"]),
                         ("openblas", "Haswell", "avx2"), blas)
        self.assertIsNone(out["reason"])
        if "avx512f" in util.cpu_flags():
            out, _ = _read_in(DEBIAN, dict(env, OPENBLAS_CORETYPE="SkylakeX"), "avx2", "avx2")
            self.assertIn("OpenBLAS ran its SkylakeX kernels, avx512 (openblas_get_corename: "
                          "SkylakeX; OPENBLAS_CORETYPE=SkylakeX)", out["reason"])


def _avx512():
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= util.cpu_flags()


class CellTest(unittest.TestCase):
    """The runner ends a cell unsupported when a library ran above the
    width, and checks ATen against the table's 'effective'."""

    @unittest.skipUnless("avx2" in util.cpu_flags(), "the host has no AVX2")
    def test_onednn_above_the_width(self):
        spec = dict(util.make_spec("mlp", width="avx2", iterations=0, warmup=0), width_isa="avx2")
        capped = util.run(spec, env={"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                     "DNNL_MAX_CPU_ISA": "AVX2"})
        self.assertEqual(capped.status, "ok", capped.describe())
        fp = capped.one("env")["fingerprint"]
        self.assertEqual(fp["libraries"]["ceiling"], {"width_isa": "avx2", "wider": [],
                                                      "unread": []})
        free = util.run(spec, env={"ATEN_CPU_CAPABILITY": "avx2"})
        onednn = free.one("env")["fingerprint"]["libraries"]["onednn"]
        if not libs.above(onednn["isa"], "avx2"):
            self.skipTest("oneDNN's best ISA here is %s" % onednn["isa"])
        self.assertEqual(free.status, "unsupported", free.describe())
        self.assertEqual([f.kind for f in free.frames], ["hello", "env", "end"])
        self.assertIn("width avx2 allows instructions up to avx2, but oneDNN dispatches up to "
                      "%s (onednn_verbose isa" % onednn["isa"], free.end["reason"])

    @unittest.skipUnless(_avx512(), "the host has no AVX-512")
    def test_width_effective(self):
        env = {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "DNNL_MAX_CPU_ISA": "AVX512_CORE"}
        base = util.make_spec("mlp", width="amx", iterations=0, warmup=0)
        ok = util.run(dict(base, width_effective="avx512", width_isa="amx"), env=env)
        self.assertEqual(ok.status, "ok", ok.describe())
        self.assertEqual(ok.one("env")["effective_width"], "avx512")
        old = util.run(base, env=env)  # without width_effective: the width's own name
        self.assertEqual(old.status, "unsupported", old.describe())
        self.assertIn("requested width amx but the effective CPU capability is avx512",
                      old.end["reason"])
        low = util.run(dict(base, width_effective="avx512"),
                       env=dict(env, ATEN_CPU_CAPABILITY="avx2"))
        self.assertEqual(low.status, "unsupported", low.describe())
        self.assertIn("requested width amx (CPU capability avx512) but the effective CPU "
                      "capability is avx2", low.end["reason"])


if __name__ == "__main__":
    unittest.main()
