#!/usr/bin/env python3
"""Standalone reproducer of one ATen op call that capd recorded.

capd writes this script into a reproducer archive next to:

    manifest.json        the call (op_call), its cell, the inputs' and
                         expected outputs' files, the width's environment
                         and both builds' identities
    inputs/arg.<i>.npy   the call's tensor arguments as the control build
                         passed them (before the op ran)
    expected/<side>.<role>.<i>.npy
                         what the control and the head computed

Run it with any Python 3.7+ that has torch (numpy is used when importable,
not needed):

    python repro.py [--json] [--dir D] [--width-env]

It rebuilds the arguments (dtype, shape, stride, storage offset), runs
torch.ops.aten.<op>.<overload> once in this process, under the environment
it was started in (set ATEN_CPU_CAPABILITY=avx2 etc. yourself, or pass
--width-env to re-run itself with the manifest's width_env added), and
compares the results with both builds' (bit for bit, else max |delta| and
max relative error). It also runs the call in float64 (floating tensor
arguments cast, the rest unchanged) and gives the RMS error against it of
this run's, the control's and the head's results.

--dir D: the archive's directory (default: this script's). --json: one JSON
object instead of the summary (matches: control, head, both or neither).
Exit status 0 when the call ran, whatever it matched; 2 when it could not be
rebuilt or run (the reason is printed).

A manifest with "unit": "module" holds a module call's inputs, not an op
call's: that call needs the model's code, so it is not run here (exit
status 2, saying so) but through capd's runner (its isolated replay jobs,
option target_inputs). Its arrays are .npy files as above (read_npy).
"""

import argparse
import ast
import json
import math
import os
import sys

import torch

try:
    import numpy
except Exception:  # optional
    numpy = None

# .npy descr -> torch dtype name; '<u2' holds bfloat16 bits when the
# manifest says bfloat16.
NPY = {"<f4": "float32", "<f8": "float64", "<f2": "float16", "<i8": "int64", "<i4": "int32",
       "<i2": "int16", "|i1": "int8", "|u1": "uint8", "|b1": "bool", "<u2": "uint16"}


class Fail(Exception):
    """The call cannot be rebuilt or run: exit 2."""


def dtype_of(name):
    dt = getattr(torch, str(name), None)
    if not isinstance(dt, torch.dtype):
        raise Fail("unknown dtype %r" % (name,))
    return dt


def read_npy(path, want):
    """The array of the .npy file PATH as a contiguous CPU tensor of dtype
    WANT (a name; bfloat16 from its '<u2' raw bits)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise Fail("cannot read %s: %s" % (path, e))
    if data[:6] != b"\x93NUMPY" or data[6:7] not in (b"\x01", b"\x02", b"\x03"):
        raise Fail("%s is not a .npy file" % path)
    if data[6:7] == b"\x01":
        hlen, start = int.from_bytes(data[8:10], "little"), 10
    else:
        hlen, start = int.from_bytes(data[8:12], "little"), 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin-1"))
    descr, shape = header["descr"], list(header["shape"])
    if header.get("fortran_order") or descr not in NPY:
        raise Fail("%s: unsupported layout (descr %r, fortran_order %r)"
                   % (path, descr, header.get("fortran_order")))
    stored = NPY[descr]
    if stored != want and not (stored == "uint16" and want == "bfloat16"):
        raise Fail("%s holds %s, the manifest says %s" % (path, stored, want))
    read_as = "int16" if stored == "uint16" else stored  # same bits, a dtype every torch has
    body = data[start + hlen:]
    if numpy is not None:
        arr = numpy.frombuffer(body, dtype=numpy.dtype(descr)).view(read_as).copy()
        t = torch.from_numpy(arr)
    elif body:
        t = torch.frombuffer(bytearray(body), dtype=dtype_of(read_as))
    else:
        t = torch.empty(0, dtype=dtype_of(read_as))
    if sys.byteorder != "little":
        raise Fail("this reproducer reads little-endian data on little-endian hosts only")
    t = t.reshape(shape)
    return t.view(torch.bfloat16) if want == "bfloat16" else t


def strided(values, shape, stride, offset):
    """VALUES (contiguous) as a tensor of SHAPE with STRIDE and storage
    OFFSET, over a zeroed storage (overlapping strides too)."""
    if stride is None:
        return values.reshape(shape).clone()
    if any(s == 0 for s in shape):
        size = offset
    else:
        size = offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))
    base = torch.zeros(max(size, 1), dtype=values.dtype)
    idx = torch.full(shape, offset, dtype=torch.int64)
    for d, (s, st) in enumerate(zip(shape, stride)):
        step = [1] * len(shape)
        step[d] = s
        idx = idx + (torch.arange(s, dtype=torch.int64) * st).reshape(step)
    base[idx.reshape(-1)] = values.reshape(-1)
    return base.as_strided(shape, stride, offset)


def build(x, tensors):
    """The Python value of a recorded argument tree (docs/runner.md)."""
    if isinstance(x, list):
        return [build(v, tensors) for v in x]
    if not isinstance(x, dict):
        return x
    if "arg" in x:
        return tensors[x["arg"]]
    if "unsupported" in x:
        raise Fail("an argument cannot be rebuilt: %s" % x["unsupported"])
    if "float" in x:
        return float(x["float"])
    if "dtype" in x:
        return dtype_of(x["dtype"])
    if "device" in x:
        return torch.device(x["device"])
    for kind, cls in (("layout", torch.layout), ("memory_format", torch.memory_format)):
        if kind in x:
            v = getattr(torch, x[kind], None)
            if not isinstance(v, cls):
                raise Fail("unknown %s %r" % (kind, x[kind]))
            return v
    raise Fail("unknown argument %r" % (x,))


def resolve(call):
    ns, _, name = call["name"].partition("::")
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), call.get("overload") or "default")
    except (AttributeError, RuntimeError) as e:
        raise Fail("torch %s has no op %s.%s: %s" % (torch.__version__, call["name"],
                                                     call.get("overload"), e))


def computed(op, out):
    """The op's results as capd numbers them: depth first, a result the
    schema says is a read-only alias (a view) left out."""
    def flat(x, acc):
        if isinstance(x, torch.Tensor):
            acc.append(x)
        elif isinstance(x, (list, tuple)):
            for v in x:
                flat(v, acc)
        return acc
    rets = getattr(getattr(op, "_schema", None), "returns", None) or []
    kinds = [a.alias_info is None or bool(a.alias_info.is_write) for a in rets]
    if len(kinds) <= 1:
        return flat(out, []) if kinds[0:1] != [False] else []
    acc = []
    for keep, item in zip(kinds, out if isinstance(out, (tuple, list)) else (out,)):
        if keep:
            flat(item, acc)
    return acc


def layouts(m):
    """M (the manifest) with each of its ``args`` given the stride and
    storage offset of its tensor in ``op_call`` where the entry names none
    (capd's archives keep them there only); returns M."""
    found = {}

    def walk(x):
        if isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, dict) and "arg" in x:
            found.setdefault(x["arg"], x)

    call = m.get("op_call") or {}
    walk(call.get("args"))
    for v in (call.get("kwargs") or {}).values():
        walk(v)
    for a in m.get("args") or []:
        leaf = found.get(a.get("index")) or {}
        for k in ("stride", "storage_offset"):
            if k not in a and k in leaf:
                a[k] = leaf[k]
    return m


def run(m, arrays, op, f64):
    """The call's results, arguments made from ARRAYS (float64 when F64)."""
    tensors = []
    for a in m["args"]:
        v = arrays[a["index"]]
        if f64 and v.is_floating_point():
            v = v.double()
        tensors.append(strided(v, a["shape"], a.get("stride"), a.get("storage_offset") or 0))
    by_index = dict((a["index"], t) for a, t in zip(m["args"], tensors))
    call = m["op_call"]
    args = build(call.get("args", []), by_index)
    kwargs = dict((k, build(v, by_index)) for k, v in (call.get("kwargs") or {}).items())
    return computed(op, op(*args, **kwargs))


def same_bits(a, b):
    if a.dtype != b.dtype or list(a.shape) != list(b.shape):
        return False
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def delta(a, b):
    """(max |a - b|, max relative error against b), NaN = NaN, in float64."""
    if list(a.shape) != list(b.shape):
        return float("inf"), float("inf")
    x, y = a.double().reshape(-1), b.double().reshape(-1)
    if x.numel() == 0:
        return 0.0, 0.0
    d = (x - y).abs()
    d = torch.where((x == y) | (torch.isnan(x) & torch.isnan(y)), torch.zeros_like(d), d)
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    rel = torch.where(d == 0, torch.zeros_like(d), d / y.abs())
    return d.max().item(), rel.max().item()


def rms(outs, ref):
    if ref is None or outs is None or len(outs) != len(ref):
        return None
    num, n = 0.0, 0
    for a, r in zip(outs, ref):
        if list(a.shape) != list(r.shape):
            return None
        num += ((a.double() - r.double()) ** 2).sum().item()
        n += a.numel()
    return math.sqrt(num / n) if n else 0.0


def capability():
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:
        for line in torch.__config__.show().splitlines():
            if "CPU capability usage:" in line:
                return line.split(":", 1)[1].strip()
    return None


def jnum(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def module_unit(m):
    """Fail for a manifest that is not an op call's (module doc)."""
    unit = m.get("unit") if isinstance(m, dict) else None
    unit = "op" if unit is None else unit
    if unit == "module":
        raise Fail("this archive replays a call of module %s (call %s), not an op call: a "
                   "module replay needs the model's code and runs through capd's runner "
                   "(isolated replay jobs, option target_inputs), not this script; its "
                   "recorded inputs are the inputs/arg.<i>.npy files"
                   % (m.get("module"), m.get("call")))
    if unit != "op":
        raise Fail("manifest unit %r, this script runs op calls (unit op)" % (unit,))


def main(argv):
    p = argparse.ArgumentParser(description="Run one recorded op call again (capd).")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--width-env", action="store_true",
                   help="run again with the manifest's width_env in the environment")
    o = p.parse_args(argv)
    with open(os.path.join(o.dir, "manifest.json")) as f:
        m = json.load(f)
    module_unit(m)
    if o.width_env:
        env = dict(os.environ)
        env.update(dict((k, str(v)) for k, v in (m.get("width_env") or {}).items()))
        rest = [a for a in argv if a != "--width-env"]
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + rest, env)
    if m.get("format") != 1:
        raise Fail("manifest format %r, this script reads format 1" % (m.get("format"),))
    layouts(m)
    arrays = dict((a["index"], read_npy(os.path.join(o.dir, a["file"]), a["dtype"]))
                  for a in m["args"])
    exp = {}
    for side in ("control", "head"):
        rows = (m.get("expected") or {}).get(side) or []
        exp[side] = [(r, read_npy(os.path.join(o.dir, r["file"]), r["dtype"])) for r in rows]
    op = resolve(m["op_call"])
    try:
        outs = run(m, arrays, op, False)
    except (RuntimeError, TypeError, IndexError) as e:
        raise Fail("running %s failed: %s: %s" % (m["op_call"]["name"], type(e).__name__, e))
    f64_error, f64 = None, None
    try:
        f64 = run(m, arrays, op, True)
    except Exception as e:
        f64_error = "float64 evaluation not possible: %s: %s" % (type(e).__name__, e)
    res = {"key": m.get("key"), "op": m["op_call"]["name"], "torch": torch.__version__,
           "capability": capability(),
           "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"), "outputs": []}
    mine_by_side, err = {}, {}
    for side in ("control", "head"):
        ident, worst, worst_rel, mine, theirs = bool(exp[side]), None, None, [], []
        for r, want in exp[side]:
            i = r["index"]
            if i >= len(outs):
                raise Fail("the op gave %d results, %s recorded one at %d" % (len(outs), side, i))
            got = outs[i]
            mine.append(got)
            theirs.append(want)
            ident = ident and same_bits(got, want)
            d, rel = delta(got, want)
            worst = d if worst is None else max(worst, d)
            worst_rel = rel if worst_rel is None else max(worst_rel, rel)
        res["identical_to_" + side] = ident
        res["max_abs_to_" + side] = jnum(worst)
        res["max_rel_to_" + side] = jnum(worst_rel)
        ref = [f64[r["index"]] for r, _ in exp[side]] if f64 is not None else None
        err[side] = jnum(rms(theirs, ref))
        mine_by_side[side] = (mine, ref)
        res["outputs"] += [{"side": side, "index": r["index"], "role": r.get("role"),
                            "dtype": r["dtype"], "shape": r["shape"],
                            "identical": same_bits(g, w), "max_abs": jnum(delta(g, w)[0])}
                           for (r, w), g in zip(exp[side], mine)]
    side = "control" if exp["control"] else "head"
    err["this"] = jnum(rms(*mine_by_side[side]))
    res["err_f64"] = {"this": err["this"], "control": err["control"], "head": err["head"]}
    if f64_error:
        res["f64_error"] = f64_error
    c, h = res["identical_to_control"], res["identical_to_head"]
    res["matches"] = "both" if c and h else "control" if c else "head" if h else "neither"
    res["builds"] = m.get("builds") or {}
    if o.json:
        print(json.dumps(res, sort_keys=True))
        return 0
    print("%s (%s)" % (res["key"], res["op"]))
    for s in ("control", "head"):
        print("  %s build: %s" % (s, json.dumps(res["builds"].get(s), sort_keys=True)))
    if res["matches"] in ("control", "head"):
        print("this run matches the %s bit for bit" % res["matches"])
    elif res["matches"] == "both":
        print("this run matches the control and the head bit for bit (they agree)")
    else:
        print("this run matches neither: max |delta| to control %s, to head %s"
              % (res["max_abs_to_control"], res["max_abs_to_head"]))
    print("RMS error against float64: this run %s, control %s, head %s"
          % (err["this"], err["control"], err["head"]) if not f64_error else f64_error)
    print("torch %s, capability %s (ATEN_CPU_CAPABILITY=%s)"
          % (res["torch"], res["capability"], res["aten_cpu_capability"] or "<unset>"))
    return 0


if __name__ == "__main__":
    as_json = "--json" in sys.argv[1:]
    try:
        sys.exit(main(sys.argv[1:]))
    except (Fail, OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        why = str(e) if isinstance(e, Fail) else "%s: %s" % (type(e).__name__, e)
        if as_json:
            print(json.dumps({"error": why}))
        else:
            print("cannot reproduce: %s" % why, file=sys.stderr)
        sys.exit(2)
