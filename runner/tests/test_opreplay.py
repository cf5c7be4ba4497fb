"""Op replay on recorded inputs (option target_inputs; capd_runner/opreplay.py)
in real runner processes: a targeted capture of a small model (test_target.py's)
gives a reproducer folder as capd writes it (strides in op_call only), then
cells replay its op call instead of building their model: the arguments and
results bit for bit as the control recorded them, under module "model", one
op call, the float64 reference of the same call; a strided argument with a
storage offset; and the failures (an op this torch lacks, pass backward, no
manifest) with their reasons. A manifest saying "unit": "op" is the same
replay; one of unit module is test_modreplay.py's."""

import math
import os
import struct
import unittest

from tests import util
from tests.reproarchive import make_archive
from tests.test_target import ADD, GELU, MODELS

REPLAY_GELU = "model.0.forward/op.aten::gelu.0"
REPLAY_ADD = "model.0.forward/op.aten::add_.0"
REF = "ref.float64/"


def by_key(result):
    return dict((t["key"], t) for t in result.tensors)


def replay_spec(d, target, root, pass_="forward", **options):
    opts = dict(target_inputs=d, target_op=target, granularity="op", capture="full",
                iterations=0, warmup=0, reference="float64", model_roots=[root])
    opts.update(options)
    # the model named is the control's: the cell must not build it
    return util.make_spec("tgt.models:lgl", pass_=pass_, **opts)




class OpReplayTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = util.model_tree(MODELS)
        common = dict(iterations=1, warmup=0, granularity="op", model_roots=[cls.root])
        cls.gelu, cls.add = util.run_many([
            (util.make_spec("tgt.models:lgl", target_op=GELU, **common), {}),
            (util.make_spec("tgt.models:inplace", target_op=ADD, **common), {})])
        for r in (cls.gelu, cls.add):
            assert r.status == "ok", r.describe()
        cls.gelu_dir = make_archive(cls.gelu, cls.gelu, GELU, layouts=False)
        cls.add_dir = make_archive(cls.add, cls.add, ADD, layouts=False)
        # an op this torch does not have
        cls.noop_dir = util.copy_archive(
            cls.gelu_dir, lambda m: m["op_call"].update(name="aten::capd_no_such_op"))
        # a manifest that names its unit, op
        cls.unit_dir = util.copy_archive(cls.gelu_dir, unit="op")
        root = cls.root
        jobs = {
            "gelu": replay_spec(cls.gelu_dir, REPLAY_GELU, root),
            "gelu_unit_op": replay_spec(cls.unit_dir, REPLAY_GELU, root),
            "gelu_bf16": replay_spec(cls.gelu_dir, REPLAY_GELU, root, dtype="bfloat16"),
            "gelu_f64": replay_spec(cls.gelu_dir, REPLAY_GELU, root, dtype="float64"),
            "add": replay_spec(cls.add_dir, REPLAY_ADD, root, capture="stats", warmup=1),
            "noop": replay_spec(cls.noop_dir, "model.0.forward/op.aten::capd_no_such_op.0",
                                root),
            "bwd": replay_spec(cls.gelu_dir, REPLAY_GELU, root, pass_="backward"),
            "missing": replay_spec(os.path.join(cls.gelu_dir, "nowhere"), REPLAY_GELU, root),
        }
        names = sorted(jobs)
        cls.res = dict(zip(names, util.run_many([(jobs[n], {}) for n in names])))

    def ok(self, name):
        r = self.res[name]
        self.assertEqual(r.status, "ok", r.describe())
        self.assertEqual(r.one("nondeterministic")["keys"], [], name)
        return r

    def failed(self, name):
        r = self.res[name]
        self.assertEqual(r.status, "failed", r.describe())
        self.assertEqual(r.tensors, [], name)
        return r.end["reason"]

    def test_gelu_replayed(self):
        r = self.ok("gelu")
        mine = by_key(r)
        ctl = by_key(self.gelu)
        # the op model's records only: module "model", one op call
        self.assertEqual([t["key"] for t in r.tensors if not t["key"].startswith(REF)],
                         ["model.0.forward.input.0", REPLAY_GELU + ".arg.0",
                          REPLAY_GELU + ".output.0", "model.0.forward.output.0"])
        for role in ("arg", "output"):
            t, c = mine[REPLAY_GELU + "." + role + ".0"], ctl[GELU + "." + role + ".0"]
            self.assertEqual(t["dtype"], "float32")
            self.assertEqual(t["capture"], "full")
            self.assertEqual(t.payload, c.payload, role)  # bit for bit, the same build
            self.assertEqual(t["op_call"], c["op_call"])
        self.assertEqual(mine["model.0.forward.input.0"].payload,
                         ctl[GELU + ".arg.0"].payload)

    def test_unit_op(self):
        mine = [(t.header, t.payload) for t in self.ok("gelu_unit_op").tensors]
        self.assertEqual(mine, [(t.header, t.payload) for t in self.ok("gelu").tensors])

    def test_float64_reference(self):
        r = self.ok("gelu")
        mine = by_key(r)
        ref = mine[REF + REPLAY_GELU + ".output.0"]
        self.assertEqual(ref["dtype"], "float64")
        self.assertNotIn(REF + REPLAY_GELU + ".arg.0", mine)  # the reference targets nothing
        self.assertNotIn("op_call", ref.header)
        self.assertEqual(mine[REF + "model.0.forward.input.0"]["dtype"], "float64")
        x = util.floats(mine[REPLAY_GELU + ".arg.0"].payload, "float32")
        got = util.floats(ref.payload, "float64")
        want = [0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x]  # exact GELU, in float64
        for g, w in zip(got, want):
            self.assertAlmostEqual(g, w, places=12)
        out = util.floats(mine[REPLAY_GELU + ".output.0"].payload, "float32")
        self.assertNotEqual([float(v) for v in out], got)  # float32's result is rounded

    def test_job_dtype_is_not_the_arguments(self):
        # bfloat16: the cell's cast of its inputs would lose bits; float64: the
        # model itself is float64, yet only the reference runs the op so.
        ctl = by_key(self.gelu)
        full = by_key(self.ok("gelu"))
        for name in ("gelu_bf16", "gelu_f64"):
            mine = by_key(self.ok(name))
            for role in ("arg", "output"):
                t = mine[REPLAY_GELU + "." + role + ".0"]
                self.assertEqual(t["dtype"], "float32", name)
                self.assertEqual(t.payload, ctl[GELU + "." + role + ".0"].payload, name)
            ref = mine[REF + REPLAY_GELU + ".output.0"]
            self.assertEqual(ref["dtype"], "float64", name)
            self.assertEqual(ref.payload, full[REF + REPLAY_GELU + ".output.0"].payload, name)

    def test_strided_argument_with_offset(self):
        r = self.ok("add")
        mine = by_key(r)
        ctl = by_key(self.add)
        self.assertEqual([t["key"] for t in r.tensors if "/op." in t["key"]
                          and not t["key"].startswith(REF)],
                         [REPLAY_ADD + ".arg.0", REPLAY_ADD + ".arg.1", REPLAY_ADD + ".output.0"])
        for key in (".arg.0", ".arg.1", ".output.0"):
            self.assertEqual(mine[REPLAY_ADD + key].payload, ctl[ADD + key].payload, key)
        call = mine[REPLAY_ADD + ".arg.1"]["op_call"]
        self.assertEqual(call, ctl[ADD + ".arg.1"]["op_call"])
        self.assertEqual(call["args"][1], {"arg": 1, "dtype": "float32", "shape": [2, 4],
                                           "stride": [6, 1], "storage_offset": 1})
        # the float64 reference: a0 + 2 * a1 of the same (strided) arguments.
        # Read from the model's output: the reference's record of the
        # in-place op's own result holds the tensor before the op (its
        # version counter moves only after the dispatch mode has recorded
        # it, so the analysis cache answers), a matter of opcapture.py.
        self.assertEqual(mine[REF + REPLAY_ADD + ".output.0"]["dtype"], "float64")
        ref = mine[REF + "model.0.forward.output.0"]
        self.assertEqual(ref["dtype"], "float64")
        a0 = util.floats(ctl[ADD + ".arg.0"].payload, "float32")
        a1 = util.floats(ctl[ADD + ".arg.1"].payload, "float32")
        want = struct.pack("<%dd" % len(a0), *[a + 2.0 * b for a, b in zip(a0, a1)])
        self.assertEqual(ref["hash"], util.content_hash(ref["hash_alg"], want))

    def test_layouts_from_op_call(self):
        # repro.py's layouts(): what the op model and repro.py rebuild from
        from capd_runner import opreplay
        m = {"op_call": {"args": [{"arg": 0, "stride": [4, 1], "storage_offset": 0}, 2.0],
                         "kwargs": {"other": [{"arg": 1, "stride": [6, 1],
                                               "storage_offset": 1}]}},
             "args": [{"index": 0, "stride": [1, 2], "storage_offset": 3}, {"index": 1}]}
        opreplay._repro().layouts(m)
        self.assertEqual(m["args"], [{"index": 0, "stride": [1, 2], "storage_offset": 3},
                                     {"index": 1, "stride": [6, 1], "storage_offset": 1}])

    def test_unknown_op(self):
        reason = self.failed("noop")
        self.assertIn("target_inputs", reason)
        self.assertIn("aten::capd_no_such_op", reason)

    def test_backward_refused(self):
        reason = self.failed("bwd")
        self.assertIn("op replay runs the forward pass only", reason)

    def test_no_manifest(self):
        reason = self.failed("missing")
        self.assertIn("manifest.json", reason)


if __name__ == "__main__":
    unittest.main()
