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

import threading
import weakref

import torch

from capd_runner import tensors as T


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


def param_owner(name):
    owner, _dot, local = name.rpartition(".")
    return owner or "model", local


class PayloadBudget(object):
    def __init__(self, limit):
        self.limit = limit
        self.used = 0


class Recorder(object):
    """Turns tensors into ``tensor`` frames (emit=True) or only hashes them.

    The analysis of a tensor (stats and hash) is cached per tensor object and
    version, so a tensor that is one module's output and the next one's input
    is read once.
    """

    def __init__(self, writer, level, sample_size, budget, stats_engine, emit=True):
        self.writer = writer
        self.level = level
        self.sample_size = sample_size
        self.budget = budget
        self.engine = stats_engine
        self.emit = emit
        self.seq = 0
        self.hashes = {}
        self.order = []
        self.lock = threading.Lock()
        self._cache = {}
        self._positions = {}
        self.fallback_noted = False
        self.exhausted_noted = False

    # -- analysis ----------------------------------------------------------
    def _sig(self, t):
        return (t._version, t.data_ptr(), tuple(t.shape), tuple(t.stride()),
                t.storage_offset(), t.dtype, t.device)

    def _analyze(self, t):
        """(stats or None, hash, prepared tensor, cpu contiguous tensor or None)."""
        ent = self._cache.get(id(t))
        sig = None
        try:
            sig = self._sig(t)
        except Exception:
            pass
        if ent is not None and ent[0]() is t and ent[1] == sig and (ent[2] is not None or not self.emit):
            return ent[2], ent[3]
        p = T.prepare(t)
        cpu = T.cpu_contiguous(p)
        h = T.content_hash(cpu)
        stats = self.engine.stats(p) if self.emit else None
        if sig is not None:
            try:
                self._cache[id(t)] = (weakref.ref(t), sig, stats, h)
            except TypeError:
                pass
        return stats, h

    def alias(self, src, dst):
        """``dst`` is a bit-identical copy of ``src`` (a tap's clone)."""
        ent = self._cache.get(id(src))
        if ent is None or ent[0]() is not src:
            return
        try:
            self._cache[id(dst)] = (weakref.ref(dst), self._sig(dst), ent[2], ent[3])
        except Exception:
            pass

    def clear_cache(self):
        self._cache.clear()

    # -- records -----------------------------------------------------------
    def record(self, module, call, phase, role, index, t):
        key = "%s.%d.%s.%s.%s" % (module, call, phase, role, index)
        with self.lock:
            stats, h = self._analyze(t)
            self.hashes[key] = h
            self.order.append(key)
            if not self.emit:
                return
            header = {
                "kind": "tensor", "seq": self.seq, "key": key, "module": module, "call": call,
                "phase": phase, "role": role, "index": index,
                "dtype": T.dtype_name(t.dtype), "shape": list(t.shape), "numel": t.numel(),
                "stats": stats, "hash": h,
            }
            self.seq += 1
            self._payload_and_write(key, header, t)

    def _payload_and_write(self, key, header, t):
        level = self.level
        if level == "stats":
            header["capture"] = "stats"
            self.writer.frame(header)
            return
        numel = t.numel()
        itemsize = t.element_size()
        if level == "full":
            need = numel * itemsize
            if self.budget.used + need <= self.budget.limit and need <= (1 << 30):
                cpu = T.cpu_contiguous(T.prepare(t))
                header["capture"] = "full"
                self.budget.used += need
                self.writer.frame(header, T.raw_bytes(cpu))
                return
            if not self.fallback_noted:
                self.fallback_noted = True
                self.writer.note("warn", "capture full: max_payload_bytes (%d) would be exceeded at %s "
                                 "(%d bytes used, %d more needed); falling back to sample for the "
                                 "rest of the cell" % (self.budget.limit, key, self.budget.used, need))
            self.level = level = "sample"
        # sample
        k = min(self.sample_size, numel)
        need = k * itemsize
        if self.budget.used + need > self.budget.limit:
            if not self.exhausted_noted:
                self.exhausted_noted = True
                self.writer.note("warn", "max_payload_bytes (%d) reached at %s: stats only for the "
                                 "rest of the cell" % (self.budget.limit, key))
            header["capture"] = "stats"
            self.writer.frame(header)
            return
        p = T.prepare(t).reshape(-1)
        if k == numel:
            sample = T.cpu_contiguous(p)
        else:
            pos = self._positions.get((numel, k, str(p.device)))
            if pos is None:
                pos = torch.tensor(T.sample_positions(numel, self.sample_size), dtype=torch.int64,
                                   device=p.device)
                self._positions[(numel, k, str(p.device))] = pos
            sample = T.cpu_contiguous(p.index_select(0, pos))
        header["capture"] = "sample"
        header["sample_positions"] = "stride"
        self.budget.used += need
        self.writer.frame(header, T.raw_bytes(sample))


class Capture(object):
    """Hooks on every module of ``model`` for one capture run."""

    def __init__(self, model, recorder, taps=False):
        self.model = model
        self.rec = recorder
        self.taps = taps
        self.names = {}
        for name, m in model.named_modules():
            self.names.setdefault(id(m), name or "model")
        self.calls = {}
        self.active = {}
        self.handles = []

    def __enter__(self):
        for _name, m in self.model.named_modules():
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def flush(self):
        if self.rec.emit:
            self.rec.writer.flush()

    # -- hooks -------------------------------------------------------------
    def _pre(self, module, inputs):
        mid = id(module)
        fqn = self.names.get(mid, "model")
        call = self.calls.get(mid, 0)
        self.calls[mid] = call + 1
        self.active.setdefault(mid, []).append(call)
        flat = flatten(inputs)
        for i, t in enumerate(flat):
            self.rec.record(fqn, call, "forward", "input", i, t)
        self.flush()
        if self.taps:
            new = self._tap(flat, fqn, call, "grad_input")
            if new is not None:
                return rebuild(inputs, iter(new))
        return None

    def _post(self, module, inputs, output):
        mid = id(module)
        fqn = self.names.get(mid, "model")
        stack = self.active.get(mid)
        call = stack.pop() if stack else self.calls.get(mid, 1) - 1
        flat = flatten(output)
        for i, t in enumerate(flat):
            self.rec.record(fqn, call, "forward", "output", i, t)
        self.flush()
        if self.taps:
            new = self._tap(flat, fqn, call, "grad_output")
            if new is not None:
                return rebuild(output, iter(new))
        return None

    def _tap(self, flat, fqn, call, role):
        """Route the tensors that need grad through a _Tap; None if none do."""
        first = {}
        positions = []
        tapped = []
        for i, t in enumerate(flat):
            if t.requires_grad and id(t) not in first:
                first[id(t)] = len(tapped)
                positions.append(i)
                tapped.append(t)
        if not tapped:
            return None
        rec = self.rec
        flush = self.flush

        def on_grads(grads):
            for pos, g in zip(positions, grads):
                if g is not None:
                    rec.record(fqn, call, "backward", role, pos, g)
            flush()

        clones = _Tap.apply(on_grads, *tapped)
        if isinstance(clones, torch.Tensor):
            clones = (clones,)
        for src, dst in zip(tapped, clones):
            rec.alias(src, dst)
        out = []
        for t in flat:
            j = first.get(id(t)) if t.requires_grad else None
            out.append(clones[j] if j is not None else t)
        return out
