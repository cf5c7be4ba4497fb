"""Targeted capture (option target_op, granularity op) in real runner
processes: the target call's arguments as role arg, whole payloads whatever
the capture level, the op_call header field, the notes (a target that never
ran, one that is not strided, payload limits), and runner/repro/repro.py
run on an archive made here from two runs' records (a plain control, a head
with a perturbed GELU kernel)."""

import json
import os
import subprocess
import unittest

from tests import util
from tests.framereader import RUNNER_DIR
from tests.reproarchive import make_archive, targets

PERTURBED = os.path.join(os.path.dirname(RUNNER_DIR), "examples", "perturbed-gelu")
REPRO = os.path.join(RUNNER_DIR, "repro", "repro.py")

MODELS = {
    "tgt/__init__.py": "",
    "tgt/models.py": util.LIN_MODEL + '''
class LGL(torch.nn.Module):
    def __init__(self):
        super(LGL, self).__init__()
        self.lin1 = torch.nn.Linear(6, 8)
        self.act = torch.nn.GELU()
        self.lin2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.lin2(self.act(self.lin1(x)))

def seeded(cls, seed, batch, dtype):
    """A CLS seeded with SEED, and its input: BATCH rows of 6 from SEED."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    return cls(), torch.randn(batch, 6, generator=g).to(dtype)

def lgl(seed, batch, dtype):
    return seeded(LGL, seed, batch, dtype)

class InPlace(Lin):
    """y += 2 * x[:, 1:5], in place: a strided argument with an offset."""
    def forward(self, x):
        y = self.lin(x)
        y.add_(x[:, 1:5], alpha=2.0)
        return y * 3.0

def inplace(seed, batch, dtype):
    return seeded(InPlace, seed, batch, dtype)

class Sparse(Lin):
    def forward(self, x):
        return self.lin(x).to_sparse().to_dense() * 2.0

def sparse(seed, batch, dtype):
    torch.manual_seed(seed)
    return Sparse(), torch.randn(batch, 6).to(dtype)
''',
    # numpy cannot be imported (repro.py's own .npy reader)
    "nonumpy/sitecustomize.py": "import sys\nsys.modules['numpy'] = None\n",
}

GELU = "act.0.forward/op.aten::gelu.0"
ADD = "model.0.forward/op.aten::add_.0"
GELU_BWD = "act.0.backward/op.aten::gelu_backward.0"


def perturbed_env():
    # The width the tests run at is "native": the perturbed build's GELU is
    # wrong there.
    return {"PYTHONPATH": "%s:%s" % (PERTURBED, RUNNER_DIR), "CAPD_WIDTH": "native",
            "CAPD_PERTURB_WIDTH": "native"}


def by_key(result):
    return dict((t["key"], t) for t in result.tensors)


def repro(d, env=None, args=("--json",)):
    e = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    e.update(env or {})
    p = subprocess.run([util.PYTHON, REPRO, "--dir", d] + list(args), env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


class TargetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = util.model_tree(MODELS)
        roots = [cls.root]
        common = dict(iterations=1, warmup=0, granularity="op", model_roots=roots)
        jobs = {
            "plain": (util.make_spec("tgt.models:lgl", **common), {}),
            "gelu": (util.make_spec("tgt.models:lgl", target_op=GELU, **common), {}),
            "gelu_head": (util.make_spec("tgt.models:lgl", target_op=GELU, **common),
                          {"env": perturbed_env()}),
            "gelu_bf16": (util.make_spec("tgt.models:lgl", target_op=GELU, dtype="bfloat16",
                                         **common), {}),
            "gelu_sample": (util.make_spec("tgt.models:lgl", target_op=GELU, capture="sample",
                                           sample_size=3, **common), {}),
            "gelu_full": (util.make_spec("tgt.models:lgl", target_op=GELU, capture="full",
                                         **common), {}),
            "add": (util.make_spec("tgt.models:inplace", target_op=ADD, **common), {}),
            "add_plain": (util.make_spec("tgt.models:inplace", capture="full", **common), {}),
            "bwd": (util.make_spec("tgt.models:lgl", target_op=GELU_BWD, pass_="backward",
                                   **common), {}),
            "never": (util.make_spec("tgt.models:lgl", target_op="act.0.forward/op.aten::gelu.3",
                                     **common), {}),
            "sparse": (util.make_spec("tgt.models:sparse",
                                      target_op="model.0.forward/op.aten::_to_dense.0", **common),
                       {}),
            "tight": (util.make_spec("tgt.models:lgl", target_op=GELU, max_payload_bytes=100,
                                     **common), {}),
        }
        names = sorted(jobs)
        cls.res = dict(zip(names, util.run_many([jobs[n] for n in names])))

    def ok(self, name):
        r = self.res[name]
        self.assertEqual(r.status, "ok", r.describe())
        self.assertEqual(r.one("nondeterministic")["keys"], [], name)
        return r

    def test_arg_and_output_records(self):
        r = self.ok("gelu")
        recs = targets(r, GELU)
        self.assertEqual([t["key"] for t in recs], [GELU + ".arg.0", GELU + ".output.0"])
        keys = [t["key"] for t in r.tensors]
        # the args come before the op's results, after the module's input
        self.assertLess(keys.index("act.0.forward.input.0"), keys.index(GELU + ".arg.0"))
        mine = by_key(r)
        for t in recs:
            self.assertEqual(t["capture"], "full")  # whatever the cell's (stats)
            self.assertEqual(t["op"], "aten::gelu")
            self.assertEqual(t["op_index"], 0)
            self.assertEqual(len(t.payload), t["numel"] * 4)
            self.assertEqual(t["hash"], util.record_hash(t, t.payload))
        arg = mine[GELU + ".arg.0"]
        self.assertEqual(arg["role"], "arg")
        # what the op received is lin1's output (recorded, maybe by the
        # native pipe: its own hash algorithm)
        lin1 = mine["lin1.0.forward.output.0"]
        self.assertEqual(lin1["capture"], "stats")
        self.assertEqual(lin1["hash"], util.content_hash(lin1["hash_alg"], arg.payload))
        out = mine[GELU + ".output.0"]
        act = mine["act.0.forward.output.0"]
        self.assertEqual(act["hash"], util.content_hash(act["hash_alg"], out.payload))

    def test_op_call(self):
        arg = by_key(self.ok("gelu"))[GELU + ".arg.0"]
        call = arg["op_call"]
        self.assertEqual(call, {"name": "aten::gelu", "overload": "default", "kwargs": {},
                                "args": [{"arg": 0, "dtype": "float32", "shape": [2, 8],
                                          "stride": [8, 1], "storage_offset": 0}]})
        self.assertEqual(by_key(self.ok("gelu"))[GELU + ".output.0"]["op_call"], call)

    def test_other_records_unchanged(self):
        plain = by_key(self.ok("plain"))
        mine = by_key(self.ok("gelu"))
        self.assertEqual(sorted(k for k in mine if ".arg." not in k), sorted(plain))
        for k, t in plain.items():
            if not k.startswith(GELU + "."):
                self.assertEqual(mine[k]["hash"], t["hash"], k)
                self.assertNotIn("op_call", mine[k].header)

    def test_capture_levels(self):
        for name in ("gelu_sample", "gelu_full"):
            r = self.ok(name)
            recs = targets(r, GELU)
            self.assertEqual(len(recs), 2, name)
            for t in recs:
                self.assertEqual(t["capture"], "full", name)
                self.assertEqual(len(t.payload), t["numel"] * 4, name)
            lin1 = by_key(r)["lin1.0.forward.output.0"]
            self.assertEqual(lin1["capture"], name[5:])
            self.assertEqual(lin1["hash"], util.content_hash(lin1["hash_alg"],
                                                             by_key(r)[GELU + ".arg.0"].payload))

    def test_bfloat16(self):
        r = self.ok("gelu_bf16")
        arg = by_key(r)[GELU + ".arg.0"]
        self.assertEqual(arg["dtype"], "bfloat16")
        self.assertEqual(len(arg.payload), arg["numel"] * 2)
        self.assertEqual(arg["op_call"]["args"][0]["dtype"], "bfloat16")

    def test_inplace_arg_recorded_before(self):
        r = self.ok("add")
        mine = by_key(r)
        self.assertEqual([t["key"] for t in targets(r, ADD)],
                         [ADD + ".arg.0", ADD + ".arg.1", ADD + ".output.0"])
        call = mine[ADD + ".arg.0"]["op_call"]
        self.assertEqual(call["name"], "aten::add_")
        self.assertEqual(call["overload"], "Tensor")
        self.assertEqual(call["kwargs"], {"alpha": 2.0})
        self.assertEqual(call["args"][0], {"arg": 0, "dtype": "float32", "shape": [2, 4],
                                           "stride": [4, 1], "storage_offset": 0})
        self.assertEqual(call["args"][1], {"arg": 1, "dtype": "float32", "shape": [2, 4],
                                           "stride": [6, 1], "storage_offset": 1})
        a0 = util.floats(mine[ADD + ".arg.0"].payload, "float32")
        a1 = util.floats(mine[ADD + ".arg.1"].payload, "float32")
        out = util.floats(mine[ADD + ".output.0"].payload, "float32")
        lin = mine["lin.0.forward.output.0"]
        self.assertEqual(lin["hash"], util.content_hash(lin["hash_alg"],
                                                        mine[ADD + ".arg.0"].payload))
        for a, b, o in zip(a0, a1, out):
            self.assertAlmostEqual(a + 2.0 * b, o, places=5)
        self.assertNotEqual(a0, out)  # the mutated tensor is the output, not the arg

    def test_inplace_result_is_after_the_op(self):
        # Not targeted: the in-place op's result record holds the tensor
        # after the op, not the cached value of the same tensor before it
        # (torch bumps its version only once the op has returned).
        mine = by_key(self.ok("add_plain"))
        lin = util.floats(mine["lin.0.forward.output.0"].payload, "float32")
        out = util.floats(mine[ADD + ".output.0"].payload, "float32")
        self.assertNotEqual(lin, out)
        mul = util.floats(mine["model.0.forward/op.aten::mul.0.output.0"].payload, "float32")
        for o, m in zip(out, mul):
            self.assertAlmostEqual(3.0 * o, m, places=4)

    def test_backward_target(self):
        r = self.ok("bwd")
        recs = targets(r, GELU_BWD)
        self.assertEqual([t["role"] for t in recs], ["arg", "arg", "grad_input"])
        call = recs[0]["op_call"]
        self.assertEqual(call["name"], "aten::gelu_backward")
        self.assertEqual(len(call["args"]), 2)
        mine = by_key(r)
        # gelu_backward(grad_output, self): self is gelu's input, lin1's output
        lin1 = mine["lin1.0.forward.output.0"]
        self.assertEqual(lin1["hash"], util.content_hash(lin1["hash_alg"], recs[1].payload))
        self.assertTrue(all(t["capture"] == "full" for t in recs))

    def test_never_ran(self):
        r = self.ok("never")
        self.assertIn("target_op act.0.forward/op.aten::gelu.3 never ran in this cell",
                      r.notes("warn"))
        self.assertFalse([t for t in r.tensors if "op_call" in t.header])

    def test_not_strided(self):
        r = self.ok("sparse")
        self.assertTrue([m for m in r.notes("warn") if "model.0.forward/op.aten::_to_dense.0"
                         in m and "not strided" in m], r.notes())
        self.assertFalse([t for t in r.tensors if t["role"] == "arg" or "op_call" in t.header])
        self.assertFalse([m for m in r.notes("warn") if "never ran" in m])

    def test_payload_limit(self):
        r = self.ok("tight")  # 100 bytes: the 64-byte arg fits, the output does not
        mine = by_key(r)
        self.assertEqual(mine[GELU + ".arg.0"]["capture"], "full")
        self.assertNotEqual(mine[GELU + ".output.0"]["capture"], "full")
        self.assertTrue([m for m in r.notes("warn") if "target_op: " + GELU in m], r.notes())
        self.assertLessEqual(sum(len(t.payload) for t in r.tensors), 100)

    # -- repro.py ------------------------------------------------------------
    def archive(self):
        return make_archive(self.ok("gelu"), self.ok("gelu_head"), GELU)

    def test_head_differs(self):
        c = by_key(self.ok("gelu"))
        h = by_key(self.ok("gelu_head"))
        self.assertEqual(c[GELU + ".arg.0"].payload, h[GELU + ".arg.0"].payload)
        self.assertNotEqual(c[GELU + ".output.0"].payload, h[GELU + ".output.0"].payload)

    def check_errors(self, out, plain=True):
        err = out["err_f64"]
        for side in ("this", "control", "head"):
            self.assertIsInstance(err[side], float, err)
            self.assertTrue(0.0 <= err[side] < 1e-2, err)
        if plain:  # (the perturbed build's float64 GELU is perturbed too)
            self.assertLess(err["control"], err["head"])  # the perturbation is an error

    def test_repro_matches_control(self):
        d = self.archive()
        for env in ({}, {"PYTHONPATH": os.path.join(self.root, "nonumpy")}):
            rc, out, err = repro(d, env)
            self.assertEqual(rc, 0, out + err)
            out = json.loads(out)
            self.assertEqual(out["matches"], "control", out)
            self.assertTrue(out["identical_to_control"])
            self.assertFalse(out["identical_to_head"])
            self.assertEqual(out["max_abs_to_control"], 0.0)
            self.assertGreater(out["max_abs_to_head"], 0.0)
            self.check_errors(out)
            self.assertEqual(out["err_f64"]["this"], out["err_f64"]["control"])
            self.assertIn("torch", out)
            self.assertIn("capability", out)

    def test_repro_matches_head(self):
        env = perturbed_env()
        env["PYTHONPATH"] = PERTURBED
        rc, out, err = repro(self.archive(), env)
        self.assertEqual(rc, 0, out + err)
        out = json.loads(out)
        self.assertEqual(out["matches"], "head", out)
        self.check_errors(out, plain=False)
        self.assertEqual(out["err_f64"]["this"], out["err_f64"]["head"])

    def test_repro_summary(self):
        rc, out, err = repro(self.archive(), args=())
        self.assertEqual(rc, 0, out + err)
        self.assertIn("matches the control bit for bit", out)
        self.assertIn("RMS error against float64", out)

    def test_repro_inplace_strided(self):
        # the in-place add_: its second argument a strided view with an offset
        # (capd's manifests name the strides in op_call only: layouts False)
        r = self.ok("add")
        for layouts in (True, False):
            d = make_archive(r, r, ADD, layouts=layouts)
            rc, out, err = repro(d)
            self.assertEqual(rc, 0, out + err)
            self.assertEqual(json.loads(out)["matches"], "both", out)

    def test_repro_bfloat16(self):
        r = self.ok("gelu_bf16")
        d = make_archive(r, r, GELU)
        for env in ({}, {"PYTHONPATH": os.path.join(self.root, "nonumpy")}):
            rc, out, err = repro(d, env)
            self.assertEqual(rc, 0, out + err)
            self.assertEqual(json.loads(out)["matches"], "both", out)

    def test_repro_cannot_rebuild(self):
        d = self.archive()
        path = os.path.join(d, "manifest.json")
        with open(path) as f:
            m = json.load(f)
        m["op_call"]["kwargs"]["generator"] = {"unsupported": "<torch._C.Generator object>"}
        with open(path, "w") as f:
            json.dump(m, f)
        rc, out, err = repro(d)
        self.assertEqual(rc, 2, out + err)
        self.assertIn("cannot be rebuilt", json.loads(out)["error"])


if __name__ == "__main__":
    unittest.main()
