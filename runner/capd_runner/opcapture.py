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

torch 1.13 and 2.x both call ``__torch_dispatch__(self, func, types, args=(),
kwargs=None)`` with the mode itself switched off while the handler runs and
are entered with ``with Mode():``; both give ``func._schema``. Where the class
does not exist (torch < 1.13) the cell fails with that reason.
"""

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

    def __init__(self, capture):
        self.cap = capture
        self.stack = []  # open forward module calls: (fqn, call)
        self.bwd = []  # backward: module calls whose output gradient arrived
        self.counts = {}  # (fqn, call, phase, name) -> calls so far
        self._kinds = {}  # func -> _computed_returns(func)
        self.mode = None

    def start(self):
        cls = dispatch_mode_class()
        if cls is None:
            raise RuntimeError(unsupported_reason())
        owner = self

        class _Mode(cls):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                owner.dispatched(func, out)
                return out

        self.mode = _Mode()
        self.mode.__enter__()

    def stop(self):
        mode, self.mode = self.mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

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

    def dispatched(self, func, out):
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
        seen = set()
        cap.quiet += 1
        try:
            rec = cap.rec
            for i, t in enumerate(tensors):
                if id(t) in seen or t.layout != torch.strided:
                    continue
                seen.add(id(t))
                rec.record(fqn, call, phase, role, i, t, op=(name, n))
            cap.flush()
        finally:
            cap.quiet -= 1
