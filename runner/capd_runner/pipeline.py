"""Analysis pipeline: stats, hash, payload and frame writing off the model's
thread.

A capture hook only snapshots the tensor (one copy into a reused CPU buffer)
and queues a job; one worker thread computes the stats and the BLAKE2b hash
of the snapshot (both release the GIL while they run, so they overlap with
the model's own kernels), encodes the frame and writes it. Jobs are handled
in order, so frames keep the order of ``seq``. The number of queued jobs and
snapshot bytes is bounded (the hook waits when the worker is behind), which
also bounds how many finished records a crash can lose; the worker flushes
the frame pipe whenever it catches up.

CUDA tensors: their stats are computed on the device in the hook (one
synchronisation), and only the hash of the host copy goes to the worker.

With CAPD_RUNNER_SYNC=1 in the environment (or sync=True) every job runs
inline in the hook and frames are flushed at each hook: slower, but a crash
loses nothing already recorded.
"""

import os
import sys
import threading
import traceback
from collections import deque

import torch

from capd_runner import tensors as T

MAX_JOBS = 128
MAX_BYTES = 128 << 20
POOL_BYTES = 256 << 20


class WorkerError(Exception):
    pass


class BufferPool(object):
    """Free CPU buffers by (dtype, numel): fresh large allocations cost page
    faults every time, reused ones do not."""

    def __init__(self, limit=POOL_BYTES):
        self.free = {}
        self.bytes = 0
        self.limit = limit
        self.lock = threading.Lock()

    def take(self, dtype, numel):
        with self.lock:
            lst = self.free.get((dtype, numel))
            if lst:
                buf = lst.pop()
                self.bytes -= buf.numel() * buf.element_size()
                return buf
        return torch.empty(numel, dtype=dtype)

    def give(self, buf):
        n = buf.numel() * buf.element_size()
        with self.lock:
            if self.bytes + n > self.limit:
                return
            self.free.setdefault((buf.dtype, buf.numel()), []).append(buf)
            self.bytes += n

    def clear(self):
        with self.lock:
            self.free.clear()
            self.bytes = 0


class Pipeline(object):
    def __init__(self, writer, sync=None):
        if sync is None:
            sync = os.environ.get("CAPD_RUNNER_SYNC", "") not in ("", "0")
        self.writer = writer
        self.sync = sync
        # Compute CPU stats in the hook instead of the worker (experiments).
        self.stats_in_hook = False
        self.pool = BufferPool()
        self.engine = T.StatsEngine()  # used by the worker (or inline) only
        self._cv = threading.Condition()
        self._jobs = deque()
        self._pending_bytes = 0
        self._busy = False
        self._error = None
        self._stop = False
        self._thread = None
        if not sync:
            self._thread = threading.Thread(target=self._run, name="capd-analysis")
            self._thread.daemon = True
            self._thread.start()

    # -- producer side (hooks) ----------------------------------------------
    def submit(self, job, nbytes=0):
        if self.sync:
            job()
            return
        with self._cv:
            self._raise_if_error()
            while (len(self._jobs) >= MAX_JOBS or
                   (self._pending_bytes + nbytes > MAX_BYTES and self._jobs)):
                self._cv.wait()
                self._raise_if_error()
            self._jobs.append((job, nbytes))
            self._pending_bytes += nbytes
            self._cv.notify_all()

    def drain(self):
        """Wait until every queued job is done; raise the worker's error."""
        if self.sync:
            return
        with self._cv:
            while (self._jobs or self._busy) and self._error is None:
                self._cv.wait()
            self._raise_if_error()

    def hook_done(self):
        if self.sync:
            self.writer.flush()

    def stop(self):
        if self._thread is None:
            return
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join()
        self._thread = None

    def abandon(self):
        """After a failure: let queued jobs finish (best effort), then stop."""
        try:
            self.drain()
        except Exception:
            pass
        self.stop()

    def _raise_if_error(self):
        if self._error is not None:
            raise WorkerError("capture analysis failed:\n" + self._error)

    # -- worker ----------------------------------------------------------------
    def _run(self):
        while True:
            with self._cv:
                while not self._jobs and not self._stop:
                    self._cv.wait()
                if not self._jobs:
                    return
                job, nbytes = self._jobs.popleft()
                self._busy = True
            try:
                if self._error is None:
                    job()
            except BaseException:
                self._error = "".join(traceback.format_exception(*sys.exc_info()))
            with self._cv:
                self._pending_bytes -= nbytes
                self._busy = False
                empty = not self._jobs
                self._cv.notify_all()
            if empty and self._error is None:
                try:
                    self.writer.flush()
                except BaseException:
                    self._error = "".join(traceback.format_exception(*sys.exc_info()))
