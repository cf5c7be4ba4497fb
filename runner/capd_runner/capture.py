"""Capture: hooks on every module, one record per tensor.

Record key: ``<module fqn>.<call index>.<phase>.<role>.<index>``; the root
module's fqn is ``model``. Inputs are recorded by a forward pre-hook (before
the module runs), outputs by a forward hook, so records come in execution
order. ``index`` is the position of the tensor in the depth-first flattening
of the positional inputs / the output (tuples, lists, dict values by sorted
key; non-tensors are skipped and take no position).

Gradients (backward pass) do not use register_full_backward_hook: its
identity Function returns its inputs as views, so any in-place operation on a
module's output (ResNet's ``out += identity``, MobileNet's ``result +=
input``) fails with "Output 0 of BackwardHookFunctionBackward is a view and
is being modified inplace", and it cannot tell which call of a module a
gradient belongs to. Instead each module call's inputs and outputs that
require grad go through a small autograd Function (``_Tap``) that returns
clones and reports the gradients reaching it:

* the tap on a call's outputs sees dL/d(output): ``grad_output``;
* the tap on a call's inputs (applied in the pre-hook, so only this call's
  use of them flows through it) sees dL/d(input) through this call:
  ``grad_input``.

A tensor passed in several positions is tapped once (``q is k`` checks in
attention keep working) and its grad_input is recorded at its first
position. Parameter gradients are recorded after backward() returns.
"""

import functools
import json
import os
import threading
import weakref

import torch

from capd_runner import frames as F
from capd_runner import native as native_lib
from capd_runner import tensors as T
from capd_runner.naming import module_names, param_owner, safe_fqn  # noqa: F401 (callers')
from capd_runner.pipeline import Job
from capd_runner.targetrec import TargetRecords, module_target


def flatten(obj):
    """Tensors of a nested structure, depth first, in a stable order."""
    out = []
    _flatten(obj, out)
    return out


def _flatten(obj, out):
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _flatten(x, out)
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _flatten(obj[k], out)


def rebuild(obj, it):
    """Same structure as ``obj`` with its tensors taken from iterator ``it``."""
    if isinstance(obj, torch.Tensor):
        return next(it)
    if isinstance(obj, tuple):
        items = [rebuild(x, it) for x in obj]
        if hasattr(obj, "_fields"):  # namedtuple (PackedSequence...)
            return type(obj)(*items)
        return tuple(items)
    if isinstance(obj, list):
        return [rebuild(x, it) for x in obj]
    if isinstance(obj, dict):
        new = dict(obj)
        for k in sorted(obj, key=str):
            new[k] = rebuild(obj[k], it)
        return type(obj)(new) if type(obj) is not dict else new
    return obj


class _Tap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, callback, *tensors):
        ctx.callback = callback
        ctx.set_materialize_grads(False)
        return tuple(t.clone() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.callback(grads)
        return (None,) + tuple(grads)


def tap(rec, flat, on_grads):
    """FLAT with the tensors that need grad routed through a _Tap (one per
    tensor, its gradient reported at its first position) and aliased in
    REC; None if none need grad. In backward, ON_GRADS gets the gradients
    that reached them as (position in FLAT, gradient), None ones left out."""
    first, positions, tapped = {}, [], []
    for i, t in enumerate(flat):
        if t.requires_grad and id(t) not in first:
            first[id(t)] = len(tapped)
            positions.append(i)
            tapped.append(t)
    if not tapped:
        return None
    clones = _Tap.apply(lambda grads: on_grads([(pos, g) for pos, g in zip(positions, grads)
                                               if g is not None]), *tapped)
    if isinstance(clones, torch.Tensor):
        clones = (clones,)
    for src, dst in zip(tapped, clones):
        rec.alias(src, dst)
    out = []
    for t in flat:
        j = first.get(id(t)) if t.requires_grad else None
        out.append(clones[j] if j is not None else t)
    return out


_HAS_IS_CPU = hasattr(torch.Tensor, "is_cpu")
_module_mod = torch.nn.modules.module
_GLOBAL_HOOKS = (hasattr(_module_mod, "register_module_forward_pre_hook")
                 and hasattr(_module_mod, "register_module_forward_hook"))
# Whether a capture may use them (Capture._global_hooks_ok); False: per-module
# hooks always (CAPD_RUNNER_GLOBAL_HOOKS=0; the tests compare the two).
GLOBAL_HOOKS = _GLOBAL_HOOKS and os.environ.get("CAPD_RUNNER_GLOBAL_HOOKS", "") != "0"
_CODES = native_lib.CODES
_STRIDED = torch.strided

MAX_NDIM = 16

# The text of a tensor header prefix after its "seq" (frames.tensor_header_prefix),
# by everything it is made of: the same modules record the same keys, dtypes
# and shapes at every capture of a cell, and the formatting is the dearest
# part of a record's header. Emptied when it holds PREFIX_TAILS_MAX texts
# (a model whose keys never repeat still pays only the formatting).
_PREFIX_TAILS = {}
PREFIX_TAILS_MAX = 1 << 16
_SEQ_HEAD = b'{"kind":"tensor","seq":%d'


def _prefix_tail(key, module, call, phase, role, index, dtype, shape, op):
    """The cached header text after "seq" of a record of a tensor of DTYPE
    and SHAPE (a torch.Size) (_PREFIX_TAILS), made and stored when missing."""
    cache_key = (key, module, call, phase, role, index, dtype, shape, op)
    tail = _PREFIX_TAILS.get(cache_key)
    if tail is None:
        whole = F.tensor_header_prefix(0, key, module, call, phase, role, index,
                                       T.dtype_name(dtype), shape, shape.numel(),
                                       op).encode("ascii")
        tail = whole[len(_SEQ_HEAD % 0):]
        if len(_PREFIX_TAILS) >= PREFIX_TAILS_MAX:
            _PREFIX_TAILS.clear()
        _PREFIX_TAILS[cache_key] = tail
    return tail


class PayloadBudget(object):
    """Payload bytes a cell may send in all (options.max_payload_bytes) and
    in one frame (options.max_one_payload_bytes, capd's frame_max_payload)."""

    def __init__(self, limit, one=1 << 30):
        self.limit = limit
        self.one = one
        self.used = 0


class _Analysis(object):
    """What is known of one tensor (object, version): filled by a worker."""
    __slots__ = ("snapshot", "buf", "stats", "hash", "sample", "keep", "want_sample", "lock")

    def __init__(self):
        self.snapshot = None  # 1-D, C-contiguous copy
        self.buf = None  # the pool's (flat, shaped, raw bytes) entry holding it
        self.stats = None
        self.hash = None
        self.sample = None
        self.keep = False
        self.want_sample = False
        self.lock = threading.Lock()


class _RecordJob(Job):
    __slots__ = ("rec", "key", "header", "an", "kind")

    def __init__(self, rec, key, header, an, kind):
        self.rec, self.key, self.header, self.an, self.kind = rec, key, header, an, kind

    def compute(self):
        self.rec._complete(self.an)

    def emit(self):
        self.rec._emit(self)


class Recorder(TargetRecords):
    """Turns tensors into ``tensor`` frames (emit=True) or only hashes them
    (emit=False: the determinism run).

    The hook side (record) snapshots the tensor and queues a job on the
    pipeline; the job computes stats, hash and payload and writes the frame.
    The analysis of a tensor is cached per tensor object and version, so a
    tensor that is one module's output and the next one's input is copied
    and read once. Payload decisions (full -> sample fallback) are made on the
    hook side, in record order.
    """

    def __init__(self, writer, pipeline, level, sample_size, budget, emit=True, like=None):
        self.writer = writer
        self.pipeline = pipeline
        self.level = level
        self.sample_size = sample_size
        self.budget = budget
        self.engine = T.StatsEngine()  # device-side stats, in the hook
        self.emit = emit
        self.prefix = ""  # before every module name (cell.REFERENCE_PREFIX)
        self.seq = 0
        self.hashes = {}
        self.order = []
        self.lock = threading.RLock()
        # id(tensor) -> (weakref, signature, analysis): a hit needs the
        # weakref's referent to be the tensor itself, so an entry whose
        # tensor died (its id free for another) is dead weight until
        # clear_cache() at the end of the run, not a wrong answer.
        self._cache = {}
        self._positions = {}
        self.fallback_noted = False
        self.exhausted_noted = False
        self.ndim_noted = False
        # The native pipe does the analysis and the frames when there is
        # one (CPU cells, capd_runner/native.py), except at level full
        # (payloads of whole snapshots stay on the Python pipeline). A
        # recorder whose hashes are compared with LIKE's (the determinism
        # run) hashes the way LIKE does: the two paths use different
        # algorithms (hash_alg), so equal tensors would differ.
        pipe = pipeline.native_pipe if level != "full" else None
        if like is not None and like.native is None:
            pipe = None
        self.native = pipe
        self._pending = []  # (key, analysis id or hash) until sync()
        self.fast = None  # a Capture's capd_fastrec hooks while installed
        self._one_call = False
        self._inline_max = None
        if pipe is not None:
            pipeline.native_reset()
            self._one_call = pipeline.native_record_ok()
            self._inline_max = pipeline.native_inline_max()

    # -- hook side -----------------------------------------------------------
    @staticmethod
    def _sig(t):
        return (t._version, t.data_ptr(), t.shape, t.stride(), t.storage_offset(), t.dtype,
                t.device)

    def _cached(self, t):
        """(signature of ``t``'s current version, its cached analysis or None).

        The hot path of every hook: each torch call here releases and
        re-takes the GIL, a hand-off to the analysis workers when they
        want it, so there are as few as possible (no detach unless the
        tensor requires grad, snapshot buffers pooled by shape so the copy is
        one call)."""
        try:
            sig = self._sig(t)
        except Exception:
            return None, None
        ent = self._cache.get(id(t))
        if ent is not None and ent[1] == sig and ent[0]() is t:
            return sig, ent[2]
        return sig, None

    def _cache_put(self, t, sig, value):
        if sig is None:
            return
        try:
            self._cache[id(t)] = (weakref.ref(t), sig, value)
        except TypeError:
            pass

    @staticmethod
    def _plain(t):
        if t.requires_grad or t.dtype not in T.PLAIN_DTYPES or t.layout != torch.strided:
            return T.prepare(t)
        return t

    def _analysis(self, t):
        """(analysis, bytes newly snapshotted): the Python pipeline's."""
        sig, an = self._cached(t)
        if an is not None:
            return an, 0
        p = self._plain(t)
        an = _Analysis()
        an.keep = self.level == "full"
        an.want_sample = self.level in ("sample", "full")
        n = p.numel()
        on_cpu = p.device.type == "cpu"
        if self.emit and (not on_cpu or self.pipeline.stats_in_hook):
            an.stats = self.engine.stats(p)
        if n:
            entry = self.pipeline.pool.take(p.dtype, p.shape)
            entry[1].copy_(p)
            an.snapshot = entry[0]
            an.buf = entry
        else:
            an.snapshot = torch.empty(0, dtype=p.dtype)
        self._cache_put(t, sig, an)
        return an, n * p.element_size()

    def alias(self, src, dst):
        """``dst`` is a bit-identical copy of ``src`` (a tap's clone)."""
        with self.lock:
            ent = self._cache.get(id(src))
            if ent is None or ent[0]() is not src:
                return
            try:
                self._cache_put(dst, self._sig(dst), ent[2])
            except Exception:
                pass

    def _native_analysis(self, t):
        """The native pipe's analysis id for ``t`` (a snapshot queued once per
        tensor version), or the cached _Analysis of a tensor that took the
        Python path, or None when ``t`` must take it (a dtype or device the
        library does not read)."""
        sig, cached = self._cached(t)
        if cached is not None:
            return cached
        p = self._plain(t)
        code = self.native.code(p.dtype)
        if code is None or p.device.type != "cpu":
            return None
        n = p.numel()
        sample_k = min(self.sample_size, n) if self.emit and self.level == "sample" else 0
        if self.pipeline.native_inline_ok() and p.is_contiguous():
            aid = self.pipeline.native_analyze_now(p.data_ptr() if n else 0, n, code, self.emit,
                                                   sample_k)
            self._cache_put(t, sig, aid)
            return aid
        entry, ptr, nbytes = None, 0, 0
        if n:
            entry = self.pipeline.pool.take(p.dtype, p.shape)
            entry[1].copy_(p)
            ptr = entry[0].data_ptr()
            nbytes = n * p.element_size()
        aid = self.pipeline.native_analyze(entry, ptr, n, code, self.emit, sample_k, nbytes)
        self._cache_put(t, sig, aid)
        return aid

    def _native_record(self, key, module, call, phase, role, index, t, op):
        """One record through the pipe in one foreign call (capd_pipe_record:
        the analysis, in the hook, and the frame), or a second record of a
        tensor version already analysed: True. False when ``t`` takes the
        Python path (a dtype or device the library does not read); None,
        having done nothing, when it is over the pipeline's inline bound
        (the two-call path: a snapshot for the analysis threads).
        The steps and their order are those of _native_analysis and the
        two-call path in record(), so the frames are the same; _cached and
        _cache_put are written out here, the hot path of every record."""
        try:
            sig = (t._version, t.data_ptr(), t.shape, t.stride(), t.storage_offset(), t.dtype,
                   t.device)
        except Exception:
            sig = None
        tid = id(t)
        ent = self._cache.get(tid) if sig is not None else None
        if ent is not None and ent[1] == sig and ent[0]() is t:
            aid = ent[2]
            if type(aid) is not int:
                return False  # an analysis of the Python path
            prefix, kind = self._prefix(key, module, call, phase, role, index, t, op)
            if prefix is not None:
                self.pipeline.native_emit(aid, prefix, kind)
            self._pending.append((key, aid))
            return True
        p = t
        code = _CODES.get(t.dtype)  # the plain dtypes (T.PLAIN_DTYPES): _plain, written out
        if code is None or t.requires_grad or t.layout != _STRIDED:
            p = T.prepare(t)
            code = _CODES.get(p.dtype)
        if code is None or not (p.is_cpu if _HAS_IS_CPU else p.device.type == "cpu"):
            return False
        n = p.numel()
        if self._inline_max is not None and n * p.element_size() > self._inline_max:
            return None  # too big to analyse in the hook: the two-call path
        if not p.is_contiguous():
            p = p.contiguous()
        sample_k = min(self.sample_size, n) if self.emit and self.level == "sample" else 0
        prefix, kind = self._prefix(key, module, call, phase, role, index, t, op)
        aid = self.pipeline.native_record(p.data_ptr() if n else 0, n, code, self.emit, sample_k,
                                          prefix, kind)
        if sig is not None:
            try:
                self._cache[tid] = (weakref.ref(t), sig, aid)
            except TypeError:
                pass
        self._pending.append((key, aid))
        return True

    def _prefix(self, key, module, call, phase, role, index, t, op):
        """(header prefix, pipe capture code) of the next record, or (None, 0)
        when nothing is emitted."""
        if not self.emit:
            return None, 0
        tail = _PREFIX_TAILS.get((key, module, call, phase, role, index, t.dtype, t.shape, op))
        if tail is None:
            tail = _prefix_tail(key, module, call, phase, role, index, t.dtype, t.shape, op)
        prefix = _SEQ_HEAD % self.seq + tail
        self.seq += 1
        if self.level == "stats":  # what _decide says, without the call
            return prefix, 0
        return prefix, 1 if self._decide(key, t) == "sample" else 0

    def fast_hooks(self, capture):
        """CAPTURE's forward hooks in C (capd_fastrec: pre and post, what
        Capture._pre, _post and this recorder's one-call path do, frames
        byte for byte), or None where they do not apply: no extension for
        this interpreter, not the one-call path of the native pipe, a
        payload level (sample, full: _decide), taps, per-op records or a
        target module call (targetrec.ModuleTarget)."""
        if (self.native is None or not self._one_call or self._inline_max is not None
                or (self.emit and self.level != "stats") or capture.taps
                or capture.granularity != "module" or capture._sync or capture.target
                or not getattr(self.pipeline, "native_fast", False)):
            return None
        fast = native_lib.fastrec()
        pipe = self.native
        if fast is None or not pipe.analyze_now_addr or not pipe.emit_addr:
            return None
        return fast.hooks(self, capture, _CODES, _PREFIX_TAILS, _prefix_tail,
                          self.pipeline.native_failed, _flatten, torch.Tensor, _STRIDED,
                          pipe._p, pipe.analyze_now_addr, pipe.emit_addr)

    def clear_cache(self):
        with self.lock:
            self._cache.clear()

    def sync(self):
        """Wait until every record so far is written; then ``hashes`` and
        ``order`` hold them all."""
        if self.fast is not None:
            self.fast.flush()  # the records capd_fastrec defers
        self.pipeline.drain()
        pending, self._pending = self._pending, []
        if not pending:
            return
        ids = [v for _k, v in pending if type(v) is int]
        lo = min(ids) if ids else 0
        got = self.native.hashes(lo, max(ids) - lo + 1) if ids else []
        for key, v in pending:
            self.hashes[key] = got[v - lo] if type(v) is int else v
            self.order.append(key)

    def _remember(self, key, hash_hex):
        if self.native is not None:
            self._pending.append((key, hash_hex))
        else:
            self.hashes[key] = hash_hex
            self.order.append(key)

    def _begin(self, module, call, phase, role, index, op):
        """(module name with the prefix, record key) of a record about to be
        made (record, record_full), once capd_fastrec's deferred records
        are written: they come first."""
        if self.fast is not None:
            self.fast.flush()
        module = self.prefix + module
        if op is None:
            key = "%s.%d.%s.%s.%s" % (module, call, phase, role, index)
        else:
            key = "%s.%d.%s/op.%s.%d.%s.%s" % (module, call, phase, op[0], op[1], role, index)
        return module, key

    def record(self, module, call, phase, role, index, t, op=None):
        """One record. ``op`` is (ATen name, occurrence) for a per-op record
        (opcapture.py), whose key puts ``/op.<name>.<n>`` after the phase."""
        module, key = self._begin(module, call, phase, role, index, op)
        with self.lock:
            if t.dim() > MAX_NDIM:
                if self.emit and not self.ndim_noted:
                    self.ndim_noted = True
                    msg = ("%s has %d dimensions, more than the protocol's %d: not recorded "
                           "(nor any such tensor after it)" % (key, t.dim(), MAX_NDIM))
                    self.pipeline.note(lambda: self.writer.note("warn", msg))
                return
            inline = False
            done = None
            if self._one_call:
                done = self._native_record(key, module, call, phase, role, index, t, op)
                if done:
                    return
            if done is False:
                # A tensor the library cannot read: the Python path, inline,
                # after everything the pipe has queued.
                self.pipeline.drain()
                inline = True
            elif self.native is not None:
                aid = self._native_analysis(t)
                if type(aid) is int:
                    self._pending.append((key, aid))
                    if self.emit:
                        prefix = F.tensor_header_prefix(self.seq, key, module, call, phase, role,
                                                        index, T.dtype_name(t.dtype), t.shape,
                                                        t.numel(), op).encode("ascii")
                        self.seq += 1
                        kind = self._decide(key, t)
                        self.pipeline.native_emit(aid, prefix, 1 if kind == "sample" else 0)
                    return
                # A tensor the library cannot read: the Python path, inline,
                # after everything the pipe has queued.
                self.pipeline.drain()
                inline = True
            an, nbytes = self._analysis(t)
            if not self.emit:
                job = _RecordJob(self, key, None, an, None)
            else:
                # The header's parts; the worker encodes it (frames.tensor_header_prefix).
                header = (self.seq, key, module, call, phase, role, index, t.dtype, t.shape,
                          t.numel(), op)
                self.seq += 1
                kind = self._decide(key, t)
                job = _RecordJob(self, key, header, an, kind)
            if inline:
                job.compute()
                job.emit()
                self.writer.flush()
                return
            self.pipeline.submit(job, nbytes)

    def _decide(self, key, t):
        """Payload kind of this record: stats, sample or full (budgeted)."""
        level = self.level
        if level == "stats":
            return "stats"
        numel = t.numel()
        itemsize = t.element_size()
        if level == "full":
            need = numel * itemsize
            if self.budget.used + need <= self.budget.limit and need <= self.budget.one:
                self.budget.used += need
                return "full"
            if not self.fallback_noted:
                self.fallback_noted = True
                if need > self.budget.one:
                    why = ("%s needs %d bytes, more than one payload may have "
                           "(max_one_payload_bytes %d)" % (key, need, self.budget.one))
                else:
                    why = ("max_payload_bytes (%d) would be exceeded at %s (%d bytes used, "
                           "%d more needed)" % (self.budget.limit, key, self.budget.used, need))
                msg = "capture full: %s; falling back to sample for the rest of the cell" % why
                self.pipeline.note(lambda: self.writer.note("warn", msg))
            self.level = "sample"
        need = min(self.sample_size, numel) * itemsize
        if self.budget.used + need > self.budget.limit:
            if not self.exhausted_noted:
                self.exhausted_noted = True
                msg = ("max_payload_bytes (%d) reached at %s: stats only for the rest of the cell"
                       % (self.budget.limit, key))
                self.pipeline.note(lambda: self.writer.note("warn", msg))
            self.level = "stats"  # sticky: later records of a tensor agree on its payload
            return "stats"
        self.budget.used += need
        return "sample"

    # -- worker side -----------------------------------------------------------
    def _release(self, an):
        if not an.keep and an.snapshot is not None:
            if an.buf is not None:
                self.pipeline.pool.give(an.buf)
                an.buf = None
            an.snapshot = None

    def _sample_of(self, snap):
        flat = snap if snap.dim() == 1 else snap.reshape(-1)
        numel = flat.numel()
        k = min(self.sample_size, numel)
        if k == numel:
            return bytes(T.raw_bytes(flat))
        pos = self._positions.get((numel, k))
        if pos is None:
            pos = torch.tensor(T.sample_positions(numel, self.sample_size), dtype=torch.int64)
            self._positions[(numel, k)] = pos
        return bytes(T.raw_bytes(flat.index_select(0, pos)))

    def _complete(self, an):
        """Everything any record of this analysis will need (any worker)."""
        with an.lock:
            snap = an.snapshot
            if an.hash is None:
                raw = an.buf[2] if an.buf is not None else None
                an.hash = T.content_hash(snap) if raw is None else T.hash_bytes(raw)
            if self.emit:
                if an.stats is None:
                    an.stats = self.pipeline.engine.stats(snap)
                if an.want_sample and an.sample is None:
                    an.sample = self._sample_of(snap)
            self._release(an)  # kept (full) snapshots stay for later records

    def _emit(self, job):
        """Write the record (in record order)."""
        an = job.an
        self._remember(job.key, an.hash)
        if job.header is None:
            return
        kind = job.kind
        payload = None
        if kind == "sample":
            payload = an.sample
            if payload is None:  # cannot happen: the capture level only goes down
                kind = "stats"
        elif kind == "full":
            payload = T.raw_bytes(an.snapshot)
        seq, key, module, call, phase, role, index, dtype, shape, numel, op = job.header
        n = len(payload) if payload is not None else 0
        try:
            line = F.tensor_header_line(
                F.tensor_header_prefix(seq, key, module, call, phase, role, index,
                                       T.dtype_name(dtype), shape, numel, op),
                an.stats, an.hash, kind, n, T.HASH_ALG)
        except ValueError:
            # Not a value the fast encoder writes (cannot happen with the
            # engine's stats): the dict through json, which says what is wrong.
            header = {
                "kind": "tensor", "seq": seq, "key": key, "module": module, "call": call,
                "phase": phase, "role": role, "index": index, "dtype": T.dtype_name(dtype),
                "shape": list(shape), "numel": numel,
            }
            if op is not None:
                header["op"], header["op_index"] = op[0], op[1]
                if len(op) > 2:
                    header["op_call"] = json.loads(op[2])
            header.update({"stats": an.stats, "hash": an.hash, "hash_alg": T.HASH_ALG,
                           "capture": kind})
            if kind == "sample":
                header["sample_positions"] = "stride"
            self.writer.frame(header, payload)
            return
        self.writer.frame_line(line, payload)


def _model_call(side):
    """SIDE(capture, mid, fqn, *args) as a forward hook (module, *args) of
    a Capture: it runs for the model's modules only (the global hooks see
    every module call of the process), with mid = id(module) and fqn its
    name, counted in the capture's ``quiet`` while it runs."""
    @functools.wraps(side)
    def hook(self, module, *args):
        mid = id(module)
        fqn = self.names.get(mid)
        if fqn is None:
            return None  # not the model's (global hooks)
        self.quiet += 1
        try:
            return side(self, mid, fqn, *args)
        finally:
            self.quiet -= 1
    return hook


class Capture(object):
    """Hooks on every module of ``model`` for one capture run."""

    def __init__(self, model, recorder, taps=False, granularity="module", target_op=""):
        self.model = model
        self.rec = recorder
        self.taps = taps
        self.granularity = granularity
        # option target_op: "" is off; an op call (granularity op only;
        # opcapture.py) or a module call (self.target, targetrec.py)
        self.target_op = target_op if isinstance(target_op, str) else ""
        self.target = module_target(self.target_op, recorder)
        self.ops = None  # the per-op recorder (opcapture.OpRecorder) at granularity op
        self.quiet = 0  # > 0 while a hook runs: its own torch calls are no model ops
        self.names, self.modules, self._own_hooks = module_names(model)
        self.calls = {}
        self.active = {}
        self.handles = []
        self.fast = None  # the hooks in C (Recorder.fast_hooks) while they are installed
        # hook_done() flushes only an inline (sync) pipeline's frames
        self._sync = getattr(getattr(recorder, "pipeline", None), "sync", True)

    def __enter__(self):
        pre, post = self._pre, self._post
        fast = self.rec.fast_hooks(self) if hasattr(self.rec, "fast_hooks") else None
        if fast is not None:
            self.fast = self.rec.fast = fast
            pre, post = fast.pre, fast.post
        if self._global_hooks_ok():
            # Two process-wide hooks instead of two per module (136 on
            # resnet18, each a handle made and removed per capture); the
            # hooks skip a module that is not the model's (not in names).
            self.handles.append(_module_mod.register_module_forward_pre_hook(pre))
            self.handles.append(_module_mod.register_module_forward_hook(post))
        else:
            for m in self.modules:
                self.handles.append(m.register_forward_pre_hook(pre))
                self.handles.append(m.register_forward_hook(post))
        if self.granularity == "op":
            from capd_runner import opcapture
            self.ops = opcapture.OpRecorder(self, "" if self.target else self.target_op)
            self.ops.start()
        return self

    def _global_hooks_ok(self):
        """Whether the capture may hook every module call of the process
        (torch's register_module_forward_pre_hook and _hook) instead of each
        of the model's modules. Not when a module of the model had forward
        hooks of its own when the capture was made: torch runs the global
        hooks first, so the capture would see a call's inputs before that
        module's pre-hooks change them and its output before its hooks do,
        where a hook of its own runs after them."""
        return GLOBAL_HOOKS and not self._own_hooks

    def __exit__(self, *exc):
        self.remove()
        return False

    def remove(self):
        if self.ops is not None:
            self.ops.stop()
        if self.target is not None:
            self.target.stop()
        for h in self.handles:
            h.remove()
        self.handles = []
        fast, self.fast = self.fast, None
        if fast is not None:
            self.rec.fast = None
            fast.flush()

    def flush(self):
        self.rec.pipeline.hook_done()

    # -- hooks -------------------------------------------------------------
    # _pre and _post run as _model_call makes them: for the model's modules
    # only, counted in ``quiet`` while they run (their own torch calls are
    # no model ops). They run twice per module call, on the model's thread;
    # the calls a side makes besides its body (_model_call's, and
    # ``_record``, that records the side) cost about 0.1 us together, small
    # against a record (3-6 us).
    @_model_call
    def _pre(self, mid, fqn, inputs):
        call = self.calls.get(mid, 0)
        self.calls[mid] = call + 1
        self.active.setdefault(mid, []).append(call)
        flat = flatten(inputs)
        self._record(flat, fqn, call, "input")
        new = self._tap(flat, fqn, call, "grad_input") if self.taps else None
        if self.ops is not None:
            self.ops.enter(fqn, call)
        if new is not None:
            return rebuild(inputs, iter(new))
        return None

    @_model_call
    def _post(self, mid, fqn, inputs, output):
        stack = self.active.get(mid)
        call = stack.pop() if stack else self.calls.get(mid, 1) - 1
        if self.ops is not None:
            self.ops.leave(fqn, call)
        flat = flatten(output)
        self._record(flat, fqn, call, "output")
        if self.taps:
            new = self._tap(flat, fqn, call, "grad_output")
            if new is not None:
                return rebuild(output, iter(new))
        return None

    def _record(self, flat, fqn, call, role):
        """Record the tensors FLAT of one side (ROLE) of a forward call; an
        inline (sync) pipeline writes their frames before the hook returns."""
        record = self.rec.record
        if self.target is not None and self.target.at(fqn, call):
            record = self.rec.record_full  # whole payloads (option target_op)
        for i, t in enumerate(flat):
            record(fqn, call, "forward", role, i, t)
        if self._sync:
            self.flush()

    def _tap(self, flat, fqn, call, role):
        """Route the tensors that need grad through a _Tap (tap); None if
        none do."""
        rec, flush, ops = self.rec, self.flush, self.ops

        def on_grads(got):
            self.quiet += 1
            try:
                for pos, g in got:
                    rec.record(fqn, call, "backward", role, pos, g)
                flush()
            finally:
                self.quiet -= 1
            if ops is not None:
                ops.backward_reached(fqn, call, role)

        return tap(rec, flat, on_grads)
