"""Reproducer folders (runner/repro/repro.py's layout) made from the target
records (option target_op) of real runner processes: test_target.py runs
repro.py on them, test_opreplay.py replays the op on their inputs (option
target_inputs)."""

import json
import os
import struct

from tests import util

NPY_DESCR = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<u2",
             "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "|i1", "uint8": "|u1",
             "bool": "|b1"}


def write_npy(path, dtype, shape, payload):
    """A .npy 1.0 file of a record's raw little-endian C-contiguous bytes."""
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        NPY_DESCR[dtype], "".join("%d," % d for d in shape))
    pad = 64 - (10 + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode("latin-1")
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload)


def targets(result, target):
    return [t for t in result.tensors if t["key"].startswith(target + ".")]


def leaves(tree):
    """The tensor descriptions ({"arg": i, ...}) of an op_call argument tree."""
    if isinstance(tree, list):
        for v in tree:
            for x in leaves(v):
                yield x
    elif isinstance(tree, dict):
        if "arg" in tree:
            yield tree
        else:
            for v in tree.values():
                for x in leaves(v):
                    yield x


def make_archive(control, head, target, layouts=True):
    """A reproducer directory from the target records of two runs. LAYOUTS:
    each ``args`` entry names its stride and storage offset (as
    docs/runner.md describes the manifest); False: it does not, they are in
    ``op_call`` only, and the entry has capd's ``role`` and ``key`` instead
    (what api/repro_archive.c writes)."""
    d = util.tempdir()
    os.makedirs(os.path.join(d, "inputs"))
    os.makedirs(os.path.join(d, "expected"))
    recs = targets(control, target)
    args = []
    op_call = None
    for t in recs:
        if t["role"] != "arg":
            continue
        op_call = t["op_call"]
        rel = "inputs/arg.%d.npy" % t["index"]
        write_npy(os.path.join(d, rel), t["dtype"], t["shape"], t.payload)
        entry = {"index": t["index"], "file": rel, "dtype": t["dtype"], "shape": t["shape"]}
        if layouts:
            leaf = [a for a in leaves(op_call) if a["arg"] == t["index"]][0]
            entry.update({"stride": leaf["stride"], "storage_offset": leaf["storage_offset"]})
        else:
            entry.update({"role": "arg", "key": t["key"]})
        args.append(entry)
    expected = {}
    for side, res in (("control", control), ("head", head)):
        expected[side] = []
        for t in targets(res, target):
            if t["role"] == "arg":
                continue
            rel = "expected/%s.%s.%d.npy" % (side, t["role"], t["index"])
            write_npy(os.path.join(d, rel), t["dtype"], t["shape"], t.payload)
            expected[side].append({"index": t["index"], "role": t["role"], "file": rel,
                                   "dtype": t["dtype"], "shape": t["shape"]})
    manifest = {"format": 1, "op_call": op_call, "key": target,
                "cell": {"model": "tgt.models:lgl", "width": "native", "pass": "forward",
                         "dtype": "float32", "seed": 0},
                "args": args, "expected": expected, "width_env": {},
                "builds": {"control": {"name": "plain"}, "head": {"name": "perturbed-gelu"}}}
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return d
