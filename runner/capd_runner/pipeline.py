"""Analysis pipeline: stats, hash, payload and frame writing off the model's
thread.

A capture hook only snapshots the tensor (one copy into a reused CPU buffer
of the same shape) and queues a job. Worker threads (one per core the
model's threads leave free, 1 or 2) compute the stats and the BLAKE2b-128
hash (tensors.HASH_ALG; the native pipe uses XXH3-128) of snapshots; hashing and torch's kernels release the GIL, so they overlap
with the model's own kernels. Every Python step of a worker holds the GIL
the model's thread needs between its kernels, so the workers are kept
GIL-light: a worker is woken only for new work (a fresh snapshot), takes
queued jobs in batches, and writes every run of finished jobs at once. Each
job *emits* (encodes its frame and writes it) strictly in submission order,
so frames keep the order of ``seq`` whatever the thread that computed them.
The number of queued jobs and snapshot bytes is bounded (a hook that finds
the queue full computes queued jobs itself until there is room), which also
bounds how many finished records a crash can lose; the frame pipe is flushed
whenever the workers catch up. drain() also computes queued jobs rather
than wait idle.

With CAPD_RUNNER_SYNC=1 in the environment (or sync=True) every job runs
inline in the hook and frames are flushed at each hook: slower, but a crash
loses nothing already recorded. Both modes write the same frames.
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
MAX_WORKERS = 2
# Queued jobs that wake a worker even when none of them has new work.
WAKE_AT = 8
# Jobs a worker takes at once (fewer lock and GIL round trips).
BATCH = 32


class WorkerError(Exception):
    pass


class BufferPool(object):
    """Free CPU buffers by (dtype, shape): fresh large allocations cost page
    faults every time, reused ones do not; by shape, so that a snapshot is a
    single copy_ (shapes repeat from one run to the next)."""

    def __init__(self, limit=POOL_BYTES):
        self.free = {}
        self.bytes = 0
        self.limit = limit
        self.lock = threading.Lock()

    def take(self, dtype, shape):
        """(flat, shaped, raw): a contiguous buffer of ``shape`` (a
        torch.Size), its 1-D view and a memoryview of its bytes (None on a
        big-endian host, where hashing needs a byte-swapped copy), made once
        per buffer: every call counts on the hot path."""
        key = (dtype, shape)
        with self.lock:
            lst = self.free.get(key)
            if lst:
                entry = lst.pop()
                self.bytes -= entry[0].numel() * entry[0].element_size()
                return entry
        shaped = torch.empty(shape, dtype=dtype)
        flat = shaped.view(-1)
        return flat, shaped, (None if T.BIG_ENDIAN else T.raw_bytes(flat))

    def give(self, entry):
        flat = entry[0]
        n = flat.numel() * flat.element_size()
        with self.lock:
            if self.bytes + n > self.limit:
                return
            self.free.setdefault((flat.dtype, entry[1].shape), []).append(entry)
            self.bytes += n

    def clear(self):
        with self.lock:
            self.free.clear()
            self.bytes = 0


class Job(object):
    """A unit of work: compute() runs on any worker, in any order; emit()
    runs in submission order, one at a time."""

    def compute(self):
        pass

    def emit(self):
        pass


class CallJob(Job):
    def __init__(self, fn):
        self.fn = fn

    def emit(self):
        self.fn()


MAX_NATIVE_THREADS = 8


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_native_threads(model_threads=1):
    """Analysis threads of the native pipe: every core the model's threads
    leave free, 1..8 (they take no GIL, so more of them do help)."""
    return max(1, min(MAX_NATIVE_THREADS, _cpus() - max(1, model_threads)))


def default_workers(model_threads=1):
    """One worker per core left over by the model's own threads, 1 or 2."""
    return max(1, min(MAX_WORKERS, _cpus() - max(1, model_threads)))


class Pipeline(object):
    def __init__(self, writer, sync=None, workers=None, native=False, native_threads=None):
        if sync is None:
            sync = os.environ.get("CAPD_RUNNER_SYNC", "") not in ("", "0")
        self.writer = writer
        self.sync = sync
        self.pool = BufferPool()
        # The native capture pipe (capd_runner/native.py), made on first use
        # by a recorder that can use it; None when not asked for, inline
        # (sync) or the library is not there.
        self._native_wanted = native and not sync
        self._native_threads = native_threads
        self._pipe = None
        self.native_error = None
        self._inflight = deque()  # (analysis id, pool entry, bytes) the pipe may still read
        self._inflight_bytes = 0
        self._local = threading.local()
        self._cv = threading.Condition()
        self._emit_lock = threading.Lock()
        self._jobs = deque()
        self._done = {}
        self._next_ticket = 0
        self._next_emit = 0
        self._pending_bytes = 0
        self._error = None
        self._stop = False
        self._threads = []
        # Compute CPU stats in the hook instead of the workers (experiments).
        self.stats_in_hook = False
        # Where the native pipe analyses a tensor: True, in its hook, over
        # its own bytes, in one foreign call (capd_pipe_record); False, on a
        # snapshot in the pool, by the analysis threads (two calls); an int,
        # in the hook up to that many bytes. In the hook is the default: on
        # a host whose cores are busy the copy alone costs about what the
        # analysis does (memory bound both) and the threads then only add
        # hand-offs (docs/performance.md, stats against stats_threaded).
        # CAPD_RUNNER_NATIVE_INLINE=0 chooses the threads.
        self.native_inline = os.environ.get("CAPD_RUNNER_NATIVE_INLINE", "") != "0"
        # Records in one foreign call (capd_pipe_record) where the library
        # has it and native_inline allows; False: always the snapshot in the
        # pool and two calls (the tests compare the two).
        self.native_one_call = True
        # A module capture's hooks in C (the CPython extension capd_fastrec
        # beside the library, native.fastrec) where it is built for this
        # interpreter; False: the Python hooks (CAPD_RUNNER_FASTREC=0; the
        # tests compare the two).
        self.native_fast = os.environ.get("CAPD_RUNNER_FASTREC", "") != "0"
        self._nworkers = 0 if sync else (workers or default_workers())
        if not sync:
            for i in range(self._nworkers):
                t = threading.Thread(target=self._run, name="capd-analysis-%d" % i)
                t.daemon = True
                t.start()
                self._threads.append(t)

    @property
    def engine(self):
        """This thread's StatsEngine (its scratch buffers are not shared)."""
        e = getattr(self._local, "engine", None)
        if e is None:
            e = self._local.engine = T.StatsEngine()
        return e

    # -- producer side (hooks) ----------------------------------------------
    def submit(self, job, nbytes=0):
        if self.sync:
            job.compute()
            job.emit()
            return
        while True:
            with self._cv:
                self._raise_if_error()
                if not (self._next_ticket - self._next_emit >= MAX_JOBS or
                        (self._pending_bytes + nbytes > MAX_BYTES and
                         self._next_ticket > self._next_emit)):
                    self._jobs.append((self._next_ticket, job, nbytes))
                    self._next_ticket += 1
                    self._pending_bytes += nbytes
                    # A waking worker takes the GIL from the hooks: wake one
                    # only for new work (a fresh snapshot), not for a record
                    # of a tensor already analysed (its frame goes out with
                    # the next batch).
                    if nbytes or len(self._jobs) >= WAKE_AT:
                        self._cv.notify()
                    return
                # Full: help the workers rather than wait for them.
                if not self._jobs:
                    self._cv.notify_all()
                    self._cv.wait()
                    continue
                batch = [self._jobs.popleft()]
            self._compute(batch)

    def note(self, fn):
        if self._pipe is not None:
            # In order with the pipe's frames: after them, written now.
            self.drain()
            fn()
            self.writer.flush()
            return
        self.submit(CallJob(fn))

    # -- the native pipe ---------------------------------------------------------
    @property
    def native_pipe(self):
        if self._pipe is None and self._native_wanted:
            from capd_runner import native
            try:
                self._pipe = native.Pipe(self.writer.fd,
                                         self._native_threads or max(1, self._nworkers))
            except Exception as e:
                self._native_wanted = False
                self.native_error = str(e)
        return self._pipe

    def _pipe_failed(self, e):
        import errno
        if getattr(e, "errno", None) == errno.EPIPE:
            self.writer._pipe_closed()
        raise WorkerError("capture pipe failed: %s" % e)

    def native_analyze(self, entry, ptr, numel, code, want_stats, sample_k, nbytes):
        """Queue the analysis of a snapshot (``entry``: the pool's, or None
        for an empty tensor); returns its id. The entry goes back to the pool
        once the pipe is done reading it."""
        if self.writer._parts:
            self.writer.flush()  # frames written before stay before
        try:
            aid = self._pipe.analyze(ptr, numel, code, want_stats, sample_k)
            if entry is not None:
                self._inflight.append((aid, entry, nbytes))
                self._inflight_bytes += nbytes
                if self._inflight_bytes > MAX_BYTES:
                    # Bounded memory: wait for the oldest half to be read.
                    target = self._inflight[len(self._inflight) // 2][0] + 1
                    self._pipe.wait_analyzed(target)
                self._release_analyzed(self._pipe.analyzed())
        except OSError as e:
            self._pipe_failed(e)
        return aid

    def native_record_ok(self):
        """Whether records may go in one call (capd_pipe_record)."""
        return (self.native_one_call and self.native_inline is not False
                and self._pipe.record_fn is not None)

    def native_inline_max(self):
        """Bytes up to which a tensor is analysed in its hook; None: all."""
        inline = self.native_inline
        return None if inline is True else inline

    def native_record(self, ptr, numel, code, want_stats, sample_k, prefix, capture):
        """Analyse the tensor at ``ptr`` and, unless ``prefix`` is None, queue
        its frame, in one call; its analysis id."""
        if self.writer._parts:
            self.writer.flush()  # frames written before stay before
        pipe = self._pipe
        # Straight through ctypes (Pipe.record, written out: the hot path).
        aid = pipe.record_fn(pipe._p, ptr, numel, code, want_stats, sample_k, prefix,
                             len(prefix) if prefix is not None else 0, capture)
        if aid >= 0:
            return aid
        try:
            pipe._check(aid, "record")
        except OSError as e:
            self._pipe_failed(e)

    def native_failed(self, rc, what):
        """Raise for a refused pipe call (capd_fastrec's, as native_record and
        native_emit do for theirs)."""
        try:
            self._pipe._check(rc, what)
        except OSError as e:
            self._pipe_failed(e)

    def native_inline_ok(self):
        return self.native_inline is True and self._pipe.analyze_now_fn is not None

    def native_analyze_now(self, ptr, numel, code, want_stats, sample_k):
        """Analyse the tensor at ``ptr`` now, on this thread; its id."""
        if self.writer._parts:
            self.writer.flush()  # frames written before stay before
        try:
            return self._pipe.analyze_now(ptr, numel, code, want_stats, sample_k)
        except OSError as e:
            self._pipe_failed(e)

    def native_emit(self, aid, prefix, capture):
        pipe = self._pipe
        rc = pipe.emit_fn(pipe._p, aid, prefix, len(prefix), capture)  # Pipe.emit, written out
        if rc == 0:
            return
        try:
            pipe._check(rc, "emit")
        except OSError as e:
            self._pipe_failed(e)

    def _release_analyzed(self, done):
        inflight = self._inflight
        while inflight and inflight[0][0] < done:
            _aid, entry, nbytes = inflight.popleft()
            self._inflight_bytes -= nbytes
            self.pool.give(entry)

    def _native_drain(self, reset=False):
        try:
            if reset:
                self._pipe.reset()
            else:
                self._pipe.drain()
        except OSError as e:
            self._pipe_failed(e)
        self._release_analyzed(1 << 62)
        frames, payload = self._pipe.take_counts()
        self.writer.frames += frames
        self.writer.payload_bytes += payload

    def native_reset(self):
        """Drain the pipe and start its analysis numbering again."""
        self._native_drain(reset=True)

    def drain(self):
        """Wait until every queued job is emitted; raise a worker's error.

        The caller helps: instead of waiting idle it computes queued jobs
        itself (the tail of a capture is then shared between the model's
        thread and the workers)."""
        if self._pipe is not None:
            self._native_drain()
        if self.sync:
            return
        while True:
            with self._cv:
                self._raise_if_error()
                if self._next_emit >= self._next_ticket:
                    return
                # Only now: a worker woken for nothing wants the GIL back
                # from the model's thread (a native capture queues no job).
                self._cv.notify_all()
                if not self._jobs:
                    self._cv.wait()
                    continue
                batch = [self._jobs.popleft()]
            self._compute(batch)

    def hook_done(self):
        if self.sync:
            self.writer.flush()

    def stop(self):
        if self._pipe is not None:
            pipe, self._pipe = self._pipe, None
            self._native_wanted = False
            try:
                pipe.drain()
            finally:
                self._release_analyzed(1 << 62)
                pipe.close()
        if not self._threads:
            return
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []

    def abandon(self):
        """After a failure: let queued jobs finish (best effort), then stop."""
        try:
            self.drain()
        except Exception:
            pass
        try:
            self.stop()
        except Exception:
            pass

    def _raise_if_error(self):
        if self._error is not None:
            raise WorkerError("capture analysis failed:\n" + self._error)

    def _fail(self):
        with self._cv:
            if self._error is None:
                self._error = "".join(traceback.format_exception(*sys.exc_info()))
            self._cv.notify_all()

    def _guarded(self, step):
        # Runs STEP (a job's compute or emit, the writer's flush) unless the
        # pipeline has already failed; what it raises fails the pipeline.
        try:
            if self._error is None:
                step()
        except BaseException:
            self._fail()

    # -- workers ---------------------------------------------------------------
    def _run(self):
        nworkers = max(1, self._nworkers)
        while True:
            with self._cv:
                while not self._jobs and not self._stop:
                    self._cv.wait()
                if not self._jobs:
                    return
                # A share of what is queued (the draining thread may help).
                take = min(BATCH, max(1, -(-len(self._jobs) // (nworkers + 1))))
                batch = [self._jobs.popleft() for _ in range(take)]
            self._compute(batch)

    def _compute(self, batch):
        for ticket, job, nbytes in batch:
            self._guarded(job.compute)
        with self._cv:
            for ticket, job, nbytes in batch:
                self._done[ticket] = (job, nbytes)
        self._emit_ready()

    def _emit_ready(self):
        # Whoever holds the emit lock writes every consecutive finished job;
        # a job finished while the lock was being released is picked up by
        # the re-check at the end.
        while True:
            if not self._emit_lock.acquire(False):
                return
            try:
                self._emit_locked()
            finally:
                self._emit_lock.release()
            with self._cv:
                if self._next_emit not in self._done:
                    return

    def _emit_locked(self):
        while True:
            with self._cv:
                items = []
                i = self._next_emit
                while i in self._done:
                    items.append(self._done.pop(i))
                    i += 1
            if not items:
                return
            freed = 0
            for job, nbytes in items:
                freed += nbytes
                self._guarded(job.emit)
            with self._cv:
                self._next_emit += len(items)
                self._pending_bytes -= freed
                idle = self._next_emit == self._next_ticket
                self._cv.notify_all()
            if idle:
                self._guarded(self.writer.flush)
