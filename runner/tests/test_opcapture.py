"""Per-op capture (granularity op) in real runner processes: op records
inside module calls, views and in-place ops, exact hashes of integer
results, the backward pass, and the refusal where torch has no
TorchDispatchMode."""

import os
import struct
import unittest

from tests import util
from tests.framereader import RUNNER_DIR

OP_MODELS = {
    "opm/__init__.py": "",
    "opm/models.py": util.LIN_MODEL + '''
import torch.nn.functional as F

class Ops(Lin):
    """A gelu, a view, a transpose, an in-place add and an integer result."""
    def forward(self, x):
        y = F.gelu(self.lin(x))
        z = y.view(-1).view(y.shape).t()
        z.add_(1.0)
        idx = torch.argmax(z, dim=0)
        return z * 2.0, idx

def ops(seed, batch, dtype):
    g = torch.Generator().manual_seed(seed)
    return Ops(), torch.randn(batch, 6, generator=g).to(dtype)

def nan_at_log(seed, batch, dtype):
    x = torch.tensor([[1.0, -1.0, 2.0]], dtype=dtype)
    return Logs(), x

class Logs(torch.nn.Module):
    def forward(self, x):
        return torch.log(x).exp() + 1.0
''',
    # A torch without the dispatch mode class (torch < 1.13 has none).
    "nomode/sitecustomize.py": '''
import torch.utils._python_dispatch as d
del d.TorchDispatchMode
''',
}


def _op_keys(result):
    return [t["key"] for t in result.tensors if "op" in t.header]


class OpCaptureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = util.model_tree(OP_MODELS)
        roots = [cls.root]
        common = dict(iterations=1, warmup=0)
        cls.names = ["mlp_module", "mlp_op", "ops", "ops_bwd", "nomode", "nan"]
        jobs = [
            (util.make_spec("mlp", **common), {}),
            (util.make_spec("mlp", granularity="op", **common), {}),
            (util.make_spec("opm.models:ops", model_roots=roots, granularity="op",
                            capture="full", **common), {}),
            (util.make_spec("opm.models:ops", model_roots=roots, granularity="op",
                            pass_="backward", **common), {}),
            (util.make_spec("mlp", granularity="op", **common),
             {"env": {"PYTHONPATH": "%s:%s" % (os.path.join(cls.root, "nomode"),
                                                RUNNER_DIR)}}),
            (util.make_spec("opm.models:nan_at_log", model_roots=roots, granularity="op",
                            **common), {}),
        ]
        cls.res = dict(zip(cls.names, util.run_many(jobs)))

    def ok(self, name):
        r = self.res[name]
        self.assertEqual(r.status, "ok", r.describe())
        return r

    def test_module_records_unchanged(self):
        # Op records are added; the module-level records stay as they were.
        mod = dict((t["key"], t["hash"]) for t in self.ok("mlp_module").tensors)
        op = self.ok("mlp_op")
        plain = dict((t["key"], t["hash"]) for t in op.tensors if "op" not in t.header)
        self.assertEqual(plain, mod)
        self.assertEqual(_op_keys(self.ok("mlp_module")), [])

    def test_mlp_ops_in_execution_order(self):
        keys = _op_keys(self.ok("mlp_op"))
        self.assertEqual(keys, ["fc1.0.forward/op.aten::addmm.0.output.0",
                                "act.0.forward/op.aten::relu.0.output.0",
                                "fc2.0.forward/op.aten::addmm.0.output.0",
                                "act.1.forward/op.aten::relu.0.output.0",
                                "fc3.0.forward/op.aten::addmm.0.output.0"])
        r = self.ok("mlp_op")
        by_key = dict((t["key"], t) for t in r.tensors)
        # An op's result is the module's output when it is the last op.
        self.assertEqual(by_key["fc1.0.forward/op.aten::addmm.0.output.0"]["hash"],
                         by_key["fc1.0.forward.output.0"]["hash"])
        self.assertEqual(by_key["act.0.forward/op.aten::relu.0.output.0"]["op"], "aten::relu")
        self.assertEqual(r.one("nondeterministic")["keys"], [])

    def test_views_skipped_inplace_once(self):
        r = self.ok("ops")
        ops = [t["op"] for t in r.tensors if "op" in t.header]
        self.assertNotIn("aten::view", ops)
        self.assertNotIn("aten::t", ops)
        self.assertEqual(ops.count("aten::add_"), 1)
        self.assertIn("aten::gelu", ops)
        # gelu comes after the linear's addmm and before the in-place add
        self.assertLess(ops.index("aten::addmm"), ops.index("aten::gelu"))
        self.assertLess(ops.index("aten::gelu"), ops.index("aten::add_"))
        self.assertEqual(len(set(_op_keys(r))), len(_op_keys(r)))

    def test_integer_result_hashed_exactly(self):
        r = self.ok("ops")
        am = [t for t in r.tensors if t.get("op") == "aten::argmax"]
        self.assertEqual(len(am), 1)
        t = am[0]
        self.assertEqual(t["dtype"], "int64")
        self.assertEqual(t["capture"], "full")
        self.assertEqual(t["hash"], util.record_hash(t, t.payload))
        vals = struct.unpack("<%dq" % t["numel"], t.payload)
        self.assertTrue(all(0 <= v < 4 for v in vals), vals)  # rows of z = y.t(): batch 2

    def test_backward_ops(self):
        r = self.ok("ops_bwd")
        bwd = [t for t in r.tensors if "op" in t.header and t["phase"] == "backward"]
        self.assertTrue(bwd, r.describe())
        self.assertTrue(all(t["role"] == "grad_input" for t in bwd))
        self.assertIn("aten::gelu_backward", [t["op"] for t in bwd])
        self.assertEqual(r.one("nondeterministic")["keys"], [])

    def test_refused_without_dispatch_mode(self):
        r = self.res["nomode"]
        self.assertEqual(r.status, "failed", r.describe())
        self.assertIn("TorchDispatchMode", r.end["reason"])
        self.assertEqual(r.tensors, [])

    def test_nonfinite_op_recorded(self):
        r = self.ok("nan")
        log = [t for t in r.tensors if t.get("op") == "aten::log"]
        self.assertEqual(len(log), 1)
        self.assertEqual(log[0]["stats"]["nan"], 1)
        inputs = [t for t in r.tensors if t["key"] == "model.0.forward.input.0"]
        self.assertEqual(inputs[0]["stats"]["nan"], 0)


if __name__ == "__main__":
    unittest.main()
