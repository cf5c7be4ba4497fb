"""Cell spec: read from the JSON file named by $CAPD_CELL_SPEC and checked.

The options' defaults and ranges come from schema/options.json, the table
capd's API validates a job against (docs/api.md): capd sends every option
resolved, and a missing one takes the table's default. Anything of the
wrong type or out of range is a SpecError, which the runner reports as
``end`` status ``failed``.
"""

import json
import os

PASSES = ("forward", "backward")
# The compile axis (docs/runner.md, "Compiled cells (mode)"): the spec's
# top-level "mode"; absent or null is "eager" (a capd from before it).
MODES = ("eager", "aot_eager", "inductor")

# schema/options.json sits two levels above this package both in the source
# tree (runner/capd_runner/) and where capd installs it
# (share/capd/runner/capd_runner/ beside share/capd/schema/).
OPTIONS_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "schema", "options.json")


def _load_table(path=OPTIONS_TABLE):
    with open(path) as f:
        t = json.load(f)
    defaults = dict((o["name"], o["default"]) for o in t["integer"] + t["enum"])
    ranges = dict((o["name"], (o["min"], o["max"])) for o in t["integer"])
    enums = dict((o["name"], tuple(o["values"])) for o in t["enum"])
    return defaults, ranges, enums


DEFAULT_OPTIONS, _INT_RANGES, _ENUMS = _load_table()
DEVICES = _ENUMS["device"]

# capd's width table, beside the options table; capd sends a cell its row's
# "isa" and "effective" (width_isa, width_effective), and the zygote's
# verification cells, which it writes itself, take them from here.
WIDTHS_TABLE = os.path.join(os.path.dirname(OPTIONS_TABLE), "widths.json")


def width_row(name, path=WIDTHS_TABLE):
    """The row of width NAME in capd's width table, or {} (no table, no
    such width)."""
    try:
        with open(path) as f:
            rows = json.load(f).get("widths") or []
    except (OSError, ValueError, AttributeError):
        return {}
    for row in rows:
        if isinstance(row, dict) and row.get("name") == name:
            return row
    return {}


class SpecError(ValueError):
    pass


class CellSpec(object):
    """Checked cell spec; attribute access to the fields the runner uses."""

    def __init__(self, raw):
        self.raw = raw
        self.protocol = raw.get("protocol")
        self.job = raw.get("job")
        self.cell = raw.get("cell")
        self.attempt = raw.get("attempt")
        self.model = raw.get("model")
        self.width = raw.get("width")
        self.pass_ = raw.get("pass")
        self.device = raw.get("device", "cpu")
        self.frame_fd = raw.get("frame_fd", 3)
        self.scratch = raw.get("scratch")
        self.model_roots = raw.get("model_roots", [])
        self.width_requires = raw.get("width_requires") or []
        # The width's row of capd's width table (docs/widths.md): the
        # widest instruction level any library may run ("isa"; None: no
        # ceiling) and the ATen capability to read back ("effective"; None:
        # the width's own name).
        self.width_isa = raw.get("width_isa")
        self.width_effective = raw.get("width_effective")
        self.reference = raw.get("reference")
        mode = raw.get("mode")
        self.mode = "eager" if mode is None else mode
        opts = dict(DEFAULT_OPTIONS)
        opts.update(raw.get("options") or {})
        self.options = opts

    def __getattr__(self, name):  # options as attributes: spec.iterations
        opts = self.__dict__.get("options")
        if opts is not None and name in opts:
            return opts[name]
        raise AttributeError(name)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check(raw):
    if not isinstance(raw, dict):
        raise SpecError("cell spec is not a JSON object")
    if raw.get("protocol") != 1:
        raise SpecError("cell spec protocol is %r, this runner speaks protocol 1"
                        % (raw.get("protocol"),))
    spec = CellSpec(raw)
    if not isinstance(spec.model, str) or not spec.model:
        raise SpecError("cell spec: 'model' must be a non-empty string")
    if not isinstance(spec.width, str) or not spec.width:
        raise SpecError("cell spec: 'width' must be a non-empty string")
    if spec.pass_ not in PASSES:
        raise SpecError("cell spec: 'pass' must be one of %s, not %r" % ("/".join(PASSES), spec.pass_))
    if not isinstance(spec.mode, str) or spec.mode not in MODES:
        raise SpecError("cell spec: 'mode' must be one of %s (or absent or null: eager), not %r"
                        % ("/".join(MODES), spec.mode))
    if spec.device not in DEVICES:
        raise SpecError("cell spec: 'device' must be one of %s, not %r" % ("/".join(DEVICES), spec.device))
    if not _is_int(spec.frame_fd) or spec.frame_fd < 0:
        raise SpecError("cell spec: 'frame_fd' must be a non-negative integer")
    roots = spec.model_roots
    if roots is None:
        roots = spec.model_roots = []
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise SpecError("cell spec: 'model_roots' must be an array of strings")
    req = spec.width_requires
    if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
        raise SpecError("cell spec: 'width_requires' must be an array of strings")
    _check_width_row(spec)
    _check_reference(raw.get("reference"))
    opts = raw.get("options", {})
    if opts is not None and not isinstance(opts, dict):
        raise SpecError("cell spec: 'options' must be an object")
    o = spec.options
    for name, (lo, hi) in _INT_RANGES.items():
        v = o[name]
        if not _is_int(v) or v < lo or v > hi:
            raise SpecError("cell spec: option %r must be an integer in [%d, %d], not %r" % (name, lo, hi, v))
    for name, values in sorted(_ENUMS.items()):
        if o[name] not in values:
            raise SpecError("cell spec: option %r must be one of %s, not %r"
                            % (name, "/".join(values), o[name]))
    return spec


def _check_width_row(spec):
    from capd_runner.libs import LEVELS
    for name in ("width_isa", "width_effective"):
        v = getattr(spec, name)
        if v is not None and (not isinstance(v, str) or not v):
            raise SpecError("cell spec: '%s' must be null or a non-empty string, not %r" % (name, v))
    if spec.width_isa is not None and spec.width_isa not in LEVELS:
        raise SpecError("cell spec: 'width_isa' must be null or one of %s, not %r"
                        % ("/".join(LEVELS), spec.width_isa))


def expected_capability(spec):
    """The ATen capability the cell must read back, lower-cased; None for
    width native (whatever is effective is accepted and recorded)."""
    if spec.width.strip().lower() == "native":
        return None
    return (spec.width_effective or spec.width).strip().lower()


def _check_reference(ref):
    """The control build a paired head cell times beside its own
    (docs/runner.md, "Paired timing"); absent means unpaired."""
    if ref is None:
        return
    if not isinstance(ref, dict):
        raise SpecError("cell spec: 'reference' must be an object")
    for name in ("build", "python"):
        if not isinstance(ref.get(name), str) or not ref.get(name):
            raise SpecError("cell spec: 'reference.%s' must be a non-empty string" % name)
    env = ref.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise SpecError("cell spec: 'reference.env' must be an object of strings")
    roots = ref.get("model_roots", [])
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise SpecError("cell spec: 'reference.model_roots' must be an array of strings")


def load(path=None):
    """Read and check the spec named by $CAPD_CELL_SPEC (or ``path``)."""
    if path is None:
        path = os.environ.get("CAPD_CELL_SPEC")
    if not path:
        raise SpecError("CAPD_CELL_SPEC is not set")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SpecError("cannot read cell spec %s: %s" % (path, e.strerror or e))
    try:
        raw = json.loads(data.decode("utf-8"))
    except ValueError as e:
        raise SpecError("cell spec %s is not valid JSON: %s" % (path, e))
    return check(raw)


def peek_frame_fd(path=None):
    """Best-effort frame_fd for reporting a spec that does not check."""
    try:
        if path is None:
            path = os.environ.get("CAPD_CELL_SPEC")
        with open(path, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
        fd = raw.get("frame_fd", 3)
        if _is_int(fd) and fd >= 0:
            return fd
    except Exception:
        pass
    return 3
