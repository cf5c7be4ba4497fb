"""Paired timing (docs/runner.md, "Paired timing"): a head cell whose spec
names a reference (the control build) alternates the control build's timing
processes, from its own interpreter and environment, with its own; more
rounds while the pairs leave the verdict unknown; unpaired when the control
build cannot run."""

import math
import os
import sys
import unittest

from tests import util
from tests.framereader import RUNNER_DIR
from capd_runner import pairs

# A forward pass of an exact length: SIDE_SLOW (the side's environment)
# times 2 ms, busy-waited. SIDE_SLOW_EVERY=k:m makes the m first of every k
# processes of that side (counted in a file of the scratch dir) 1.2 times
# slower: pairs whose verdict stays unknown.
MODEL = {"side/__init__.py": "", "side/m.py": '''
import fcntl, os, time, torch

def _factor():
    f = float(os.environ.get("SIDE_SLOW", "1"))
    every = os.environ.get("SIDE_SLOW_EVERY")
    if every:
        k, m = (int(x) for x in every.split(":"))
        path = os.path.join(os.environ["SIDE_COUNTER_DIR"], "count")
        with open(path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            n = len(fh.read())
            fh.write("x")
        if n % k < m:
            f *= 1.2
    return f

class Exact(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ns = int(2e6 * _factor())
    def forward(self, x):
        end = time.perf_counter_ns() + self.ns
        while time.perf_counter_ns() < end:
            pass
        return x * 2

def make(seed, batch, dtype):
    return Exact(), torch.ones(2, 2, dtype=dtype)
'''}


def _spec(root, ref_env, **options):
    opts = dict(iterations=3, warmup=1, timing_pairs=5, max_timing_rounds=3)
    opts.update(options)
    spec = util.make_spec("side.m:make", model_roots=[root], **opts)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": RUNNER_DIR, "HOME": root,
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(ref_env)
    spec["reference"] = {"build": "control", "job": "jcontrol", "commit": "abcdef0",
                         "python": sys.executable, "model_roots": [root], "env": env}
    spec["cpus"] = sorted(os.sched_getaffinity(0))[-1:]
    return spec


class PairsTest(unittest.TestCase):
    def setUp(self):
        self.root = util.tempdir()
        util.write_tree(self.root, MODEL)

    def test_interleaved_control_then_head(self):
        # One round, so the count does not hang on whether the host's noise
        # let 5 pairs decide (the round rule has its own tests below).
        spec = _spec(self.root, {"SIDE_SLOW": "1"}, max_timing_rounds=1)
        r = util.run(spec, env={"SIDE_SLOW": "1.5"})
        self.assertEqual(r.status, "ok", r.describe())
        ts = r.kinds("timing")
        self.assertEqual(len(ts), 10, "5 pairs in one round")
        self.assertEqual([(t["pair"], bool(t.get("reference"))) for t in ts],
                         [(i // 2, i % 2 == 0) for i in range(10)])
        # Ran in that order, one at a time, on the cell's CPUs.
        for a, b in zip(ts, ts[1:]):
            self.assertLessEqual(a["ended_ns"], b["started_ns"])
        self.assertTrue(all(t["cpus"] == spec["cpus"] for t in ts))
        self.assertTrue(all(t["round"] == 0 and t["processes"] == 5 for t in ts))
        # Each side in its own environment: the head 1.5 times the control.
        # A loaded host only ever adds time to a busy-wait, so the fastest
        # of each side's 15 samples is the one to compare.
        ctl = min(min(t["samples_ns"]) for t in ts if t.get("reference"))
        head = min(min(t["samples_ns"]) for t in ts if not t.get("reference"))
        self.assertGreater(head / ctl, 1.4)
        self.assertLess(head / ctl, 1.6)
        keys = [t["key"] for t in r.tensors]
        self.assertEqual(len(keys), len(set(keys)), "numerics captured once")
        # One intra-op thread on the CPU: each sample also in the thread's
        # CPU time, which a busy-wait accrues no faster than the wall clock.
        for t in ts:
            self.assertEqual(t["threads"], 1)
            self.assertEqual(len(t["cpu_samples_ns"]), len(t["samples_ns"]))
            for c, w in zip(t["cpu_samples_ns"], t["samples_ns"]):
                self.assertLessEqual(c, w * 1.01 + 100000, t)
                self.assertGreater(c, 0)
            # Own time where the kernel keeps a run-queue delay (runqueue_ns
            # not null): each sample less it, never more than the sample.
            if t["runqueue_ns"] is None:
                self.assertNotIn("own_samples_ns", t)
                continue
            self.assertEqual(len(t["own_samples_ns"]), len(t["samples_ns"]))
            for o, w in zip(t["own_samples_ns"], t["samples_ns"]):
                self.assertLessEqual(o, w, t)

    def test_undecided_pairs_get_more_rounds(self):
        # One pair a round. One pair cannot be tested at all; then the head
        # side's every second process is 1.2 times slower (the cell's own
        # capture builds the model first, so its timing processes run fast,
        # slow, fast): pairs of ratio 1.0 and 1.2 leave the verdict unknown
        # however quiet the host, so the round rule asks for a second and a
        # third round, and stops at max_timing_rounds.
        counter = util.tempdir()
        spec = _spec(self.root, {"SIDE_SLOW": "1"}, timing_pairs=1, max_timing_rounds=3)
        r = util.run(spec, env={"SIDE_SLOW_EVERY": "2:1", "SIDE_COUNTER_DIR": counter})
        self.assertEqual(r.status, "ok", r.describe())
        ts = r.kinds("timing")
        self.assertEqual(len(ts), 6, "3 rounds of 1 pair: %s" % [t["round"] for t in ts])
        self.assertEqual([t["round"] for t in ts], [i // 2 for i in range(6)])
        self.assertEqual([t["pair"] for t in ts], [i // 2 for i in range(6)])
        self.assertEqual([t["processes"] for t in ts], [i // 2 + 1 for i in range(6)])

    def test_round_rule(self):
        # The rule itself, on observations whose verdict is known: more
        # rounds for unknown and insufficient_data, none once decided.
        ctl = [1.0] * 8
        cases = {
            "unknown": [1.0 + 0.001 * i for i in range(1, 6)] + [1.2] * 3,
            "regression": [1.3 + 0.001 * i for i in range(8)],
            "improvement": [0.7 + 0.001 * i for i in range(8)],
            "same": [1.0 + 0.001 * i for i in range(1, 9)],
            "unstable": [1.0 + 0.001 * i for i in range(1, 5)] + [1.3, 1.35, 1.4, 1.45],
            "insufficient_data": [1.3],
        }
        for want, head in cases.items():
            got = pairs.verdict(ctl[:len(head)], head)
            self.assertEqual(got, want, head)
            self.assertEqual(pairs.wants_more(ctl[:len(head)], head),
                             want in ("unknown", "insufficient_data"), want)

    def test_decisive_change_before_spread_and_round_sizes(self):
        # About 25% slower with a 6% spread (capd's compare/perf.c decides
        # the same, tests/test_compare.c): a regression, not unstable.
        lr = [0.270, 0.309, 0.269, 0.210, 0.190]
        ctl = [1.0] * 5
        self.assertEqual(pairs.verdict(ctl, [math.exp(x) for x in lr]), "regression")
        # Centred: the 90% interval lies within 1 +- 0.05 (same, whatever
        # the spread); with twice the spread it does not (unstable).
        self.assertEqual(pairs.verdict(ctl, [math.exp(x - 0.25) for x in lr]), "same")
        self.assertEqual(pairs.verdict(ctl, [math.exp(2 * (x - 0.25)) for x in lr]), "unstable")
        # The first round takes timing_pairs, later ones half, rounded up.
        self.assertEqual([pairs.round_size(4, r) for r in range(3)], [4, 2, 2])
        self.assertEqual([pairs.round_size(5, r) for r in range(3)], [5, 3, 3])
        self.assertEqual([pairs.round_size(1, r) for r in range(3)], [1, 1, 1])

    def test_student_t_against_the_tables(self):
        # Two-sided 0.01 points of t (printed tables); the C twin of these
        # functions is compare/student_t.c, tested against the same values.
        for df, t01 in ((1, 63.657), (4, 4.604), (9, 3.250), (30, 2.750)):
            self.assertAlmostEqual(pairs.t_quantile(0.01, df), t01, places=3)
            self.assertAlmostEqual(pairs.t_p(t01, df), 0.01, places=5)

    def test_one_round_when_asked(self):
        counter = util.tempdir()
        spec = _spec(self.root, {"SIDE_SLOW": "1"}, max_timing_rounds=1, timing_pairs=4)
        r = util.run(spec, env={"SIDE_SLOW_EVERY": "8:3", "SIDE_COUNTER_DIR": counter})
        self.assertEqual(r.status, "ok", r.describe())
        self.assertEqual(len(r.kinds("timing")), 8)

    def test_control_that_cannot_run_is_unpaired(self):
        spec = _spec(self.root, {"SIDE_SLOW": "1"}, timing_processes=3)
        spec["reference"]["python"] = os.path.join(self.root, "no-such-python")
        r = util.run(spec)
        self.assertEqual(r.status, "ok", r.describe())
        ts = r.kinds("timing")
        self.assertEqual([t["process"] for t in ts], [0, 1, 2])
        self.assertFalse(any(t.get("pair") is not None or t.get("reference") for t in ts))
        self.assertIn("timing unpaired", " ".join(n["message"] for n in r.kinds("note")))

    def test_control_that_fails_to_import_is_unpaired(self):
        spec = _spec(self.root, {"PYTHONPATH": "/nonexistent"}, timing_processes=2)
        r = util.run(spec)
        self.assertEqual(r.status, "ok", r.describe())
        ts = r.kinds("timing")
        self.assertEqual(len(ts), 2)
        self.assertFalse(any(t.get("reference") for t in ts))

    def test_bad_reference_is_a_spec_error(self):
        spec = _spec(self.root, {})
        spec["reference"]["env"] = {"A": 1}
        r = util.run(spec)
        self.assertEqual(r.status, "failed")
        self.assertIn("reference.env", r.end["reason"])


if __name__ == "__main__":
    unittest.main()
