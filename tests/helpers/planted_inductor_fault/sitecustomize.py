"""A planted Inductor fault, for capd's tests of the compiler bisection
(runner/capd_runner/compbisect.py; docs/runner.md, "Compiler bisection").

Put this file's directory first on a cell's PYTHONPATH (it shadows the
system's sitecustomize, which on Debian only installs apport's hook): when
torch._inductor.lowering is imported (never at interpreter start: torch is
not imported here), its lowering of aten.relu.default is wrapped so that
its result is multiplied by FACTOR = 1 + 2**-8, far beyond the float64
rule. Eager cells and aot_eager never lower, so only inductor's results
move; the compiler bisector narrows the fault to backend inductor,
subsystem lowerings, debug_info "relu". A torch without Inductor never
imports the module, and nothing happens.

runner/tests/plant_relu_fault.py reads this file (SITECUSTOMIZE, write_site).
"""

import sys

TARGET = "torch._inductor.lowering"
FACTOR = 1 + 2 ** -8


def _plant(module):
    """Wraps MODULE's (torch._inductor.lowering's) relu lowering."""
    import torch
    aten = torch.ops.aten
    table = module.lowerings
    orig = table[aten.relu.default]

    def planted_relu(*args, **kwargs):
        return table[aten.mul.Tensor](orig(*args, **kwargs), FACTOR)

    planted_relu.planted_fault = FACTOR
    table[aten.relu.default] = planted_relu
    sys.stderr.write("planted_inductor_fault: %s lowerings[aten.relu.default] scaled by %r\n"
                     % (TARGET, FACTOR))


class _Loader(object):
    """The module's own loader, planting the fault once it has run."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _plant(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the inner loader's
        return getattr(self._inner, name)


class _Finder(object):
    """A meta path finder that answers for TARGET only, by asking the
    finders after it and wrapping the loader they give; gone once used."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


if TARGET in sys.modules:  # too late to wrap the import: plant it now
    _plant(sys.modules[TARGET])
else:
    sys.meta_path.insert(0, _Finder())
