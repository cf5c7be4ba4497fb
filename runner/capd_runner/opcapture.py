"""Per-op capture (option ``granularity: "op"``): one record per ATen
operator dispatched inside each module call.

A ``torch.utils._python_dispatch.TorchDispatchMode`` is active for the whole
capture run. The module hooks of capture.Capture tell it which module call
is running (a stack: the innermost call owns the op); every operator that
reaches the mode while a call is open is run, then its result is recorded
with the key

    <module fqn>.<call>.<phase>/op.<aten name>.<n>.<role>.<i>

``aten name`` is the operator's schema name (``aten::gelu``, without the
overload), ``n`` counts the calls of that operator within the module call
(so an extra op elsewhere does not shift every later key), ``role`` is
``output`` in the forward pass and ``grad_input`` in the backward pass (the
gradients the op computes), ``i`` the tensor's position in the op's
flattened result. Records come in execution order, so the engine's
matching and first divergence need nothing new; the header also carries
``op`` and ``op_index``.

What is not recorded, and why:

* views and aliases (an output whose schema alias is read-only: ``view``,
  ``t``, ``expand``, ``detach``...): they compute nothing, and their data is
  the record of the op that wrote it;
* results of allocation ops (``empty``, ``new_empty``...): uninitialized
  memory, different on every run;
* an in-place op's mutated tensor is its result and is recorded once, as
  that op's output; the same tensor twice in one result is recorded once;
* ops run by capd's own hooks (snapshots, taps): Capture.quiet is set.

In the backward pass the autograd engine runs the ops on this thread, with
no module call open. They are attributed to the module call whose output
gradient arrived last (the _Tap on its outputs) and stop being attributed
to it once the gradient reached its inputs; ops before any module's output
gradient (the loss) are not recorded.

Targeted capture (option ``target_op``, a record key up to the op call:
``<module fqn>.<call>.<phase>/op.<aten name>.<n>``): that one call is also
recorded from the other side. Before it runs, its tensor arguments are
cloned; once it has run and taken occurrence ``n``, they are recorded as
role ``arg`` (``<target_op>.arg.<i>``: the values the op received, even when
it then changed them in place) and its results as usual, all with whole
payloads (Recorder.record_full) and a header field ``op_call`` that describes
the call (call_tree) so that runner/repro/repro.py can run it again on its
own. ``i`` numbers the distinct tensors of the call's positional arguments,
then of its keyword arguments by sorted name, depth first; a tensor passed
twice is one argument. A call with a tensor that is not strided (sparse...)
is not targeted: a note says so. A target that never ran gets a note at the
end of the capture run. A target_op without ``/op.`` names a module call
instead (``<fqn>.<call>.forward``: targetrec.ModuleTarget, recorded by
capture.Capture's hooks); the OpRecorder then has no target.

torch 1.13 and 2.x both call ``__torch_dispatch__(self, func, types, args=(),
kwargs=None)`` with the mode itself switched off while the handler runs and
are entered with ``with Mode():``; both give ``func._schema``. Where the class
does not exist (torch < 1.13) the cell fails with that reason.
"""

import json
import math

import torch

# Allocation ops whose result holds whatever memory held before.
_UNINITIALIZED = ("aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                  "aten::new_empty_strided", "aten::resize_", "aten::set_")


def dispatch_mode_class():
    """TorchDispatchMode, or None where this torch has none."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except Exception:
        return None
    if not hasattr(TorchDispatchMode, "__torch_dispatch__"):
        return None
    return TorchDispatchMode


def unsupported_reason():
    """Why granularity op cannot run here, or None when it can."""
    if dispatch_mode_class() is None:
        return ("granularity op needs torch.utils._python_dispatch.TorchDispatchMode "
                "(torch 1.13 or later); torch %s has none" % (torch.__version__,))
    return None


def op_name(func):
    schema = getattr(func, "_schema", None)
    name = getattr(schema, "name", None)
    if isinstance(name, str) and name:
        return name
    return str(getattr(func, "__name__", func))


def overload_name(func):
    schema = getattr(func, "_schema", None)
    return getattr(schema, "overload_name", "") or "default"


# torch's enum-like argument values, written as {"<kind>": "<name>"}.
_NAMED = ((torch.dtype, "dtype"), (torch.layout, "layout"), (torch.memory_format, "memory_format"))
# An op_call header text past this many bytes is replaced by one saying so.
OP_CALL_MAX = 24 * 1024


def _named(x):
    s = str(x)
    return s[6:] if s.startswith("torch.") else s


def call_tree(args, kwargs):
    """(args tree, kwargs tree, tensors): the call's arguments as JSON
    values (docs/runner.md, "Targeted capture") and its distinct tensors in
    the order of their ``arg`` numbers. Keyword arguments by sorted name."""
    tensors = []
    ids = {}

    def tree(x):
        if isinstance(x, torch.Tensor):
            i = ids.get(id(x))
            if i is None:
                i = ids[id(x)] = len(tensors)
                tensors.append(x)
            from capd_runner.tensors import dtype_name
            try:
                stride, offset = list(x.stride()), int(x.storage_offset())
            except Exception:  # not strided: no strides
                stride, offset = None, None
            return {"arg": i, "dtype": dtype_name(x.dtype), "shape": [int(d) for d in x.shape],
                    "stride": stride, "storage_offset": offset}
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            if math.isnan(x):
                return {"float": "nan"}
            if math.isinf(x):
                return {"float": "inf" if x > 0 else "-inf"}
            return float(x)
        if isinstance(x, (list, tuple)):
            return [tree(v) for v in x]
        if isinstance(x, torch.device):
            return {"device": str(x)}
        for cls, kind in _NAMED:
            if isinstance(x, cls):
                return {kind: _named(x)}
        return {"unsupported": repr(x)[:200]}

    a = [tree(x) for x in args]
    k = dict((name, tree(kwargs[name])) for name in sorted(kwargs, key=str))
    return a, k, tensors


def op_call_text(func, args, kwargs):
    """(compact JSON text of the op_call header field, distinct tensors)."""
    a, k, tensors = call_tree(args, kwargs)
    call = {"name": op_name(func), "overload": overload_name(func), "args": a, "kwargs": k}
    text = json.dumps(call, separators=(",", ":"), sort_keys=True, allow_nan=False)
    if len(text) > OP_CALL_MAX:
        call["args"] = {"unsupported": "op_call of %d bytes, more than a header holds (%d)"
                        % (len(text), OP_CALL_MAX)}
        call["kwargs"] = {}
        text = json.dumps(call, separators=(",", ":"), sort_keys=True)
    return text, tensors


def _write_returns(func):
    """Whether a returned value is written in place (an in-place or out=
    op's result: its input's tensor)."""
    rets = getattr(getattr(func, "_schema", None), "returns", None) or []
    return any(bool(getattr(getattr(r, "alias_info", None), "is_write", False)) for r in rets)


def _computed_returns(func):
    """Per returned value: False when it is a read-only alias of an input
    (a view), True otherwise; None when the schema says nothing."""
    schema = getattr(func, "_schema", None)
    rets = getattr(schema, "returns", None)
    if rets is None:
        return None
    out = []
    for r in rets:
        ai = getattr(r, "alias_info", None)
        out.append(ai is None or bool(getattr(ai, "is_write", False)))
    return out


class OpRecorder(object):
    """The dispatch mode's state for one Capture (one capture run)."""

    def __init__(self, capture, target_op=""):
        self.cap = capture
        # Targeted capture: the key prefix of the one op call recorded with
        # its arguments; none in a recorder with a prefix (the float64
        # reference's records are not the cell's).
        self.target = target_op if target_op and not capture.rec.prefix else None
        self.target_hit = False
        self.target_noted = False
        self.stack = []  # open forward module calls: (fqn, call)
        self.bwd = []  # backward: module calls whose output gradient arrived
        self.counts = {}  # (fqn, call, phase, name) -> calls so far
        self._kinds = {}  # func -> _computed_returns(func)
        self._written = {}  # func -> _write_returns(func)
        self.mode = None

    def start(self):
        cls = dispatch_mode_class()
        if cls is None:
            raise RuntimeError(unsupported_reason())
        owner = self

        class _Mode(cls):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                pre = None
                if owner.target is not None and not owner.target_hit:
                    pre = owner.before(func, args, kwargs)
                out = func(*args, **kwargs)
                owner.dispatched(func, out, pre)
                return out

        self.mode = _Mode()
        self.mode.__enter__()

    def stop(self):
        mode, self.mode = self.mode, None
        if mode is not None:
            mode.__exit__(None, None, None)
        if self.target is not None and not self.target_hit and not self.target_noted:
            self.target_noted = True
            self._note("target_op %s never ran in this cell" % self.target)

    def _note(self, msg):
        rec = self.cap.rec
        if rec.emit:
            rec.pipeline.note(lambda: rec.writer.note("warn", msg))

    # -- from the module hooks ----------------------------------------------
    def enter(self, fqn, call):
        self.stack.append((fqn, call))

    def leave(self, fqn, call):
        if self.stack and self.stack[-1] == (fqn, call):
            self.stack.pop()
        elif (fqn, call) in self.stack:  # a hook that raised left calls open
            del self.stack[self.stack.index((fqn, call)):]

    def backward_reached(self, fqn, call, role):
        if role == "grad_output":
            self.bwd.append((fqn, call))
        elif (fqn, call) in self.bwd:
            del self.bwd[self.bwd.index((fqn, call)):]

    # -- from the mode ------------------------------------------------------
    def _where(self):
        if self.stack:
            fqn, call = self.stack[-1]
            return fqn, call, "forward", "output"
        if self.bwd:
            fqn, call = self.bwd[-1]
            return fqn, call, "backward", "grad_input"
        return None

    def before(self, func, args, kwargs):
        """Before an op runs: when it would be the target call, (op_call
        text, clones of its tensors) or a str (why it cannot be targeted);
        else None."""
        if self.cap.quiet:
            return None
        where = self._where()
        if where is None:
            return None
        name = op_name(func)
        fqn, call, phase, _role = where
        n = self.counts.get((fqn, call, phase, name), 0)
        if "%s.%d.%s/op.%s.%d" % (fqn, call, phase, name, n) != self.target:
            return None
        text, tensors = op_call_text(func, args, kwargs)
        for t in tensors:
            if t.layout != torch.strided:
                return "an argument is %s, not strided" % (_named(t.layout),)
        self.cap.quiet += 1
        try:
            return text, [t.detach().clone() for t in tensors]
        finally:
            self.cap.quiet -= 1

    def _writes(self, func):
        w = self._written.get(func)
        if w is None:
            w = self._written[func] = _write_returns(func)
        return w

    def dispatched(self, func, out, pre=None):
        cap = self.cap
        if cap.quiet:
            return
        where = self._where()
        if where is None:
            return
        name = op_name(func)
        if name in _UNINITIALIZED:
            return
        kinds = self._kinds.get(func, False)
        if kinds is False:
            kinds = self._kinds[func] = _computed_returns(func)
        from capd_runner.capture import flatten
        if kinds is None or len(kinds) <= 1:
            tensors = flatten(out) if kinds is None or kinds[0:1] != [False] else []
        else:
            items = out if isinstance(out, (tuple, list)) else (out,)
            tensors = []
            for computed, item in zip(kinds, items):
                if computed:
                    tensors.extend(flatten(item))
        if not tensors:
            return
        fqn, call, phase, role = where
        ckey = (fqn, call, phase, name)
        n = self.counts.get(ckey, 0)
        self.counts[ckey] = n + 1
        if pre is not None:
            self.target_hit = True  # the call took occurrence n: it is the target
            if not isinstance(pre, str) and any(t.layout != torch.strided for t in tensors):
                pre = "a result is not strided"
            if isinstance(pre, str):
                self._note("target_op %s: not recorded with its arguments: %s"
                           % (self.target, pre))
                pre = None
        seen = set()
        cap.quiet += 1
        try:
            rec = cap.rec
            if self._writes(func):
                # An in-place (or out=) result is its input's tensor, whose
                # version torch bumps only after this handler returns: a
                # cached analysis of that version holds the value before
                # the op ran.
                for t in tensors:
                    rec._cache.pop(id(t), None)
            if pre is not None:
                op = (name, n, pre[0])
                for i, t in enumerate(pre[1]):
                    rec.record_full(fqn, call, phase, "arg", i, t, op)
                record = rec.record_full
            else:
                op = (name, n)
                record = rec.record
            for i, t in enumerate(tensors):
                if id(t) in seen or t.layout != torch.strided:
                    continue
                seen.add(id(t))
                record(fqn, call, phase, role, i, t, op=op)
            cap.flush()
        finally:
            cap.quiet -= 1
