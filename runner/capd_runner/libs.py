"""What the libraries under torch ran: the BLAS and LAPACK, oneDNN and
Inductor, each asked in the cell itself (docs/runner.md, "What the
libraries ran").

A width (docs/widths.md) sets one variable per library that dispatches on
the CPU (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_CBWR and
MKL_ENABLE_INSTRUCTIONS, OPENBLAS_CORETYPE). Like ATen, each library reads
its variable once, at its first use, and ignores a value it does not know
(MKL_CBWR=AVX2 under MKL_ENABLE_INSTRUCTIONS=SSE4_2 silently becomes AUTO),
so the runner reads back what each one picked:

- The BLAS torch calls is the object that defines ``sgemm_`` where torch's
  own calls bind it (dlsym through the global scope, then through the
  handle of torch._C, whose scope holds libtorch_cpu and the libraries it
  needs; /proc/self/maps names the file that holds the address, by its real
  path): libtorch_cpu itself for the official wheel (MKL linked in
  statically), /usr/lib/<triplet>/blas/libblas.so.3.* (the
  reference BLAS, no SIMD dispatch) for Debian's torch, or OpenBLAS's or
  BLIS's libblas.so.3 where the alternative points there. Its exported
  symbols say which library it is (only objects already loaded are opened,
  with RTLD_NOLOAD), and it is asked directly:
  MKL through ``mkl_serv_cbwr_get(MKL_CBWR_BRANCH)`` (the CNR branch set),
  ``mkl_serv_cbwr_get_auto_branch()`` (the branch MKL picks itself, which
  follows MKL_ENABLE_INSTRUCTIONS), ``mkl_serv_cpu_detect()`` (its code
  path) and ``MKL_Get_Version_String``, or their public names; OpenBLAS
  through ``openblas_get_corename()`` and ``openblas_get_config()``; BLIS
  through ``bli_arch_query_id()`` where the object exports it (Debian's
  BLIS libblas.so.3 does not). Never MKL_VERBOSE: it busy-waits about half
  a second measuring the CPU's frequency.
- LAPACK: the object that defines ``dgetrf_`` the same way.
- oneDNN: its verbose mode, on for one reorder of a 1x1 tensor
  (``to_mkldnn``), prints its version and the ISA it dispatches up to
  (``onednn_verbose,...,info,cpu,isa:Intel AVX2``) once per process, on
  the C stdout; fd 1 goes to an anonymous file for that one call and
  anything else printed meanwhile is written back to the real fd 1.
- Inductor compiles nothing in an eager cell; its vector ISA follows
  ATEN_CPU_CAPABILITY (``pick_vec_isa``) and is read only when this
  process has already probed the CPU for it (the probe compiles test
  programs: 0.2 to 0.3 s).

Every part is in its own try; a failure is recorded as ``error`` and never
fails the cell.

Cost of ``read`` after ``import torch``, in a fresh process, 10 runs each
on the project's 2-core VM at a 1-minute load under 1: Debian's torch 1.13
(reference BLAS, oneDNN 2.6.3) median 3.7 ms (3.3 to 4.0), of which reading
/proc/self/maps (1,700 lines: Debian's torch maps some 300 libraries) about
2 ms and the oneDNN reorder 0.7 ms; the official wheel 2.14.1 (MKL and oneDNN
3.12 inside libtorch_cpu) median 2.65 ms (2.6 to 2.7): maps 0.6 ms, MKL's
questions 0.3 ms, oneDNN 0.9 ms. Asking oneDNN with a small convolution
instead costs about as much on one thread, but at two threads its first
convolution in a process took 1 to 50 ms on the wheel (OpenMP's pool
starting, which a model would pay later), and a first dlopen of libtorch_cpu
as a handle costs 2 to 10 ms (Scope says why).
"""

import bisect
import ctypes
import os
import re
import sys

from capd_runner import cpuinfo

# The instruction levels a width's ceiling (width_isa) and a library's
# reading are named in, narrowest first. A reading between two of them
# counts as the next one up (SSE3, SSSE3: sse4_1), so that the check never
# lets code wider than a ceiling pass.
LEVELS = ("sse2", "sse4_1", "sse4_2", "avx", "avx2", "avx2_vnni", "avx512", "avx512_vnni",
          "avx512_bf16", "avx512_fp16", "amx")
_RANK = dict((name, i) for i, name in enumerate(LEVELS))


def above(level, ceiling):
    """Whether LEVEL is wider than CEILING; False when either is unknown."""
    a, b = _RANK.get(level), _RANK.get(ceiling)
    return a is not None and b is not None and a > b


def _env_text(names, environ=None):
    """How the variables NAMES are set, for a reading's ``source``."""
    environ = os.environ if environ is None else environ
    have = ["%s=%s" % (n, environ[n]) for n in names if n in environ]
    if have:
        return "; ".join(have)
    return "%s unset" % ", ".join(names)


# --- MKL ---------------------------------------------------------------------

# MKL_CBWR_BRANCH values of mkl_cbwr.h: what mkl_cbwr_get(1) answers.
MKL_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512",
                13: "AVX512_MIC_E1", 14: "AVX512_E1"}
_MKL_LEVELS = {3: "sse2", 4: "sse2", 6: "sse4_1", 7: "sse4_1", 8: "sse4_2", 9: "avx",
               10: "avx2", 11: "avx512", 12: "avx512", 13: "avx512_vnni", 14: "avx512_vnni"}
# What mkl_serv_cpu_detect() answered on an AMX host (MKL 2024.2): 0 under
# MKL_CBWR=COMPATIBLE, SSE2 and SSE4_1; 3 under SSE4_2 and AVX (which MKL
# runs as SSE4.2); 5 under AVX2; 7 under AVX512, AVX512_E1 and with nothing
# set. Recorded on Intel CPUs only, never used for the level: on an AMD EPYC
# (AVX2, MKL 2024.2) it answered 0 whatever was set while MKL's own choice
# ran its SGEMM at AVX2 speed (42 GFLOP/s on one thread, 22 under
# MKL_CBWR=COMPATIBLE).
MKL_CPU_PATHS = {0: "sse2", 3: "sse4_2", 5: "avx2", 7: "avx512"}
MKL_CBWR_BRANCH = 1
MKL_CBWR_ALL = -1
MKL_CBWR_STRICT = 0x10000
ENV_MKL = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")


def mkl_branch_name(code):
    if code is None:
        return None
    return MKL_BRANCHES.get(code, "code %d" % code)


def mkl_effective(cbwr, auto):
    """The branch MKL runs: the CNR branch where one is set (3 and up),
    else (OFF, AUTO) the one it picks itself."""
    if cbwr is not None and cbwr >= 3:
        return cbwr
    return auto


def mkl_level(code):
    return _MKL_LEVELS.get(code)


# --- OpenBLAS, BLIS ----------------------------------------------------------

# openblas_get_corename() (lower-cased) to a level: the widest instructions
# of that core's kernels. Atom kernels are SSSE3 at most.
_OPENBLAS_LEVELS = {
    "opteron": "sse2", "prescott": "sse4_1", "core2": "sse4_1", "penryn": "sse4_1",
    "dunnington": "sse4_1", "atom": "sse4_1", "opteron_sse3": "sse4_1",
    "barcelona": "sse4_1", "bobcat": "sse4_1", "nano": "sse4_1", "nehalem": "sse4_2",
    "sandybridge": "avx", "bulldozer": "avx", "piledriver": "avx", "steamroller": "avx2",
    "excavator": "avx2", "haswell": "avx2", "zen": "avx2", "skylakex": "avx512",
    "cooperlake": "avx512_bf16", "sapphirerapids": "amx",
}
ENV_OPENBLAS = ("OPENBLAS_CORETYPE",)

# bli_arch_string(bli_arch_query_id()) to a level.
_BLIS_LEVELS = {
    "generic": "sse2", "penryn": "sse4_1", "sandybridge": "avx", "bulldozer": "avx",
    "piledriver": "avx", "steamroller": "avx2", "excavator": "avx2", "haswell": "avx2",
    "zen": "avx2", "zen2": "avx2", "zen3": "avx2", "skx": "avx512", "knl": "avx512",
    "zen4": "avx512_bf16", "zen5": "avx512_bf16",
}
ENV_BLIS = ("BLIS_ARCH_TYPE",)


def openblas_level(core):
    return _OPENBLAS_LEVELS.get(str(core or "").strip().lower())


def blis_level(arch):
    return _BLIS_LEVELS.get(str(arch or "").strip().lower())


# --- oneDNN, Inductor --------------------------------------------------------

ENV_ONEDNN = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
_AVX10 = re.compile(r"AVX ?10")
_FLOAT16 = re.compile(r"(?<!b)float16")


def onednn_level(text):
    """The level of oneDNN's verbose ISA text ('Intel AVX2', 'Intel AVX-512
    with Intel DL Boost and bfloat16 support and Intel AMX with bfloat16
    and 8-bit integer support', 'Intel AVX10.1 and Intel AMX ...')."""
    if not text:
        return None
    t = str(text)
    if "AMX" in t:
        return "amx"
    vnni = "DL Boost" in t or "VNNI" in t
    if "AVX-512" in t or "AVX512" in t or _AVX10.search(t):
        if _AVX10.search(t) or _FLOAT16.search(t):
            return "avx512_fp16"
        if "bfloat16" in t:
            return "avx512_bf16"
        return "avx512_vnni" if vnni else "avx512"
    if "AVX2" in t:
        return "avx2_vnni" if vnni else "avx2"
    if re.search(r"\bAVX\b", t):
        return "avx"
    if "SSE4.2" in t or "SSE42" in t:
        return "sse4_2"
    if "SSE4.1" in t or "SSE41" in t:
        return "sse4_1"
    return None


def inductor_level(text):
    """The level of str(pick_vec_isa()): 'avx2', 'avx512', 'avx512
    avx512_vnni', 'avx512 avx512_vnni amx_tile'; None for INVALID_VEC_ISA
    (no vectorisation) and the ISAs of other architectures."""
    words = str(text or "").split()
    if any(w.startswith("amx") for w in words):
        return "amx"
    for w in ("avx512_fp16", "avx512_bf16", "avx512_vnni", "avx512", "avx2"):
        if w in words:
            return w
    return None


# --- the shared objects of this process -------------------------------------

class Maps(object):
    """The shared objects mapped into this process (/proc/self/maps, whose
    paths are the files' real paths): ``paths`` in the order of their code's
    mapping, and which one holds an address. Cheaper than dladdr, which
    scans the whole symbol table of libtorch_cpu (1 ms a call) to name the
    nearest symbol."""

    def __init__(self, path="/proc/self/maps"):
        with open(path) as f:
            text = f.read()
        self.paths, ranges, seen = [], [], set()
        for line in text.splitlines():
            # "lo-hi perms offset dev inode path": code is in the mappings
            # whose permissions say x; the others need not be parsed.
            sp = line.find(" ")
            i = line.find("/", sp)
            if line[sp + 3:sp + 4] != "x" or i < 0:
                continue
            p = line[i:]
            if p.endswith(" (deleted)"):
                p = p[:-len(" (deleted)")]
            if ".so" not in os.path.basename(p):
                continue
            lo, _sep, hi = line[:sp].partition("-")
            ranges.append((int(lo, 16), int(hi, 16), p))
            if p not in seen:
                seen.add(p)
                self.paths.append(p)
        ranges.sort()
        self._ranges = ranges
        self._starts = [r[0] for r in ranges]

    def file_of(self, fn):
        """The object that defines the function FN (a ctypes function)."""
        addr = ctypes.cast(fn, ctypes.c_void_p).value or 0
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and self._ranges[i][0] <= addr < self._ranges[i][1]:
            return self._ranges[i][2]
        return None


def _open(path):
    """A handle on PATH if it is loaded already (RTLD_NOLOAD: never loads
    anything), else None. Its symbols are looked up in it and then in the
    objects it depends on."""
    mode = getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1)
    try:
        return ctypes.CDLL(path, mode=mode)
    except OSError:
        return None


def _fn(lib, name, restype=ctypes.c_int, argtypes=()):
    if lib is None:
        return None
    try:
        f = getattr(lib, name)
    except AttributeError:
        return None
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


def _first(libs, names, restype=ctypes.c_int, argtypes=()):
    """(name, function) of the first of NAMES any of LIBS exports."""
    for lib in libs:
        for name in names:
            f = _fn(lib, name, restype, argtypes)
            if f is not None:
                return name, f
    return None, None


class Scope(object):
    """Where torch's own calls into the BLAS and LAPACK bind: the global
    scope (the interpreter and what was loaded RTLD_GLOBAL), then the scope
    of the dlopen that loaded torch._C, libtorch_cpu and the libraries it
    needs included. dlsym through these two handles finds what the loader
    bound. (A handle on libtorch_cpu itself would do as well, but its first
    dlopen builds the list of its hundreds of dependencies: 2 to 10 ms.)"""

    def __init__(self, torch, maps):
        self.maps = maps
        c = getattr(torch._C, "__file__", None)
        self.handles = [ctypes.CDLL(None)] + ([_open(c)] if c else [])
        self.torch_files = set(p for p in maps.paths
                               if os.path.basename(p).startswith("libtorch"))
        if c:
            self.torch_files.add(os.path.realpath(c))

    def provider(self, names):
        """(symbol, file) of the first of NAMES that torch's calls find."""
        name, f = _first([h for h in self.handles if h is not None], names)
        if f is None:
            return None, None
        return name, self.maps.file_of(f)

    def shown(self, path):
        """PATH as the reading names it: torch's own library with
        '(static)' when the library is linked into it."""
        if path in self.torch_files:
            return "%s (static)" % path
        return path


def _config_value(config_text, name):
    m = re.search(r"\b%s=([^,\s]+)" % re.escape(name), config_text or "")
    return m.group(1) if m else None


def _text(v):
    if v is None:
        return None
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


# --- BLAS and LAPACK ---------------------------------------------------------

_MKL_PROBES = ("mkl_serv_cbwr_get", "mkl_cbwr_get", "MKL_Get_Version_String",
               "mkl_get_version_string")


def _defines(maps, handle, name, where):
    """Whether NAME, seen from HANDLE, is defined in WHERE's directory: the
    library itself or a part of it beside it (OpenBLAS's libblas.so.3 and
    libopenblas.so.0), not some other library it happens to depend on."""
    f = _fn(handle, name)
    if f is None:
        return False
    path = maps.file_of(f)
    return path is None or os.path.dirname(path) == os.path.dirname(where)


def kind_of(path, maps=None, handle=None):
    """Which library the object at PATH is: its symbols first, then its name."""
    if handle is not None and maps is not None:
        if any(_defines(maps, handle, n, path) for n in _MKL_PROBES):
            return "mkl"
        if _defines(maps, handle, "openblas_get_corename", path):
            return "openblas"
        if _defines(maps, handle, "bli_arch_query_id", path):
            return "blis"
    low = path.lower()
    base = os.path.basename(low)
    if "openblas" in low:
        return "openblas"
    if "blis" in low:
        return "blis"
    if base.startswith("libmkl"):
        return "mkl"
    if "atlas" in low:
        return "unknown"
    if base.startswith(("libblas.so", "liblapack.so", "librefblas", "libreflapack")):
        return "reference"
    return "unknown"


def _soname_version(path):
    m = re.search(r"\.so\.(\d+(?:\.\d+)+)$", path or "")
    return m.group(1) if m else None


def read_blas(config_text, scope):
    out = {"library": "unknown", "path": None, "version": None, "has_width": False,
           "branch": None, "isa": None, "source": None,
           "blas_info": _config_value(config_text, "BLAS_INFO")}
    sym, path = scope.provider(("sgemm_", "sgemm"))
    if path is None:
        out["source"] = "no sgemm_ where torch's calls bind"
        return out
    handle = _open(path)
    kind = kind_of(path, scope.maps, handle)
    out.update(library=kind, path=scope.shown(path))
    how = "dlsym(%s)" % sym
    if kind == "mkl":
        extra = [_open(p) for p in scope.maps.paths
                 if os.path.basename(p).startswith(("libmkl_core", "libmkl_rt"))]
        _read_mkl(out, [handle] + [h for h in extra if h is not None])
    elif kind == "openblas":
        _read_openblas(out, handle)
    elif kind == "blis":
        _read_blis(out, handle)
    elif kind == "reference":
        out.update(version=_soname_version(path),
                   source="%s: the reference BLAS, no SIMD dispatch" % how)
    else:
        out["source"] = "%s: a BLAS this runner cannot ask" % how
    return out


class _MKLVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("update", ctypes.c_int),
                ("status", ctypes.c_char_p), ("build", ctypes.c_char_p),
                ("processor", ctypes.c_char_p), ("platform", ctypes.c_char_p)]


def _mkl_version(libs):
    _n, f = _first(libs, ("MKL_Get_Version_String", "mkl_get_version_string"), None,
                   (ctypes.c_char_p, ctypes.c_int))
    if f is not None:
        buf = ctypes.create_string_buffer(256)
        f(buf, len(buf))
        return _text(buf.value).strip() or None
    _n, f = _first(libs, ("MKL_Get_Version",), None, (ctypes.POINTER(_MKLVersion),))
    if f is not None:
        v = _MKLVersion()
        f(ctypes.byref(v))
        return "%d.%d.%d %s" % (v.major, v.minor, v.update, _text(v.build) or "")
    return None


def cpu_vendor():
    """The CPU's vendor_id (GenuineIntel, AuthenticAMD, ...), or None."""
    return cpuinfo.first_processor().get("vendor_id")


# MKL takes its CNR branches (MKL_CBWR) and MKL_ENABLE_INSTRUCTIONS on Intel
# CPUs only; elsewhere it keeps a path of its own, which it does not
# report, and honours MKL_CBWR=COMPATIBLE alone (the default width's).
MKL_NOT_INTEL = ("MKL takes MKL_CBWR branches and MKL_ENABLE_INSTRUCTIONS on Intel CPUs "
                 "only: on this %s CPU it runs a path of its own choosing, which it does "
                 "not report (%s)")


def _read_mkl(out, libs):
    out["has_width"] = True
    out["version"] = _mkl_version(libs)
    gname, get = _first(libs, ("mkl_serv_cbwr_get", "mkl_cbwr_get"), ctypes.c_int, (ctypes.c_int,))
    aname, auto = _first(libs, ("mkl_serv_cbwr_get_auto_branch", "mkl_cbwr_get_auto_branch"))
    _d, detect = _first(libs, ("mkl_serv_cpu_detect",))
    if get is None:
        out["error"] = "MKL exports neither mkl_serv_cbwr_get nor mkl_cbwr_get"
        return
    cbwr = get(MKL_CBWR_BRANCH)
    a = auto() if auto is not None else None
    code = mkl_effective(cbwr, a)
    out.update(branch=mkl_branch_name(code), isa=mkl_level(code), cbwr=mkl_branch_name(cbwr),
               strict=bool(get(MKL_CBWR_ALL) & MKL_CBWR_STRICT), auto_branch=mkl_branch_name(a))
    vendor = cpu_vendor()
    if detect is not None:
        d = detect()
        out.update(cpu_detect=d, code_path=MKL_CPU_PATHS.get(d) if vendor == "GenuineIntel"
                   else None)
    how = "%s: %s" % (gname, mkl_branch_name(cbwr))
    if code != cbwr:
        how += ", %s: %s" % (aname, mkl_branch_name(a))
    out["source"] = "%s; %s" % (how, _env_text(ENV_MKL))
    if mkl_level(code) is None and vendor not in (None, "GenuineIntel"):
        out["reason"] = MKL_NOT_INTEL % (vendor, out["source"])
    elif code is None:
        out["error"] = "MKL's CNR is %s and it exports no auto-branch function" % (
            mkl_branch_name(cbwr),)


def _read_openblas(out, handle):
    core_f = _fn(handle, "openblas_get_corename", ctypes.c_char_p)
    conf_f = _fn(handle, "openblas_get_config", ctypes.c_char_p)
    if core_f is None:
        out.update(has_width=True, reason="this OpenBLAS exports no openblas_get_corename: its "
                                          "kernels are not read back")
        return
    core = _text(core_f())
    config = _text(conf_f()) if conf_f is not None else None
    m = re.search(r"OpenBLAS (\S+)", config or "")
    out.update(version=m.group(1) if m else None, has_width="DYNAMIC_ARCH" in (config or ""),
               branch=core, isa=openblas_level(core), config=config,
               source="openblas_get_corename: %s; %s" % (core, _env_text(ENV_OPENBLAS)))


def _read_blis(out, handle):
    out["has_width"] = True
    ver = _fn(handle, "bli_info_get_version_str", ctypes.c_char_p)
    if ver is not None:
        out["version"] = _text(ver())
    query = _fn(handle, "bli_arch_query_id")
    name = _fn(handle, "bli_arch_string", ctypes.c_char_p, (ctypes.c_int,))
    if query is None or name is None:
        out["reason"] = ("this BLIS exports no bli_arch_query_id (Debian's libblas.so.3 of "
                         "BLIS does not): its kernels are not read back")
        return
    arch = _text(name(query()))
    out.update(branch=arch, isa=blis_level(arch),
               source="bli_arch_query_id: %s; %s" % (arch, _env_text(ENV_BLIS)))


def read_lapack(config_text, scope):
    out = {"library": "unknown", "path": None,
           "lapack_info": _config_value(config_text, "LAPACK_INFO")}
    sym, path = scope.provider(("dgetrf_", "dgetrf"))
    if path is None:
        out["source"] = "no dgetrf_ where torch's calls bind"
        return out
    kind = kind_of(path, scope.maps, _open(path))
    out.update(library=kind, path=scope.shown(path), source="dlsym(%s)" % sym)
    if kind == "reference":
        out["version"] = _soname_version(path)
    return out


# --- oneDNN ------------------------------------------------------------------

# Set to anything but 0, oneDNN is verbose for the whole process anyway.
_VERBOSE_ENV = ("ONEDNN_VERBOSE", "DNNL_VERBOSE", "MKLDNN_VERBOSE")
# oneDNN prints its header (version, ISA) once a process: the first reading
# of a process is its answer, kept by pid (a forked child asks again).
_onednn_seen = {}
_VERBOSE_LINE = re.compile(br"(onednn|dnnl|mkldnn)_verbose,")


def _anon_fd():
    """A descriptor of an anonymous read-write file."""
    memfd = getattr(os, "memfd_create", None)  # 3.8+
    if memfd is not None:
        try:
            return memfd("capd-libs", getattr(os, "MFD_CLOEXEC", 1))
        except OSError:
            pass
    import tempfile
    fd, path = tempfile.mkstemp(prefix="capd-libs-")
    os.unlink(path)
    return fd


def _flush_stdout(fflush):
    try:
        sys.stdout.flush()
    except Exception:
        pass
    if fflush is not None:
        fflush(None)


def capture_fd1(fn):
    """Runs FN with fd 1 (the C library's stdout and Python's) going to an
    anonymous file; returns (the bytes written there, the exception FN
    raised or None). Both stdout layers are flushed before and after, and
    fd 1 is restored whatever FN does."""
    fflush = _fn(ctypes.CDLL(None), "fflush", ctypes.c_int, (ctypes.c_void_p,))
    tmp = _anon_fd()
    try:
        saved = os.dup(1)
        exc = None
        try:
            _flush_stdout(fflush)
            os.dup2(tmp, 1)
            try:
                fn()
            except Exception as e:
                exc = e
            finally:
                _flush_stdout(fflush)
                os.dup2(saved, 1)
        finally:
            os.close(saved)
        os.lseek(tmp, 0, os.SEEK_SET)
        chunks = []
        while True:
            b = os.read(tmp, 1 << 16)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks), exc
    finally:
        os.close(tmp)


def _write_back(data):
    """DATA to the real fd 1, whole (as far as fd 1 takes it: what the
    cell prints itself would meet the same closed pipe)."""
    view = memoryview(data)
    try:
        while len(view):
            view = view[os.write(1, view):]
    except OSError:
        pass


def _parse_verbose(lines):
    """(isa text, version) from oneDNN's verbose header lines."""
    isa = version = None
    for raw in lines:
        line = _text(raw).strip()
        i = line.find(",cpu,isa:")
        if i >= 0 and isa is None:
            isa = line[i + len(",cpu,isa:"):].strip()
        m = re.search(r",info,(?:oneDNN|DNNL|MKL-DNN|Intel MKL-DNN) v(\S+)", line)
        if m and version is None:
            version = m.group(1)
    return isa, version


def read_onednn(torch, config_text):
    pid = os.getpid()
    if pid in _onednn_seen:
        return dict(_onednn_seen[pid])
    m = re.search(r"(?:MKL-DNN|oneDNN|DNNL) v(\S+)", config_text or "")
    out = {"available": False, "version": m.group(1) if m else None, "isa": None,
           "isa_text": None, "source": None}
    mk = getattr(torch.backends, "mkldnn", None)
    if mk is None or not mk.is_available():
        out["reason"] = "torch %s is built without oneDNN" % (torch.__version__,)
        return out
    out["available"] = True
    verbose, on = getattr(mk, "verbose", None), getattr(mk, "VERBOSE_ON", None)
    if verbose is None or on is None:
        out["reason"] = ("torch %s has no torch.backends.mkldnn.verbose: oneDNN's ISA is not "
                         "read back" % (torch.__version__,))
        return out
    user_verbose = any(os.environ.get(n, "0") not in ("", "0") for n in _VERBOSE_ENV)

    def probe():
        if user_verbose:
            torch.ones(1, 1).to_mkldnn()
        else:
            with verbose(on):
                torch.ones(1, 1).to_mkldnn()

    data, exc = capture_fd1(probe)
    ours, others = [], []
    for ln in data.splitlines(True):
        (ours if _VERBOSE_LINE.match(ln) else others).append(ln)
    _write_back(data if user_verbose else b"".join(others))
    if exc is not None:
        out["error"] = "the probe raised %s: %s" % (type(exc).__name__, exc)
        return out
    isa, version = _parse_verbose(ours)
    out.update(version=version or out["version"], isa_text=isa, isa=onednn_level(isa))
    if isa is None:
        out["reason"] = ("oneDNN printed no isa line: it prints its verbose header once a "
                         "process, and did before")
    else:
        out["source"] = "onednn_verbose isa '%s'; %s" % (isa, _env_text(ENV_ONEDNN))
        _onednn_seen[pid] = dict(out)
    return out


# --- Inductor ----------------------------------------------------------------

EAGER_REASON = ("eager cell: Inductor compiles nothing here; its ISA follows "
                "ATEN_CPU_CAPABILITY (torch._inductor.cpu_vec_isa.pick_vec_isa) and is read "
                "for compiled cells")
_INDUCTOR_MODULES = ("torch._inductor.cpu_vec_isa", "torch._inductor.codecache")


def read_inductor(torch, probe=False):
    """Inductor's vector ISA where it is known already: pick_vec_isa's list
    of the ISAs the CPU and compiler can build for is cached once probed,
    and the probe compiles test programs (0.2 to 0.3 s), which an eager
    cell does not pay (torchvision imports the module, so being imported
    says nothing). PROBE: ask all the same (a compiled cell)."""
    out = {"available": hasattr(torch, "compile"), "isa": None, "read": False}
    pick = valid = None
    for name in _INDUCTOR_MODULES:
        mod = sys.modules.get(name)
        if getattr(mod, "pick_vec_isa", None) is not None:
            pick, valid = mod.pick_vec_isa, getattr(mod, "valid_vec_isa_list", None)
            break
    if pick is None:
        out["reason"] = EAGER_REASON
        return out
    info = getattr(valid, "cache_info", None)
    if not probe and (info is None or info().currsize == 0):
        out["reason"] = (EAGER_REASON + "; imported here, but it has not probed this CPU "
                         "in this process")
        return out
    text = str(pick())
    out.update(read=True, vec_isa=text, isa=inductor_level(text),
               source="pick_vec_isa: %s; %s" % (text, _env_text(("ATEN_CPU_CAPABILITY",))))
    if out["isa"] is None and "INVALID" in text:
        out["reason"] = "no vectorisation"
    return out


# --- all of them, and the width's ceiling ------------------------------------

def _blank(name):
    if name in ("blas", "lapack"):
        return {"library": "unknown", "path": None, "version": None, "has_width": False,
                "branch": None, "isa": None, "source": None}
    if name == "onednn":
        return {"version": None, "isa": None, "isa_text": None, "source": None}
    return {"available": False, "isa": None, "read": False}


def read(torch, config_text=None):
    """What each library ran, for the fingerprint's ``libraries``. Never
    raises: a part that fails says so in its ``error``."""
    if config_text is None:
        try:
            config_text = torch.__config__.show()
        except Exception:
            config_text = ""
    out = {}
    try:
        scope = Scope(torch, Maps())
    except Exception as e:
        scope = None
        why = "cannot see torch's libraries: %s: %s" % (type(e).__name__, e)
    parts = (("blas", lambda: read_blas(config_text, scope)),
             ("lapack", lambda: read_lapack(config_text, scope)),
             ("onednn", lambda: read_onednn(torch, config_text)),
             ("inductor", lambda: read_inductor(torch)))
    for name, fn in parts:
        if scope is None and name in ("blas", "lapack"):
            out[name] = dict(_blank(name), error=why)
            continue
        try:
            out[name] = fn()
        except Exception as e:
            out[name] = dict(_blank(name), error="%s: %s" % (type(e).__name__, e))
    return out


_BLAS_LABELS = {"mkl": "MKL", "openblas": "OpenBLAS", "blis": "BLIS",
                "reference": "the reference BLAS"}


def _ran(key, e):
    """What the library ran, in words: 'MKL ran its AVX512 branch'."""
    isa = e.get("isa")
    if key == "blas":
        label = _BLAS_LABELS.get(e.get("library"), "the BLAS")
        what = "branch" if e.get("library") == "mkl" else "kernels"
        text = "%s ran its %s %s" % (label, e.get("branch"), what)
        if str(e.get("branch")).lower() != isa:
            text += ", %s" % isa
        return label, text
    if key == "onednn":
        return "oneDNN", "oneDNN dispatches up to %s" % isa
    return "Inductor", "Inductor vectorises for %s" % isa


def inductor_family(level):
    """The ISA family Inductor's LEVEL is held to: its code at a width is
    the vector class ATEN_CPU_CAPABILITY picks (VecAVX2, VecAVX512), built
    with whatever extensions of that family the CPU has (VNNI, BF16, FP16),
    which capd cannot switch off; AMX is a width of its own (amx). So
    avx512_vnni, avx512_bf16, avx512_fp16 count as avx512, avx2_vnni as
    avx2 (docs/widths.md, "Inductor")."""
    if level in ("avx512_vnni", "avx512_bf16", "avx512_fp16"):
        return "avx512"
    if level == "avx2_vnni":
        return "avx2"
    return level


def wider(libraries, width_isa):
    """The libraries whose level is above WIDTH_ISA (none when it is null):
    [{"library", "isa", "source", "ran"}]; Inductor by its family
    (inductor_family)."""
    out = []
    if not width_isa:
        return out
    for key in ("blas", "onednn", "inductor"):
        e = libraries.get(key) or {}
        level = inductor_family(e.get("isa")) if key == "inductor" else e.get("isa")
        if above(level, width_isa):
            label, ran = _ran(key, e)
            out.append({"library": label, "isa": e["isa"], "source": e.get("source"),
                        "ran": ran})
    return out


def ceiling(libraries, width_isa):
    """Puts the width's ceiling, the libraries above it and those that
    dispatch but could not be read into ``libraries["ceiling"]``; returns
    the libraries above it."""
    above_it = wider(libraries, width_isa)
    unread = []
    blas = libraries.get("blas") or {}
    if blas.get("has_width") and blas.get("isa") is None:
        unread.append(_BLAS_LABELS.get(blas.get("library"), "the BLAS"))
    onednn = libraries.get("onednn") or {}
    if onednn.get("available") and onednn.get("isa") is None:
        unread.append("oneDNN")
    libraries["ceiling"] = {
        "width_isa": width_isa,
        "wider": [dict((k, w[k]) for k in ("library", "isa", "source")) for w in above_it],
        "unread": unread}
    return above_it


def reason(width, width_isa, above_it):
    """The ``unsupported`` reason for libraries that ran above the width."""
    return "width %s allows instructions up to %s, but %s" % (
        width, width_isa, "; ".join("%s (%s)" % (w["ran"], w["source"]) for w in above_it))
