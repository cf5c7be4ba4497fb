"""The runner's processes run in a fixed address-space layout
(capd_runner/layout.py; docs/compare.md, "Address layout"): two processes
started the same way map their memory at the same addresses, the process
keeps its pid and the environment it was exec'd with, and where the kernel
refuses, the process goes on and says why."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from tests.framereader import RUNNER_DIR

PROBE = r"""
import ctypes, json, mmap, os, sys
from capd_runner import layout
with open(os.environ["CAPD_LAYOUT_STARTS"], "a") as f:
    f.write("start\n")
layout.fix("unused", [])
m = mmap.mmap(-1, 1 << 20)
print(json.dumps({"state": layout.state(),
                  "starts": len(open(os.environ["CAPD_LAYOUT_STARTS"]).readlines()),
                  "argv": sys.argv[1:], "env": os.environ.get("CAPD_LAYOUT_PROBE"),
                  "lc": os.environ.get("LC_CTYPE"),
                  "mmap": ctypes.addressof(ctypes.c_char.from_buffer(m)),
                  "personality": open("/proc/self/personality").read().strip()}))
"""


# A seccomp filter, as a container runtime's profile would install, that
# lets personality() only query (0xffffffff) and answers any other value
# EPERM; then it execs its arguments. x86_64 only; exits 77 where the
# kernel takes no filter from this process.
DENY_PERSONALITY = r"""
import ctypes, os, platform, sys
if platform.machine() != "x86_64":
    sys.exit(77)
libc = ctypes.CDLL(None, use_errno=True)
libc.personality.argtypes = [ctypes.c_ulong]
cur = libc.personality(0xFFFFFFFF)
libc.personality(cur & ~0x0040000)  # a parent's fixed layout is not inherited
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
prog = (F * 8)(F(0x20, 0, 0, 4), F(0x15, 0, 5, 0xC000003E),    # arch x86_64, else allow
               F(0x20, 0, 0, 0), F(0x15, 0, 3, 135),            # personality, else allow
               F(0x20, 0, 0, 16), F(0x15, 1, 0, 0xFFFFFFFF),    # a query: allow
               F(0x06, 0, 0, 0x00050001), F(0x06, 0, 0, 0x7FFF0000))  # EPERM; allow
if libc.prctl(38, 1, 0, 0, 0) != 0 or \
        libc.prctl(22, 2, ctypes.byref(P(8, prog)), 0, 0) != 0:
    sys.exit(77)
os.execv(sys.argv[1], sys.argv[1:])
"""


def probe(env=None, prefix=()):
    with tempfile.TemporaryDirectory() as d:
        e = dict(os.environ, PYTHONPATH=RUNNER_DIR, CAPD_LAYOUT_PROBE="kept",
                 CAPD_LAYOUT_STARTS=os.path.join(d, "starts"))
        e.pop("LC_CTYPE", None)
        e.update(env or {})
        out = subprocess.run(list(prefix) + [sys.executable, "-c", PROBE, "a1", "a2"],
                             env=e, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError("probe failed: %s" % out.stderr)
    return json.loads(out.stdout)


def refused(st):
    return st["state"].startswith("randomized: the kernel refused")


class FixedLayout(unittest.TestCase):
    def test_two_processes_map_the_same_addresses(self):
        a, b = probe(), probe()
        if refused(a):
            self.skipTest("this host refuses personality(ADDR_NO_RANDOMIZE): %s" % a["state"])
        self.assertEqual(a["state"], "fixed")
        self.assertEqual(a["mmap"], b["mmap"])
        self.assertEqual(a["starts"], 2, "the interpreter started again, once")
        # the flag is the kernel's, and the exec kept what the process was
        self.assertEqual(int(a["personality"], 16) & 0x0040000, 0x0040000)
        self.assertEqual(a["argv"], ["a1", "a2"])
        self.assertEqual(a["env"], "kept")
        # the C locale's PEP 538 coercion is not carried into the exec's environment
        self.assertEqual(probe({"LC_ALL": "", "LANG": "C"})["state"], "fixed")

    def test_a_process_already_fixed_is_not_exec_again(self):
        try:
            a = probe(prefix=("setarch", "-R"))
        except (OSError, AssertionError) as e:
            self.skipTest("setarch -R cannot run here: %s" % e)
        self.assertEqual(a["state"], "fixed")
        self.assertEqual(a["starts"], 1)

    def test_where_the_kernel_refuses_the_process_goes_on_and_says_why(self):
        try:
            a = probe(prefix=(sys.executable, "-c", DENY_PERSONALITY))
        except AssertionError as e:
            self.skipTest("no seccomp filter can be installed here: %s" % e)
        self.assertEqual(a["state"], "randomized: the kernel refused "
                         "personality(ADDR_NO_RANDOMIZE): Operation not permitted")
        self.assertTrue(refused(a))
        self.assertEqual(a["starts"], 1, "not started again")
        self.assertEqual(int(a["personality"], 16) & 0x0040000, 0)
        self.assertEqual(a["argv"], ["a1", "a2"])

    def test_without_the_entry_point_the_state_says_so(self):
        code = ("import json; from capd_runner import layout; "
                "print(json.dumps(layout.state()))")
        e = dict(os.environ, PYTHONPATH=RUNNER_DIR)
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout),
                         "randomized: the runner's entry point did not fix it")


if __name__ == "__main__":
    unittest.main()
