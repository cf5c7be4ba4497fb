"""Module replay on recorded inputs (option ``target_inputs`` whose manifest
says ``"unit": "module"``; docs/runner.md, "Op replay on recorded inputs"):
the cell builds its own model as usual, and one call of one of its modules
is given the recorded inputs instead of those the model computes for it;
everything else runs as usual. opreplay.build reads the manifest and sends
such a folder here.

The manifest (``format`` 1, or none named):

    {"unit": "module", "module": "<fqn>", "call": N,
     "args": [{"index": i, "file": "inputs/arg.<i>.npy", "dtype": ..., "shape": [...],
               "role": "input", "key": "<fqn>.<N>.forward.input.<i>"}, ...]}

``args`` are the call's flat tensor inputs (capture.flatten of its
positional inputs, what its ``input`` records number) in index order, as
C-contiguous .npy files (bfloat16 as '<u2' raw bits), read with repro.py's
read_npy. ``<fqn>`` is a module name as record keys write it (the root is
``model``); N counts that module's calls in one run of the model, from 0,
as the capture does.

Three hooks of the model's own, registered when it is built, so before
capture.Capture's (a model with hooks of its own is hooked module by
module, after them):

* a forward pre-hook on the root module starts a run (the count);
* a forward pre-hook on module <fqn> replaces, on its call N, the call's
  flat tensor inputs in index order with tensors rebuilt from the arrays,
  fresh in every run, each with the strides of the input it replaces (what
  this build passes there) over a storage of its own. Capture's pre-hook
  then records them as the call's ``input`` records, and its output is
  what the module computes from them. Their number, shapes and dtypes must
  be the call's, else the cell fails saying which. In the float64
  reference's copy of the model (cell._reference_run: a deep copy moved to
  float64) floating ones are float64, and their dtypes are not checked;
* a forward hook on the root module ends the run: the cell fails where
  call N did not happen in it.
"""

import os

import torch

from capd_runner.capture import flatten, rebuild
from capd_runner.naming import module_names
from capd_runner.tensors import dtype_name


def build(R, d, m, own):
    """(model, inputs): OWN()'s, the module call of manifest M (of folder
    D; R: the repro module) given its recorded inputs; CellFailed saying
    why where it cannot be."""
    from capd_runner.cell import CellFailed
    try:
        inputs = Inputs(R, d, m)
    except R.Fail as e:
        raise CellFailed("target_inputs %s: %s" % (d, e))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CellFailed("target_inputs %s: %s: %s" % (d, type(e).__name__, e))
    model, model_inputs = own()
    Replay(inputs).install(model)
    return model, model_inputs


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


class Inputs(object):
    """The manifest's module call and its recorded inputs (shared by every
    copy of the model)."""

    def __init__(self, R, d, m):
        path = os.path.join(d, "manifest.json")
        if m.get("format", 1) != 1:
            raise R.Fail("%s: format %r, the runner reads format 1" % (path, m.get("format")))
        self.fqn, self.call, args = m.get("module"), m.get("call"), m.get("args")
        if not isinstance(self.fqn, str) or not self.fqn:
            raise R.Fail("%s: unit module without a module name (module %r)" % (path, self.fqn))
        if not _is_int(self.call) or self.call < 0:
            raise R.Fail("%s: call %r is not a call number (an integer from 0)"
                         % (path, self.call))
        if not isinstance(args, list) or not all(isinstance(a, dict) for a in args):
            raise R.Fail("%s has no args list" % path)
        index = [a.get("index") for a in args]
        if not all(_is_int(i) for i in index) or sorted(index) != list(range(len(args))):
            raise R.Fail("%s: args indexes %r, not 0 to %d" % (path, index, len(args) - 1))
        self.args = sorted(args, key=lambda a: a["index"])
        for a in self.args:
            if a.get("role", "input") != "input":
                raise R.Fail("%s: args entry %d has role %r; a module call's are role input"
                             % (path, a["index"], a.get("role")))
        self.arrays = [R.read_npy(os.path.join(d, a["file"]), a["dtype"]) for a in self.args]
        for a, v in zip(self.args, self.arrays):
            if list(v.shape) != list(a["shape"]):
                raise R.Fail("%s holds shape %s, the manifest says %s"
                             % (a["file"], list(v.shape), a["shape"]))
        self.R = R

    def where(self):
        return "target_inputs: module %s call %d" % (self.fqn, self.call)

    def tensors(self, flat, wide):
        """Tensors for the call's flat inputs FLAT, rebuilt (module doc),
        floating ones float64 when WIDE; CellFailed where they do not fit."""
        from capd_runner.cell import CellFailed
        if len(flat) != len(self.arrays):
            raise CellFailed("%s has %d tensor inputs, the manifest records %d"
                             % (self.where(), len(flat), len(self.arrays)))
        out = []
        for i, (t, v) in enumerate(zip(flat, self.arrays)):
            if t.layout != torch.strided:
                raise CellFailed("%s: input %d is %s, not strided" % (self.where(), i, t.layout))
            if list(t.shape) != list(v.shape):
                raise CellFailed("%s: input %d has shape %s, the recorded one %s"
                                 % (self.where(), i, list(t.shape), list(v.shape)))
            if wide and v.is_floating_point():
                v = v.double()
            elif t.dtype != v.dtype:
                raise CellFailed("%s: input %d is %s, the recorded one %s"
                                 % (self.where(), i, dtype_name(t.dtype), dtype_name(v.dtype)))
            if t.is_contiguous():
                out.append(v.clone())
            else:
                out.append(self.R.strided(v, list(t.shape), list(t.stride()), 0))
        return out


class Replay(object):
    """The hooks' state for one copy of the model (module doc). A deep copy
    (the float64 reference's model) gets its own, WIDE."""

    def __init__(self, inputs, wide=False):
        self.inputs = inputs
        self.wide = wide
        self.count = 0  # calls of the module so far in this run
        self.ran = False  # whether call N happened in this run

    def __deepcopy__(self, memo):
        return Replay(self.inputs, wide=True)

    def install(self, model):
        from capd_runner.cell import CellFailed
        names, modules, _hooked = module_names(model)
        found = [mod for mod in modules if names[id(mod)] == self.inputs.fqn]
        if not found:
            raise CellFailed("target_inputs: the model has no module %s" % self.inputs.fqn)
        model.register_forward_pre_hook(self.start)  # first: before pre on the root itself
        found[0].register_forward_pre_hook(self.pre)
        model.register_forward_hook(self.end)

    def start(self, module, inputs):
        self.count, self.ran = 0, False

    def pre(self, module, inputs):
        n = self.count
        self.count = n + 1
        if n != self.inputs.call:
            return None
        self.ran = True
        return rebuild(inputs, iter(self.inputs.tensors(flatten(inputs), self.wide)))

    def end(self, module, inputs, output):
        if not self.ran:
            from capd_runner.cell import CellFailed
            raise CellFailed("%s never ran" % self.inputs.where())
