"""The planted Inductor fault of the compiler bisection tests: a
sitecustomize.py that scales torch._inductor.lowering's relu lowering by
1 + 2**-8 once that module is imported (torch is not imported at
interpreter start). One copy of it, tests/helpers/planted_inductor_fault/
sitecustomize.py, which C tests name by its path (its directory first on
a cell's PYTHONPATH); SITE_DIR is that directory, SITECUSTOMIZE its text."""

import os

SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "helpers", "planted_inductor_fault")
SITE_FILE = os.path.join(SITE_DIR, "sitecustomize.py")
FACTOR = 1 + 2 ** -8

with open(SITE_FILE) as _f:
    SITECUSTOMIZE = _f.read()


def write_site(d):
    """Writes SITECUSTOMIZE as D/sitecustomize.py (D made if missing);
    returns D, to put first on a PYTHONPATH."""
    if not os.path.isdir(d):
        os.makedirs(d)
    with open(os.path.join(d, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    return d
