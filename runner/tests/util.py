"""Shared helpers of the runner tests."""

import atexit
import hashlib
import os
import shutil
import struct
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from tests.framereader import make_spec, run_runner  # noqa: F401

PYTHON = os.environ.get("CAPD_TEST_PYTHON", sys.executable)
DEVICE = os.environ.get("CAPD_TEST_DEVICE", "cpu")
ZOO = ["mlp", "cnn", "resnet18", "mobilenet_v3_small", "transformer", "lstm", "embedding_bag"]


def require_native(test):
    """Skip ``test`` when the native stats library is not loadable, or fail
    when CAPD_TEST_REQUIRE_NATIVE=1 (ctest sets it with the built path)."""
    from capd_runner import native
    ok, why = native.status()
    if ok:
        return
    if os.environ.get("CAPD_TEST_REQUIRE_NATIVE") == "1":
        test.fail("native stats library required but not loaded: %s" % why)
    test.skipTest("native stats library: %s" % why)


def has_torchvision():
    try:
        import torchvision  # noqa: F401
        return True
    except Exception:
        return False


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def blake(data):
    return hashlib.blake2b(bytes(data), digest_size=16).hexdigest()


def floats(payload, dtype):
    """Decode a little-endian payload (float32/float64/float16/bfloat16)."""
    if dtype == "float32":
        return list(struct.unpack("<%df" % (len(payload) // 4), payload))
    if dtype == "float64":
        return list(struct.unpack("<%dd" % (len(payload) // 8), payload))
    if dtype == "float16":
        return list(struct.unpack("<%de" % (len(payload) // 2), payload))
    if dtype == "bfloat16":
        halves = struct.unpack("<%dH" % (len(payload) // 2), payload)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    raise ValueError(dtype)


def run(spec, **kw):
    kw.setdefault("python", PYTHON)
    return run_runner(spec, **kw)


def run_many(jobs, workers=None):
    """Run several (spec, kwargs) cells concurrently; results in order."""
    workers = workers or max(2, min(4, os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as ex:
        futs = [ex.submit(run, spec, **kw) for spec, kw in jobs]
        return [f.result() for f in futs]


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        d = os.path.dirname(path)
        if not os.path.isdir(d):
            os.makedirs(d)
        with open(path, "w") as f:
            f.write(text)


def tempdir():
    """A temporary directory, removed when the test process exits."""
    d = tempfile.mkdtemp(prefix="capd-runner-test-")
    atexit.register(shutil.rmtree, d, True)
    return d


def model_tree(files):
    """A temporary directory holding ``files`` (path: text), a model root."""
    root = tempdir()
    write_tree(root, files)
    return root
