"""The CPU capability (SIMD width) that PyTorch actually dispatches to.

PyTorch reads ATEN_CPU_CAPABILITY once, lazily, at the first dispatched
operator, and only warns on a value it cannot honour, so the runner reads the
effective level back instead of trusting the environment:
``torch.backends.cpu.get_cpu_capability()`` where it exists (2.1+), else the
``CPU capability usage:`` line of ``torch.__config__.show()`` (1.x prints
``NO AVX``/``AVX2``/``AVX512``, recent 2.x prints ``DEFAULT``).
"""

import importlib
import platform
import re

_NAMES = {
    "NO AVX": "default",
    "DEFAULT": "default",
    "AVX": "avx",
    "AVX2": "avx2",
    "AVX512": "avx512",
    "VSX": "vsx",
    "ZVECTOR": "zvector",
    "SVE256": "sve256",
}

_LINE = re.compile(r"CPU capability usage:\s*(.+?)\s*$", re.M)


def normalize(raw):
    """Map torch's spelling to capd's width name."""
    if raw is None:
        return None
    s = " ".join(str(raw).strip().upper().split())
    return _NAMES.get(s, s.lower().replace(" ", "_"))


def raw_capability(torch, config_text=None):
    """(raw string, source) of the effective capability."""
    try:
        mod = importlib.import_module("torch.backends.cpu")
        fn = getattr(mod, "get_cpu_capability", None)
    except Exception:
        fn = None
    if fn is not None:
        try:
            return str(fn()), "torch.backends.cpu.get_cpu_capability"
        except Exception:
            pass
    if config_text is None:
        config_text = torch.__config__.show()
    m = _LINE.search(config_text)
    if m:
        return m.group(1), "torch.__config__.show"
    return None, None


def effective(torch, config_text=None):
    raw, _source = raw_capability(torch, config_text)
    return normalize(raw)


def host_missing(requires, cpu=None):
    """The features of ``requires`` (capd's width table, sent in the cell
    spec as ``width_requires``) that this host's /proc/cpuinfo flags lack.

    capd decides this before it starts a cell; the runner asks again before
    the first operator, because a framework that trusts ATEN_CPU_CAPABILITY
    executes instructions the CPU does not have and dies of SIGILL. Only on
    x86, whose width features are the kernel's flag names; elsewhere capd's
    own check (the auxiliary vector) is the one that counts.
    """
    if not requires:
        return []
    if cpu is None:
        from capd_runner import fingerprint
        cpu = fingerprint.cpu_info()
    if cpu.get("machine") not in ("x86_64", "i686", "i386") or not cpu.get("flags"):
        return []
    flags = set(cpu["flags"])
    return [f for f in requires if f not in flags]
