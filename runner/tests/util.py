"""Shared helpers of the runner tests."""

import atexit
import ctypes
import ctypes.util
import hashlib
import os
import shutil
import struct
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from capd_runner import cpuinfo
from tests.framereader import make_spec, run_runner  # noqa: F401

PYTHON = os.environ.get("CAPD_TEST_PYTHON", sys.executable)
DEVICE = os.environ.get("CAPD_TEST_DEVICE", "cpu")
ZOO = ["mlp", "cnn", "resnet18", "mobilenet_v3_small", "transformer", "lstm", "embedding_bag"]

# The head of a test model module's source (a model_tree file): torch, and
# Lin, a module whose one layer is ``self.lin``, a Linear of Lin.SIZES, for
# a test model to derive from with a forward of its own.
LIN_MODEL = '''
import torch

class Lin(torch.nn.Module):
    SIZES = (6, 4)

    def __init__(self):
        super(Lin, self).__init__()
        self.lin = torch.nn.Linear(*self.SIZES)
'''


def assert_ended(test, r, returncode, kinds, status, *reason_has):
    """Runner result R exited RETURNCODE with frames of KINDS, in order,
    its end STATUS and a reason that holds each of REASON_HAS."""
    test.assertEqual(r.returncode, returncode, r.describe())
    test.assertEqual([f.kind for f in r.frames], kinds)
    test.assertEqual(r.status, status)
    for text in reason_has:
        test.assertIn(text, r.end["reason"])


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
    return set(cpuinfo.first_processor().get("flags", "").split())


def blake(data):
    return hashlib.blake2b(bytes(data), digest_size=16).hexdigest()


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


_xxhash = None


def xxh3_128(data):
    """XXH3-128 of ``data`` in the canonical hex (high half first), computed
    by the system's libxxhash (what storage links), not by the runner's own
    build of it."""
    global _xxhash
    if _xxhash is None:
        lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
        lib.XXH3_128bits.restype = _XXH128
        lib.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        _xxhash = lib
    raw = bytes(data)
    h = _xxhash.XXH3_128bits(raw, len(raw))
    return "%016x%016x" % (h.high64, h.low64)


def content_hash(alg, data):
    """The hash a record of algorithm ``alg`` ("hash_alg") must carry."""
    if alg == "xxh3-128":
        return xxh3_128(data)
    if alg == "blake2b-128":
        return blake(data)
    raise AssertionError("unknown hash_alg %r" % alg)


def record_hash(frame, data):
    """The hash ``frame`` (a tensor record) must carry for ``data``."""
    return content_hash(frame["hash_alg"], data)


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


def copy_archive(src, edit=None, **changes):
    """A copy of reproducer folder SRC (a temporary directory) whose
    manifest.json has CHANGES set and EDIT(manifest) applied."""
    import json
    dst = tempdir()
    shutil.rmtree(dst)
    shutil.copytree(src, dst)
    path = os.path.join(dst, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    m.update(changes)
    if edit is not None:
        edit(m)
    with open(path, "w") as f:
        json.dump(m, f)
    return dst


def model_tree(files):
    """A temporary directory holding ``files`` (path: text), a model root."""
    root = tempdir()
    write_tree(root, files)
    return root
