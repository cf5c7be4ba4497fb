"""The clocks a timing process reads besides the wall clock (docs/runner.md,
"Own time").

A sample's wall time counts everything that happened while the model ran:
its own work, its own waiting (a sleep, a lock, I/O, a device
synchronisation, a thread pool's barrier) and the time other work held the
CPU it wanted. Only the last is not the build's doing. Linux counts it per
thread as the run-queue delay, the second field of
``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds the thread spent runnable
but waiting for a CPU), so a sample's **own time** is its wall time less the
timing thread's run-queue delay over it. Where the kernel keeps no such
count (``CONFIG_SCHED_INFO`` off, or off at run time: the file then reads
``0 0 0`` even for the running thread) the runner says so by sending
``runqueue_ns`` null, and capd judges on wall time, which the exclusive CPUs
of a timing cell keep honest.

In a VM the hypervisor may also take the CPU away from the whole guest
(steal time). The guest's scheduler does not see that, so it stays in the
own time; the host-wide steal of ``/proc/stat`` over the process's timed
samples is reported beside it as context only.

On a GPU a sample's **device time** is read by the device's own clock: an
event recorded on the current stream before the sample's iterations and
one after them (``torch.cuda.Event(enable_timing=True)``, which HIP builds
of torch map to HIP events), their elapsed time once the sample has
synchronised. It is the span of the pass on the device, its kernels and
the gaps where the device waited for the host, without the host's wait for
the final synchronisation (``DeviceEvents``).
"""

import fcntl
import os
import threading

SCHEDSTAT = "/proc/thread-self/schedstat"
HIGH_FD = 200


def _fields(raw):
    parts = raw.split()
    if len(parts) < 3:
        return None
    try:
        return [int(x) for x in parts[:3]]
    except ValueError:
        return None


def _high(fd):
    """FD moved to a high number, so that the model's code finds the low
    descriptors as they were without the runner's reads (a timing process
    has no fd 3, the frame pipe)."""
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    except OSError:
        return fd
    os.close(fd)
    return high


class ThreadDelay(object):
    """The run-queue delay of the thread that created it, read on demand
    (``now()``, nanoseconds). ``ok`` is False, with ``why`` saying so, when
    the kernel keeps no such count; ``now()`` then returns 0."""

    def __init__(self, path=SCHEDSTAT):
        self.fd = None
        self.ok = False
        self.why = None
        try:
            if not os.path.exists(path):
                # before Linux 3.17: the thread's own entry under /proc/self/task
                tid = getattr(threading, "get_native_id", os.getpid)()
                path = "/proc/self/task/%d/schedstat" % tid
            self.fd = _high(os.open(path, os.O_RDONLY))
            f = _fields(os.pread(self.fd, 128, 0))
        except OSError as e:
            self.why = "no %s: %s" % (path, e)
            self.close()
            return
        # A running thread has run: "0 0 0" is a kernel that counts nothing.
        if f is None or f[0] == 0:
            self.why = "%s has no run-queue delay (schedstat reads %r)" % (path, f)
            self.close()
            return
        self.ok = True

    def now(self):
        if not self.ok:
            return 0
        f = _fields(os.pread(self.fd, 128, 0))
        return f[1] if f else 0

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def process_delays():
    """{tid: run-queue delay} of every thread of this process; {} where the
    kernel gives none."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/self/task/%s/schedstat" % tid, "rb") as fh:
                f = _fields(fh.read(128))
        except OSError:
            continue  # it ended meanwhile
        if f is not None:
            out[tid] = f[1]
    return out


def delay_since(before):
    """The run-queue delay of this process's threads since ``before`` (a
    process_delays()): a thread started since counts from 0, one that ended
    meanwhile is lost (OpenMP's and ATen's pools live as long as the
    process)."""
    now = process_delays()
    return sum(max(0, v - before.get(tid, 0)) for tid, v in now.items())


def steal_ns():
    """The host's steal time so far (every CPU of /proc/stat's "cpu" line),
    nanoseconds, or None where it is not visible."""
    try:
        with open("/proc/stat", "rb") as fh:
            first = fh.readline().split()
        ticks = int(first[8])  # cpu user nice system idle iowait irq softirq steal
        return ticks * 1000000000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class DeviceEvents(object):
    """Two timing events of the current device stream: ``start()`` and
    ``stop()`` record them, ``elapsed_ns()`` (after a synchronisation)
    reads the device's time between them."""

    def __init__(self, torch):
        self.a = torch.cuda.Event(enable_timing=True)
        self.b = torch.cuda.Event(enable_timing=True)

    def start(self):
        self.a.record()

    def stop(self):
        self.b.record()

    def elapsed_ns(self):
        self.b.synchronize()
        return int(self.a.elapsed_time(self.b) * 1e6)  # milliseconds, a float
