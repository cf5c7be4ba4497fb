"""Environment fingerprint for the ``env`` frame."""

import hashlib
import json
import os
import platform
import re
import sys

from capd_runner import RUNNER_NAME
from capd_runner import cpuinfo, layout, native
from capd_runner import width as widthmod

# Every variable of the cell's environment is recorded (capd built it, so
# it is what the build, the width and capd's allow-list put there), but for
# three kinds:
# - values of names that look secret, replaced by REDACTED: a name that
#   contains one of these words (any case) or ends in _KEY, or a value that
#   is a URL with a password (scheme://user:password@host);
# - the variables capd sets per cell or attempt (CAPD_CELL_SPEC, and HOME
#   when a run_as_user cell's HOME is its scratch dir: daemon/child/cellenv.c; a
#   remote worker rewrites every value under capd's scratch dir to its own,
#   so any value inside the scratch dir is one) and the shell's bookkeeping
#   (PWD, OLDPWD, SHLVL, _), which would make every two cells differ: their
#   names only, under env_per_cell;
# - past ENV_VALUE_MAX bytes a value is recorded as its length and digest,
#   and past ENV_TOTAL_MAX bytes in all the remaining names are listed
#   under env_left_out (the env frame's header is capped at 64 KiB).
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|APIKEY|API_KEY|"
                         r"ACCESS_KEY|AUTH|COOKIE|SESSION|_KEY$", re.I)
SECRET_VALUE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]*@")
REDACTED = "<redacted>"
PER_CELL_NAMES = ("CAPD_CELL_SPEC", "PWD", "OLDPWD", "SHLVL", "_")
ENV_VALUE_MAX = 4096
ENV_TOTAL_MAX = 32768


def is_secret(name, value=""):
    return bool(SECRET_NAME.search(name) or SECRET_VALUE.search(value or ""))


def is_per_cell(name, value, scratch=None):
    """Whether capd sets NAME per cell (its value differs between any two)."""
    if name in PER_CELL_NAMES:
        return True
    if scratch and len(scratch) > 1:
        root = scratch.rstrip("/")
        return value == root or value.startswith(root + "/")
    return False


def split_env(environ=None, scratch=None):
    """(recorded, per-cell names, left-out names) of ENVIRON (os.environ),
    by the rules above; the recorded variables sorted by name."""
    environ = os.environ if environ is None else environ
    env, per_cell, left_out = {}, [], []
    total = 0
    for k in sorted(environ):
        v = environ[k]
        if is_per_cell(k, v, scratch):
            per_cell.append(k)
            continue
        if is_secret(k, v):
            v = REDACTED
        elif len(v.encode("utf-8", "surrogateescape")) > ENV_VALUE_MAX:
            raw = v.encode("utf-8", "surrogateescape")
            v = "<%d bytes, sha256 %s>" % (len(raw), hashlib.sha256(raw).hexdigest())
        total += len(json.dumps(k)) + len(json.dumps(v)) + 2
        if total > ENV_TOTAL_MAX:
            left_out.append(k)
            continue
        env[k] = v
    return env, per_cell, left_out


def relevant_env(environ=None, scratch=None):
    """The variables the fingerprint records (split_env), by name."""
    return split_env(environ, scratch)[0]


def cpu_info(path="/proc/cpuinfo"):
    """Model name and ISA flags of the first processor listed."""
    info = {"model": None, "flags": [], "logical_cpus": os.cpu_count(),
            "machine": platform.machine()}
    first = cpuinfo.first_processor(path)
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


def collect(torch, config_text, effective_width, device_info, libraries=None, scratch=None,
            mode=None):
    """The fingerprint. LIBRARIES: what the libraries ran (capd_runner/libs.py
    read); SCRATCH: the cell's scratch dir (per-cell variables point there);
    MODE: the cell's mode, and for a compiled one (aot_eager, inductor) the
    fingerprint's ``compile`` (capd_runner/compiled.py describe: the mode,
    Inductor's vector ISA, its C++ compiler and its settings); an eager
    cell's has no such key."""
    tv = torchvision_version()
    env, per_cell, left_out = split_env(scratch=scratch)
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
        "env": env,
        "env_per_cell": per_cell,
        "libraries": libraries,
        "device": device_info,
        "stats_engine": native.describe(),
        "address_layout": layout.state(),
    }
    if left_out:
        fp["env_left_out"] = left_out
    if mode is not None and mode != "eager":
        try:
            from capd_runner import compiled
            fp["compile"] = compiled.describe(torch, mode, scratch)
        except Exception as e:  # informational only; never fail a cell here
            fp["compile"] = {"mode": mode, "error": "%s: %s" % (type(e).__name__, e)}
    return fp
