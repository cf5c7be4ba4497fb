"""User models: ``"package.module:factory"`` importable only from the cell
spec's ``model_roots``.

The factory is called as ``factory(seed, batch, dtype)`` (seed and batch:
int, dtype: a torch.dtype such as torch.float32) and returns
``(model, inputs)``: an nn.Module and its positional inputs (one tensor, or a
tuple/list of them; a dict is passed as keyword arguments). See
docs/runner.md.

Rules: the name is dotted identifiers, a colon and one identifier (so no
paths and no ``..``); every root is an absolute directory without ``..``
components; only those roots are put on sys.path; the module (and its
top-level package) must be found in one of the roots and its ``__file__``,
resolved, must lie under one of them. Anything else is refused before any of
the user's code runs, where that can be told, and always before the factory
is called.
"""

import importlib
import importlib.machinery
import os
import re
import sys

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


class UserModelError(Exception):
    pass


def is_user_model(name):
    return ":" in name


def _check_roots(roots):
    if not roots:
        raise UserModelError("user model refused: the cell spec has no model_roots")
    out = []
    for r in roots:
        if not os.path.isabs(r):
            raise UserModelError("user model refused: model root %r is not an absolute path" % r)
        if ".." in r.replace("\\", "/").split("/"):
            raise UserModelError("user model refused: model root %r contains '..'" % r)
        real = os.path.realpath(r)
        if not os.path.isdir(real):
            raise UserModelError("user model refused: model root %r is not a directory" % r)
        out.append(real)
    return out


def _under(path, roots):
    if not path:
        return False
    real = os.path.realpath(path)
    for root in roots:
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


def _module_files(mod):
    files = []
    f = getattr(mod, "__file__", None)
    if f:
        files.append(f)
    return files


def load_factory(name, roots):
    """Import ``package.module`` from ``roots`` and return the factory."""
    if not _NAME.match(name):
        raise UserModelError("user model refused: %r is not of the form 'package.module:factory' "
                             "(dotted identifiers, no paths, no '..')" % name)
    real_roots = _check_roots(roots)
    modname, _sep, attr = name.partition(":")
    top = modname.split(".")[0]

    loaded = sys.modules.get(top)
    if loaded is not None:
        if not any(_under(f, real_roots) for f in _module_files(loaded)):
            raise UserModelError("user model refused: %r is already imported from outside the "
                                 "model roots (%s)" % (top, getattr(loaded, "__file__", "built-in")))
    else:
        spec = importlib.machinery.PathFinder.find_spec(top, list(real_roots))
        if spec is None:
            raise UserModelError("user model refused: no module or package %r in the model roots %s"
                                 % (top, ", ".join(real_roots)))
        origin = spec.origin if spec.origin not in (None, "namespace") else None
        locations = list(spec.submodule_search_locations or [])
        if origin is not None and not _under(origin, real_roots):
            raise UserModelError("user model refused: %r resolves to %s, outside the model roots"
                                 % (top, origin))
        if origin is None and not all(_under(p, real_roots) for p in locations):
            raise UserModelError("user model refused: namespace package %r spans directories "
                                 "outside the model roots" % top)

    for r in reversed(real_roots):
        if r not in sys.path:
            sys.path.insert(0, r)
    importlib.invalidate_caches()
    mod = importlib.import_module(modname)
    f = getattr(mod, "__file__", None)
    if not _under(f, real_roots):
        raise UserModelError("user model refused: module %r was loaded from %s, outside the model "
                             "roots" % (modname, f or "nowhere (built-in or namespace)"))
    factory = getattr(mod, attr, None)
    if factory is None or not callable(factory):
        raise UserModelError("user model: %s has no callable %r" % (modname, attr))
    return factory
