"""Own time (docs/runner.md, "Own time"): cell.timing_run's samples in
each clock, measured in this process on real models. A sample's own time
is its wall time less the timing thread's run-queue delay: the model's own
waiting (a sleep) stays in, the time a competing process held the CPU does
not."""

import os
import subprocess
import sys
import time
import types
import unittest

import torch

from capd_runner import cell, clocks


class Sleeps(torch.nn.Module):
    """A forward that waits 2 ms and computes almost nothing."""

    def forward(self, x):
        time.sleep(0.002)
        return x * 2


class Computes(torch.nn.Module):
    """A forward of a fixed amount of work on this thread, longer than the
    scheduler's slice so that a competitor takes its turns inside the
    sample (no clock in it: a busy-wait until a deadline would end on time
    however long it waited)."""

    def forward(self, x):
        n = 0
        for i in range(300000):
            n += i
        return x + n


def _spec(iterations=5):
    return types.SimpleNamespace(pass_="forward", warmup=1, iterations=iterations,
                                 timing_min_ms=0, seed=0)


def _run(model):
    call = cell.Call((torch.ones(2, 2),))
    return cell.timing_run(torch, model, call, _spec(), None, torch.device("cpu"))


def _median(v):
    s = sorted(v)
    return s[len(s) // 2]


class OwnTimeTest(unittest.TestCase):
    def setUp(self):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.delay = clocks.ThreadDelay()
        self.delay.close()
        if not self.delay.ok:
            self.skipTest("this kernel keeps no run-queue delay: %s" % self.delay.why)

    def tearDown(self):
        torch.set_num_threads(self.threads)

    def test_own_samples_within_wall_and_a_sleep_counts(self):
        r = _run(Sleeps())
        wall, own, cpu = r["samples_ns"], r["own_samples_ns"], r["cpu_samples_ns"]
        self.assertEqual(len(own), len(wall))
        self.assertEqual(r["loops"], 1)
        for o, w in zip(own, wall):
            self.assertLessEqual(o, w)
            # The sleep is the model's own waiting: never taken off.
            self.assertGreaterEqual(o, 2000000, r)
        # It costs no CPU time, which therefore cannot judge it.
        self.assertLess(_median(cpu), _median(own) / 2, r)
        self.assertIsInstance(r["runqueue_ns"], int)
        self.assertGreaterEqual(r["runqueue_ns"], 0)
        self.assertGreater(r["cpu_ns"], 0)
        self.assertTrue(r["steal_ns"] is None or r["steal_ns"] >= 0)

    def test_a_competitor_on_the_cpu_is_left_out(self):
        # This thread and a busy loop on one CPU: the scheduler shares it,
        # the wall time grows by the loop's share, the own time does not:
        # it stays the thread's CPU time (the model only computes), never
        # below it. Judged against the same samples' CPU time, not against
        # a run alone, whose speed another tenant of the host (a test
        # beside this one, an SMT sibling) may change by itself.
        old = os.sched_getaffinity(0)
        cpu = max(old)
        os.sched_setaffinity(0, {cpu})
        try:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                   preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
            try:
                time.sleep(0.05)
                shared = _run(Computes())
            finally:
                hog.kill()
                hog.wait()
        finally:
            os.sched_setaffinity(0, old)
        wall, own = _median(shared["samples_ns"]), _median(shared["own_samples_ns"])
        cpu_time = _median(shared["cpu_samples_ns"])
        self.assertGreater(wall / own, 1.4, shared)
        self.assertGreater(shared["runqueue_ns"], 0)
        self.assertLess(own, 1.25 * cpu_time, shared)
        self.assertGreater(own, 0.97 * cpu_time, shared)


if __name__ == "__main__":
    unittest.main()
