"""Op replay on recorded inputs (option ``target_inputs``; docs/runner.md,
"Op replay on recorded inputs"): instead of the cell's model, one ATen op
call rebuilt from a reproducer folder (runner/repro/repro.py's layout:
``manifest.json`` and ``inputs/arg.<i>.npy``), as a model of its own.
A manifest with ``"unit": "module"`` is a module call's inputs instead:
the cell's own model runs, that call given them (modreplay.py); without
``unit``, or ``"unit": "op"``, it is an op call's.

The op model is a root module (records under module ``model``) whose
forward makes exactly one call of that op, so its targeted key is
``model.0.forward/op.<aten name>.0``. Its inputs are the call's tensor
arguments, rebuilt as repro.py rebuilds them (dtype, shape, stride, storage
offset, over a zeroed storage), in index order.

The tensors forward receives are rebuilt again, in a forward pre-hook, on
every call: the cell's ``_place`` casts floating inputs to the job's dtype
(which may lose bits: a float32 argument in a bfloat16 job) and a cast
loses the strides and the storage offset, and an in-place op would change
the inputs of the next run (the determinism run, the reference). The hook
runs before capture's own pre-hook has opened the module call, so the
per-op records (opcapture.py) neither see nor count its torch calls. In the
float64 reference's copy of the model (cell._reference_run: a deep copy
moved to float64) the floating arguments are float64 instead, what
repro.py's float64 evaluation passes; the rest is unchanged.

repro.py is imported by path from the runner's directory (it sits beside
this package there, in the source tree and installed alike); its ``Fail``
(a call that cannot be rebuilt: an unsupported argument, an op this torch
lacks, an unreadable array) fails the cell with its reason.
"""

import json
import os

import torch

REPRO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "repro",
                     "repro.py")
_loaded = []  # [the repro module] once imported


def wanted(spec):
    """Whether the cell replays an op call (option target_inputs set)."""
    d = spec.options.get("target_inputs")
    return d is not None and d != ""


def _repro():
    if not _loaded:
        import importlib.util
        where = importlib.util.spec_from_file_location("capd_repro", REPRO)
        mod = importlib.util.module_from_spec(where)
        where.loader.exec_module(mod)
        _loaded.append(mod)
    return _loaded[0]


UNITS = ("op", "module")


def build(spec, dtype, own):
    """(model, inputs) of option target_inputs, or CellFailed saying why
    there is none: the op model, or OWN() (the cell's model and inputs, as
    cell._build makes them) with a module call given the recorded inputs.
    DTYPE: the job's dtype (cell._build's)."""
    from capd_runner.cell import CellFailed
    d = spec.options.get("target_inputs")
    if not isinstance(d, str) or not os.path.isabs(d):
        raise CellFailed("option target_inputs must be a folder's absolute path, not %r" % (d,))
    try:
        R = _repro()
    except Exception as e:
        raise CellFailed("target_inputs: cannot load the reproducer %s: %s: %s"
                         % (REPRO, type(e).__name__, e))
    try:
        m = manifest(R, d)
    except R.Fail as e:
        raise CellFailed("target_inputs %s: %s" % (d, e))
    unit = "op" if m.get("unit") is None else m["unit"]
    if unit not in UNITS:
        raise CellFailed("target_inputs %s: manifest unit %r, the runner replays %s"
                         % (d, unit, " or ".join(UNITS)))
    if spec.pass_ != "forward":
        raise CellFailed("target_inputs: %s replay runs the forward pass only, not pass %s"
                         % (unit, spec.pass_))
    if spec.device != "cpu":
        raise CellFailed("target_inputs: %s replay runs on the CPU only, not device %s"
                         % (unit, spec.device))
    if unit == "module":
        from capd_runner import modreplay
        return modreplay.build(R, d, m, own)
    try:
        model = OpModel(_Call(R, d, m, dtype))
    except R.Fail as e:
        raise CellFailed("target_inputs %s: %s" % (d, e))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CellFailed("target_inputs %s: %s: %s" % (d, type(e).__name__, e))
    return model, model.arguments()


def manifest(R, d):
    """The object of folder D's manifest.json; R.Fail where there is none."""
    path = os.path.join(d, "manifest.json")
    try:
        with open(path) as f:
            m = json.load(f)
    except OSError as e:
        raise R.Fail("cannot read %s: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise R.Fail("%s is not JSON: %s" % (path, e))
    if not isinstance(m, dict):
        raise R.Fail("%s is not a JSON object" % path)
    return m


class _Call(object):
    """What every copy of an op model shares (copy.deepcopy keeps this
    object): the manifest M (of folder D), the recorded arrays, the op."""

    def __init__(self, R, d, m, dtype):
        path = os.path.join(d, "manifest.json")
        if m.get("format") != 1:
            raise R.Fail("%s: format %r, the runner reads format 1" % (path, m.get("format")))
        call = m.get("op_call")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise R.Fail("%s has no op_call" % path)
        if not isinstance(m.get("args"), list):
            raise R.Fail("%s has no args list" % path)
        R.layouts(m)
        self.R = R
        self.args = sorted(m["args"], key=lambda a: a["index"])
        self.arrays = dict((a["index"], R.read_npy(os.path.join(d, a["file"]), a["dtype"]))
                           for a in self.args)
        self.call = call
        self.op = R.resolve(call)
        self.job_dtype = dtype

    def __deepcopy__(self, memo):
        return self

    def tensors(self, wide):
        """The arguments, fresh, in index order (floating ones in float64
        when WIDE): repro.py's run() makes them so."""
        R, out = self.R, []
        for a in self.args:
            v = self.arrays[a["index"]]
            if wide and v.is_floating_point():
                v = v.double()
            out.append(R.strided(v, a["shape"], a.get("stride"), a.get("storage_offset") or 0))
        return tuple(out)

    def values(self, tensors):
        """(args, kwargs) of the op call, its tensors TENSORS."""
        by_index = dict((a["index"], t) for a, t in zip(self.args, tensors))
        args = self.R.build(self.call.get("args", []), by_index)
        kwargs = dict((k, self.R.build(v, by_index))
                      for k, v in (self.call.get("kwargs") or {}).items())
        return args, kwargs


def _fresh(module, inputs):
    """The op model's forward pre-hook: the arguments rebuilt (module doc)."""
    return module.arguments()


class OpModel(torch.nn.Module):
    """One op call as a model: forward(*tensors) calls the op once and
    returns its results as repro.py's computed() numbers them (one tensor,
    or a tuple)."""

    def __init__(self, call):
        super(OpModel, self).__init__()
        self.call = call
        # float32 here; the cell's model.to(dtype) makes it the job's dtype,
        # the reference's .to(float64) float64.
        self.register_buffer("float64_probe", torch.zeros(1, dtype=torch.float32))
        self.home = id(self)  # a deep copy (the reference's) is elsewhere
        try:
            self.call.values(self.arguments())  # an argument tree that cannot be built
        except KeyError as e:
            raise self.call.R.Fail("op_call names tensor argument %s, which the manifest's "
                                   "args do not list" % (e,))
        self.register_forward_pre_hook(_fresh)

    def float64(self):
        """Whether this is the float64 reference's copy of the model."""
        if self.float64_probe.dtype != torch.float64:
            return False
        # A float64 job's own model is float64 too: the copy tells them apart.
        return self.call.job_dtype != torch.float64 or id(self) != self.home

    def arguments(self):
        return self.call.tensors(self.float64())

    def forward(self, *tensors):
        args, kwargs = self.call.values(tensors)
        op = self.call.op
        out = self.call.R.computed(op, op(*args, **kwargs))
        return out[0] if len(out) == 1 else tuple(out)
