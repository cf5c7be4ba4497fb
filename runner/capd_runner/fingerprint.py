"""Environment fingerprint for the ``env`` frame."""

import hashlib
import os
import platform
import re
import sys

from capd_runner import RUNNER_NAME
from capd_runner import native
from capd_runner import width as widthmod

ENV_NAMES = (
    "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",
    "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER", "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF",
    # let float32 matrix products run in TF32 whatever the program asks
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE",
    # what the interpreter imports and the loader links: a build that puts a
    # patched module or library first runs different code with the same torch
    "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "LD_PRELOAD", "LD_LIBRARY_PATH",
)
ENV_PREFIXES = ("MKL_", "OPENBLAS_")


def relevant_env(environ=None):
    environ = os.environ if environ is None else environ
    out = {}
    for k in sorted(environ):
        if k in ENV_NAMES or k.startswith(ENV_PREFIXES):
            out[k] = environ[k]
    return out


def cpu_info(path="/proc/cpuinfo"):
    """Model name and ISA flags of the first processor listed."""
    info = {"model": None, "flags": [], "logical_cpus": os.cpu_count(),
            "machine": platform.machine()}
    try:
        with open(path, "r") as f:
            text = f.read()
    except OSError:
        return info
    first = {}
    for line in text.split("\n"):
        if not line.strip():
            if first:
                break
            continue
        k, sep, v = line.partition(":")
        if sep:
            first.setdefault(k.strip().lower(), v.strip())
    for k in ("model name", "cpu model", "cpu", "processor", "vendor_id"):
        v = first.get(k)
        if v and not v.isdigit():
            info["model"] = v
            break
    for k in ("flags", "features"):
        if first.get(k):
            info["flags"] = sorted(set(first[k].split()))
            break
    return info


def _safe(fn, default=None):
    try:
        return fn()
    except Exception:
        return default


def torchvision_version():
    """torchvision's version without importing it (the import costs about half
    a second per cell) when its version.py can be read; else import it."""
    mod = sys.modules.get("torchvision")
    if mod is not None:
        return getattr(mod, "__version__", "unknown")
    try:
        import importlib.util
        spec = importlib.util.find_spec("torchvision")
    except Exception:
        spec = None
    if spec is None:
        return None
    try:
        path = os.path.join(os.path.dirname(spec.origin), "version.py")
        with open(path, "r") as f:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
        if m:
            return m.group(1)
    except Exception:
        pass
    try:
        import torchvision
        return getattr(torchvision, "__version__", "unknown")
    except Exception:
        return None


def collect(torch, config_text, effective_width, device_info):
    tv = torchvision_version()
    version = getattr(torch, "version", None)
    fp = {
        "runner": RUNNER_NAME,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "torch": {
            "version": str(torch.__version__),
            "git_version": getattr(version, "git_version", None),
            "debug": getattr(version, "debug", None),
            "cuda": getattr(version, "cuda", None),
            "hip": getattr(version, "hip", None),
            "cudnn": _safe(lambda: torch.backends.cudnn.version()),
            "mkldnn": _safe(lambda: bool(torch.backends.mkldnn.is_available())),
            "config": config_text,
            "config_sha256": hashlib.sha256(config_text.encode("utf-8")).hexdigest(),
            "parallel_info": _safe(lambda: torch.__config__.parallel_info()),
        },
        "torchvision": tv,
        "cpu_capability": effective_width,
        "cpu_capability_raw": widthmod.raw_capability(torch, config_text)[0],
        "threads": {
            "intra_op": _safe(torch.get_num_threads),
            "inter_op": _safe(torch.get_num_interop_threads),
        },
        "cpu": cpu_info(),
        "platform": platform.platform(),
        "byteorder": sys.byteorder,
        "env": relevant_env(),
        "device": device_info,
        "stats_engine": native.describe(),
    }
    return fp
