"""How timing processes start and how long they may take
(capd_runner/timing.py; docs/runner.md, "Timing processes: fork or exec,
and their time limit"): forks of a template while the cell has no other
thread, fresh interpreters where the build's code started one (a fork
would copy a lock that thread holds, held forever in the copy), and each
killed past its own limit while the cell goes on."""

import json
import os
import subprocess
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

from tests import util
from tests.framereader import RUNNER_DIR

# A build whose code starts a thread at start-up: its sitecustomize imports
# lockbuild, whose thread holds a lock nine tenths of the time, and every
# Linear's forward takes that lock. A fork made while the thread holds it
# copies a held lock and no thread to release it.
LOCK_BUILD = {
    "sitecustomize.py": "import lockbuild  # noqa: F401\n",
    "lockbuild.py": '''
import threading, time, torch

LOCK = threading.Lock()

def _holder():
    while True:
        with LOCK:
            time.sleep(0.009)
        time.sleep(0.001)

threading.Thread(target=_holder, name="lockbuild", daemon=True).start()
_forward = torch.nn.Linear.forward

def _locked_forward(self, x):
    with LOCK:
        return _forward(self, x)

torch.nn.Linear.forward = _locked_forward
''',
    "lockmodels/__init__.py": "",
    "lockmodels/m.py": '''
import torch

def make(seed, batch, dtype):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    return model, torch.ones(batch, 8, dtype=dtype)
''',
}

# A model whose forward sleeps for an hour in timing processes: the first
# call of the factory is the cell's own (its capture); after it, HANG=first
# hangs the first timing process only, HANG=all every one.
HANG_MODEL = {
    "hang/__init__.py": "",
    "hang/m.py": '''
import os, time, torch

def _claim(name):
    try:
        os.close(os.open(os.path.join(os.environ["HANG_DIR"], name),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False

class Hang(torch.nn.Module):
    def __init__(self, hang):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.hang = hang

    def forward(self, x):
        if self.hang:
            time.sleep(3600)
        return self.lin(x)

def make(seed, batch, dtype):
    if _claim("cell"):
        hang = False
    else:
        hang = os.environ.get("HANG") == "all" or _claim("first")
    return Hang(hang), torch.ones(batch, 4, dtype=dtype)
''',
}

# No cell here may take this long: every one of them hung (the cell
# timeout of 600 s) before timing processes had a time of their own.
BOUND_S = 120
# What capd sets for a cell of one thread (docs/runner.md, "What a cell
# does"): without it numpy's OpenBLAS starts a thread pool as the official
# wheel's torch imports it, and the cell would not be single-threaded.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _timed(job):
    spec, kw = job
    t0 = time.monotonic()
    r = util.run(spec, timeout=BOUND_S, **kw)
    r.seconds = time.monotonic() - t0
    return r


# The lifecycle alone, without torch (so any Python 3 runs it): run_one
# with _one_process replaced before the fork, the limits, fork_refusal and
# the budget. Prints one JSON object.
LIFECYCLE = r'''
import json, os, signal, threading, time
from capd_runner import timing

class Spec(object):
    timeout_s, timing_processes, timing_pairs, iterations, reference = 600, 5, 4, 20, None

def answer(spec, index, fd):
    os.write(fd, (json.dumps({"process": index, "samples_ns": [1]}) + "\n").encode())

def sleep(spec, index, fd):
    time.sleep(3600)

def die(spec, index, fd):
    os.kill(os.getpid(), signal.SIGKILL)

def boom(spec, index, fd):
    raise ValueError("boom")

out = {}
for name, fn in (("answer", answer), ("sleep", sleep), ("die", die), ("boom", boom)):
    timing._one_process = fn
    t0 = time.monotonic()
    out[name] = timing.run_one(Spec(), 0, 1.0, None)
    out[name]["seconds"] = time.monotonic() - t0
paired, short = Spec(), Spec()
paired.reference, short.timeout_s = {}, 20
out["limits"] = [timing.process_limit_s(s) for s in (Spec(), paired, short)]
out["alone"] = timing.fork_refusal("the cell")
ev = threading.Event()
t = threading.Thread(target=ev.wait)
t.start()
out["beside"] = timing.fork_refusal("the cell")
ev.set()
t.join()
b = timing.Budget(Spec())
b.deadline = time.monotonic() + 65
out["budget"] = [b.next(0)[0]]
b.deadline = time.monotonic() + 5.8
out["budget"].append(b.next(1)[1])
print(json.dumps(out))
'''


class LifecycleTest(unittest.TestCase):
    def test_start_wait_kill(self):
        r = subprocess.run([util.PYTHON, "-c", LIFECYCLE], env={"PYTHONPATH": RUNNER_DIR},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        out = json.loads(r.stdout.decode())
        ok = out["answer"]
        self.assertEqual((ok["samples_ns"], ok["start"]), ([1], "fork"))
        self.assertNotIn("start_why", ok)
        self.assertLess(ok["seconds"], 1)
        slept = out["sleep"]
        self.assertTrue(slept["killed"])
        self.assertEqual(slept["error"], "timing process 0 did not finish in 1 s (killed); "
                                         "it was forked from a process with 1 thread")
        self.assertLess(slept["seconds"], 5)
        self.assertEqual(out["die"]["error"], "timing process killed by signal 9")
        self.assertNotIn("killed", out["die"], "a crash fails the cell; only a timeout goes on")
        self.assertEqual(out["boom"]["error"], "ValueError: boom")
        self.assertIn("Traceback", out["boom"]["traceback"])
        # 600 s over 5 processes, or 8 of 4 pairs, and half again; at least 30.
        self.assertEqual(out["limits"], [180, 113, 30])
        self.assertIsNone(out["alone"])
        self.assertEqual(out["beside"], "the cell had 2 threads when its timing processes were "
                         "due: forking would copy locks they hold, which no thread would "
                         "release in the copy")
        self.assertAlmostEqual(out["budget"][0], 60, delta=1)
        skipped = out["budget"][1]
        self.assertTrue(skipped["skipped"])
        self.assertIn("timing process 1 not started: 6 s of the cell's timeout_s=600 s are left",
                      skipped["error"])


class TimingStartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        root = util.model_tree(dict(LOCK_BUILD, **HANG_MODEL))
        lock_env = dict(ONE_THREAD, PYTHONPATH=RUNNER_DIR + os.pathsep + root)
        plain = dict(ONE_THREAD, PYTHONPATH=RUNNER_DIR)
        first, every = util.tempdir(), util.tempdir()
        cases = {
            # The build's thread is running when the cell's timing is due.
            "lock": (util.make_spec("lockmodels.m:make", model_roots=[root], iterations=3,
                                    warmup=1, timing_processes=3), {"env": lock_env}),
            # Nothing starts a thread: the timing processes are forks.
            "plain": (util.make_spec("lockmodels.m:make", model_roots=[root], iterations=3,
                                     warmup=1, timing_processes=2), {"env": plain}),
            # Timing process 0 sleeps: killed at its own limit, 1 and 2
            # time (timeout_s 45 over 3 processes: 22.5 s and half again,
            # at least 30 s).
            "first": (util.make_spec("hang.m:make", model_roots=[root], iterations=2,
                                     timing_processes=3, timeout_s=45),
                      {"env": dict(plain, HANG_DIR=first, HANG="first")}),
            # Every timing process sleeps, exec'd beside the build's thread;
            # timeout_s 14 leaves the first one what the cell has left, and
            # none to the second.
            "every": (util.make_spec("hang.m:make", model_roots=[root], iterations=2,
                                     timing_processes=2, timeout_s=14),
                      {"env": dict(lock_env, HANG_DIR=every, HANG="all")}),
        }
        names = list(cases)
        with ThreadPoolExecutor(max_workers=len(names)) as ex:
            cls.res = dict(zip(names, ex.map(_timed, [cases[n] for n in names])))

    def test_a_build_thread_means_exec(self):
        r = self.res["lock"]
        self.assertEqual(r.status, "ok", r.describe())
        self.assertLess(r.seconds, BOUND_S)
        ts = r.kinds("timing")
        self.assertEqual([t["process"] for t in ts], [0, 1, 2])
        self.assertEqual([t["start"] for t in ts], ["exec"] * 3)
        self.assertTrue(all(len(t["samples_ns"]) == 3 for t in ts))
        why = [m for m in r.notes("warn") if "fresh interpreters (exec)" in m]
        self.assertEqual(len(why), 1, r.notes())
        self.assertIn("the cell had 2 threads when its timing processes were due", why[0])
        self.assertIn("forking would copy locks they hold", why[0])
        self.assertIn(why[0], r.stderr, "the cell's log says it too")

    def test_single_threaded_cell_forks(self):
        r = self.res["plain"]
        self.assertEqual(r.status, "ok", r.describe())
        self.assertEqual([t["start"] for t in r.kinds("timing")], ["fork", "fork"])
        self.assertFalse([m for m in r.notes() if "exec" in m], r.notes())

    def test_hung_timing_process_is_killed_and_the_cell_goes_on(self):
        r = self.res["first"]
        self.assertEqual(r.status, "ok", r.describe())
        self.assertLess(r.seconds, 60)
        ts = r.kinds("timing")
        self.assertEqual([(t["process"], t["processes"]) for t in ts], [(1, 3), (2, 3)])
        self.assertEqual([t["start"] for t in ts], ["fork", "fork"])
        warns = r.notes("warn")
        self.assertTrue(any("timing process 0 did not finish in 30 s (killed)" in m
                            and "forked from a process with 1 thread" in m
                            and "the cell goes on without it" in m for m in warns), warns)

    def test_no_time_left_in_the_cell(self):
        r = self.res["every"]
        self.assertEqual(r.status, "ok", r.describe())
        self.assertLess(r.seconds, 14)
        self.assertEqual(r.kinds("timing"), [])
        warns = "\n".join(r.notes("warn"))
        self.assertIn("timing process 0 did not finish in", warns)
        self.assertIn("it was a fresh interpreter (exec), as the cell had 2 threads", warns)
        self.assertIn("timing process 1 not started", warns)
        self.assertIn("timeout_s=14 s", warns)
        self.assertIn("none of the 2 timing processes finished", warns)


class PairedTimingStartTest(unittest.TestCase):
    def test_control_build_thread_means_exec(self):
        # The control build's template starts a thread as it imports torch
        # (its sitecustomize); the head's does not.
        root = util.model_tree(LOCK_BUILD)
        env = dict(ONE_THREAD, PATH="/usr/bin:/bin", PYTHONPATH=RUNNER_DIR + os.pathsep + root,
                   HOME=root, LANG="C.UTF-8", PYTHONDONTWRITEBYTECODE="1")
        spec = util.make_spec("lockmodels.m:make", model_roots=[root], iterations=2,
                              warmup=1, timing_pairs=2, max_timing_rounds=1)
        spec["reference"] = {"build": "control", "job": "jcontrol", "commit": "abcdef0",
                             "python": util.PYTHON, "model_roots": [root], "env": env}
        t0 = time.monotonic()
        r = util.run(spec, timeout=BOUND_S, env=ONE_THREAD)
        self.assertEqual(r.status, "ok", r.describe())
        self.assertLess(time.monotonic() - t0, BOUND_S)
        ts = r.kinds("timing")
        self.assertEqual([(t["pair"], bool(t.get("reference")), t["start"]) for t in ts],
                         [(0, True, "exec"), (0, False, "fork"),
                          (1, True, "exec"), (1, False, "fork")])
        why = [m for m in r.notes("warn") if "fresh interpreters (exec)" in m]
        self.assertEqual(len(why), 1, r.notes())
        self.assertIn("the control build's timing processes", why[0])
        self.assertIn("the control build's timing template had 2 threads", why[0])

    def test_both_sides_time_in_templates_of_their_own_builds(self):
        # The spec names the head build's own side (capd does for every
        # paired cell): its template starts as the control's does, in the
        # head build's environment, which makes its forward sleep 3 ms;
        # the cell's own environment has no such variable.
        root = util.model_tree({"sidemodels.py": SIDE_MODEL})
        base = dict(ONE_THREAD, PATH="/usr/bin:/bin", PYTHONPATH=RUNNER_DIR + os.pathsep + root,
                    HOME=root, LANG="C.UTF-8", PYTHONDONTWRITEBYTECODE="1")
        spec = util.make_spec("sidemodels:make", model_roots=[root], iterations=3,
                              warmup=1, timing_pairs=2, max_timing_rounds=1, timing_min_ms=0)
        spec["reference"] = {"build": "control", "job": "jcontrol", "commit": "abcdef0",
                             "python": util.PYTHON, "model_roots": [root], "env": base,
                             "head": {"python": util.PYTHON, "model_roots": [root],
                                      "env": dict(base, SIDE_SLEEP_S="0.003")}}
        r = util.run(spec, timeout=BOUND_S, env=ONE_THREAD)
        self.assertEqual(r.status, "ok", r.describe())
        ts = r.kinds("timing")
        self.assertEqual([(t["pair"], bool(t.get("reference")), t["start"]) for t in ts],
                         [(0, True, "fork"), (0, False, "fork"),
                          (1, True, "fork"), (1, False, "fork")])
        ctl = [min(t["samples_ns"]) for t in ts if t.get("reference")]
        head = [min(t["samples_ns"]) for t in ts if not t.get("reference")]
        for c, h in zip(ctl, head):
            self.assertGreater(h - c, 2.5e6, "the head's processes run in the head's env")


# A model whose forward sleeps SIDE_SLEEP_S seconds (the environment of the
# template its process was forked from).
SIDE_MODEL = """
import os, time, torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.sleep = float(os.environ.get("SIDE_SLEEP_S", "0"))
    def forward(self, x):
        if self.sleep:
            time.sleep(self.sleep)
        return self.fc(x)
def make(seed, batch, dtype):
    torch.manual_seed(seed)
    return M(), (torch.randn(2, 8),)
"""


if __name__ == "__main__":
    unittest.main()
