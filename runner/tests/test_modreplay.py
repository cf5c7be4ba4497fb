"""Module calls as targets (option target_op "<fqn>.<call>.forward";
capd_runner/targetrec.py) and module replay on recorded inputs (option
target_inputs with a manifest of unit module; capd_runner/modreplay.py), in
real runner processes: the target call's input and output records whole,
every other record as without the option (granularity module and op, both
passes, a payload level), the notes (never ran, a backward phase, payload
limits); then folders made from a targeted capture's input records, given
to that call of the cell's own model: the control's records bit for bit,
perturbed inputs computing what they should, the float64 reference of the
call, and each refusal with its reason; runner/repro/repro.py refusing such
a folder."""

import json
import os
import struct
import subprocess
import unittest

from tests import util
from tests.framereader import RUNNER_DIR
from tests.reproarchive import write_npy

REPRO = os.path.join(RUNNER_DIR, "repro", "repro.py")
REF = "ref.float64/"
LIN1 = "lin.1.forward"
MIX = "mix.0.forward"
ROOT = "model.0.forward"

MODELS = {
    "mr/__init__.py": "",
    "mr/models.py": '''
import torch

class Mix(torch.nn.Module):
    def forward(self, a, b):
        return a * torch.sigmoid(b)

class Twice(torch.nn.Module):
    """lin runs twice (its call 1 on its call 0's output); mix takes two
    inputs, the second a strided view (not contiguous)."""
    def __init__(self):
        super(Twice, self).__init__()
        self.enc = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU())
        self.lin = torch.nn.Linear(8, 8)
        self.mix = Mix()
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.enc(x)
        g = self.lin(self.lin(h))
        hh = torch.stack([h, h], 2)[:, :, 0]  # h, strides (16, 2)
        return self.head(self.mix(g, hh))

def twice(seed, batch, dtype):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    return Twice(), torch.randn(batch, 6, generator=g).to(dtype)
''',
}


def by_key(result):
    return dict((t["key"], t) for t in result.tensors)


def spec(root, **options):
    opts = dict(iterations=0, warmup=0, model_roots=[root])
    opts.update(options)
    return util.make_spec("mr.models:twice", **opts)


def make_folder(result, target, fqn=None, call=None, **extra):
    """A module replay folder from the input records of TARGET
    ("<fqn>.<call>.forward") in RESULT, as capd writes it."""
    d = util.tempdir()
    os.makedirs(os.path.join(d, "inputs"))
    args = []
    for t in result.tensors:
        if t["key"].startswith(target + ".input."):
            rel = "inputs/arg.%d.npy" % t["index"]
            write_npy(os.path.join(d, rel), t["dtype"], t["shape"], t.payload)
            args.append({"index": t["index"], "file": rel, "dtype": t["dtype"],
                         "shape": t["shape"], "role": "input", "key": t["key"]})
    f, c, _phase = target.rsplit(".", 2)
    m = {"format": 1, "unit": "module", "module": fqn or f,
         "call": int(c) if call is None else call, "args": args, "key": target}
    m.update(extra)
    with open(os.path.join(d, "manifest.json"), "w") as out:
        json.dump(m, out)
    return d


def replay(d, target, root, **options):
    """The isolated replay job's options, as capd sends them."""
    opts = dict(granularity="module", target_op=target, target_inputs=d, reference="float64",
                capture="full")
    opts.update(options)
    return spec(root, **opts)


def linear(x, w, b, rows, cols_in, cols_out):
    """x @ w.T + b in float64, row-major lists."""
    return [sum(x[r * cols_in + k] * w[o * cols_in + k] for k in range(cols_in)) + b[o]
            for r in range(rows) for o in range(cols_out)]


class Base(unittest.TestCase):
    def ok(self, r, name=""):
        self.assertEqual(r.status, "ok", r.describe())
        self.assertEqual(r.one("nondeterministic")["keys"], [], name)
        return r


class ModuleTargetTest(Base):
    @classmethod
    def setUpClass(cls):
        root = cls.root = util.model_tree(MODELS)
        jobs = {
            "plain": spec(root, reference="float64"),
            "lin1": spec(root, reference="float64", target_op=LIN1),
            "plain_op": spec(root, granularity="op"),
            "enc_op": spec(root, granularity="op", target_op="enc.0.forward"),
            "plain_sample": spec(root, capture="sample", sample_size=3),
            "mix_sample": spec(root, capture="sample", sample_size=3, target_op=MIX),
            "plain_bwd": spec(root, pass_="backward"),
            "lin1_bwd": spec(root, pass_="backward", target_op=LIN1),
            "never": spec(root, target_op="lin.2.forward"),
            "bwd_phase": spec(root, pass_="backward", target_op="lin.0.backward"),
            "tight": spec(root, target_op=LIN1, max_payload_bytes=100),
        }
        names = sorted(jobs)
        cls.res = dict(zip(names, util.run_many([(jobs[n], {}) for n in names])))

    def get(self, name):
        return self.ok(self.res[name], name)

    def test_whole_input_and_output(self):
        mine = by_key(self.get("lin1"))
        for key in (LIN1 + ".input.0", LIN1 + ".output.0"):
            t = mine[key]
            self.assertEqual(t["capture"], "full", key)  # the cell's level is stats
            self.assertEqual(len(t.payload), t["numel"] * 4, key)
            self.assertEqual(t["hash"], util.record_hash(t, t.payload), key)
            for field in ("op", "op_index", "op_call"):
                self.assertNotIn(field, t.header, key)
        # lin's call 1 takes its call 0's output and mix takes its output
        prev, nxt = mine["lin.0.forward.output.0"], mine["mix.0.forward.input.0"]
        self.assertEqual(prev["capture"], "stats")
        self.assertEqual(prev["hash"], util.content_hash(prev["hash_alg"],
                                                         mine[LIN1 + ".input.0"].payload))
        self.assertEqual(nxt["hash"], util.content_hash(nxt["hash_alg"],
                                                        mine[LIN1 + ".output.0"].payload))

    def same_but(self, plain, mine, target):
        a, b = self.get(plain), self.get(mine)
        self.assertEqual([t["key"] for t in a.tensors], [t["key"] for t in b.tensors])
        full = []
        for x, y in zip(a.tensors, b.tensors):
            if x["key"].startswith(target + "."):
                self.assertEqual(y["capture"], "full", y["key"])
                full.append(y["key"])
                continue
            self.assertEqual(x.header, y.header, x["key"])
            self.assertEqual(x.payload, y.payload, x["key"])
        self.assertEqual(b.notes("warn"), a.notes("warn"))
        return full

    def test_other_records_unchanged(self):
        self.assertEqual(self.same_but("plain", "lin1", LIN1),
                         [LIN1 + ".input.0", LIN1 + ".output.0"])
        # the reference targets nothing
        ref = by_key(self.get("lin1"))[REF + LIN1 + ".output.0"]
        self.assertEqual(ref["capture"], "stats")
        self.assertEqual(ref["dtype"], "float64")

    def test_granularity_op(self):
        full = self.same_but("plain_op", "enc_op", "enc.0.forward")
        self.assertEqual(full, ["enc.0.forward.input.0", "enc.0.forward.output.0"])
        # enc's submodules and ops are recorded as usual
        self.assertIn("enc.0.0.forward/op.aten::addmm.0.output.0", by_key(self.get("enc_op")))

    def test_sample_level_and_two_inputs(self):
        full = self.same_but("plain_sample", "mix_sample", MIX)
        self.assertEqual(full, [MIX + ".input.0", MIX + ".input.1", MIX + ".output.0"])
        mine = by_key(self.get("mix_sample"))
        h = mine["enc.0.forward.output.0"]  # mix's second input holds h's values
        self.assertEqual(h["hash"], util.content_hash(h["hash_alg"],
                                                      mine[MIX + ".input.1"].payload))

    def test_backward_pass(self):
        self.assertEqual(self.same_but("plain_bwd", "lin1_bwd", LIN1),
                         [LIN1 + ".input.0", LIN1 + ".output.0"])

    def test_never_ran(self):
        r = self.get("never")
        self.assertIn("target_op lin.2.forward never ran in this cell", r.notes("warn"))
        self.assertFalse([t for t in r.tensors if t["capture"] == "full"])

    def test_backward_phase_not_targeted(self):
        r = self.get("bwd_phase")
        self.assertTrue([m for m in r.notes("warn") if m.startswith("target_op lin.0.backward:")
                         and "backward phase cannot be targeted" in m], r.notes())
        self.assertFalse([m for m in r.notes("warn") if "never ran" in m])
        self.assertFalse([t for t in r.tensors if t["capture"] == "full"])

    def test_payload_limit(self):
        r = self.get("tight")  # 100 bytes: the 64-byte input fits, the output does not
        mine = by_key(r)
        self.assertEqual(mine[LIN1 + ".input.0"]["capture"], "full")
        self.assertEqual(mine[LIN1 + ".output.0"]["capture"], "stats")
        self.assertTrue([m for m in r.notes("warn") if m.startswith("target_op: " + LIN1
                                                                    + ".output.0 needs")],
                        r.notes())


class ModuleReplayTest(Base):
    @classmethod
    def setUpClass(cls):
        root = cls.root = util.model_tree(MODELS)
        full = dict(capture="full", reference="float64")
        cls.ctl = dict(zip(("lin1", "mix", "root", "bf16"), util.run_many([
            (spec(root, target_op=LIN1, **full), {}),
            (spec(root, target_op=MIX, **full), {}),
            (spec(root, target_op=ROOT, **full), {}),
            (spec(root, target_op=LIN1, dtype="bfloat16", **full), {})])))
        for r in cls.ctl.values():
            assert r.status == "ok", r.describe()
        lin1 = cls.lin1_dir = make_folder(cls.ctl["lin1"], LIN1)
        mix = make_folder(cls.ctl["mix"], MIX)
        # perturbed: the first value of lin's call 1 input, + 1
        cls.perturbed_dir = util.copy_archive(lin1)
        path = os.path.join(cls.perturbed_dir, "inputs", "arg.0.npy")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        body = len(data) - 16 * 4
        x0 = struct.unpack_from("<f", data, body)[0]
        struct.pack_into("<f", data, body, x0 + 1.0)
        with open(path, "wb") as f:
            f.write(data)
        bad_json = util.copy_archive(lin1)
        with open(os.path.join(bad_json, "manifest.json"), "w") as f:
            f.write("{not json")
        jobs = {
            "lin1": replay(lin1, LIN1, root),
            "perturbed": replay(cls.perturbed_dir, LIN1, root),
            "mix": replay(mix, MIX, root),
            "root": replay(make_folder(cls.ctl["root"], ROOT), ROOT, root),
            "bf16": replay(make_folder(cls.ctl["bf16"], LIN1), LIN1, root, dtype="bfloat16"),
            "no_target_op": replay(lin1, "", root),
            "granularity_op": replay(lin1, LIN1, root, granularity="op"),
            # refusals
            "no_module": replay(util.copy_archive(lin1, module="nosuch"), "nosuch.1.forward", root),
            "count": replay(util.copy_archive(mix, module="lin", call=1), LIN1, root),
            "shape": replay(util.copy_archive(lin1, module="enc.0", call=0), "enc.0.0.forward", root),
            "dtype": replay(make_folder(cls.ctl["bf16"], LIN1), LIN1, root),
            "never": replay(util.copy_archive(lin1, call=2), "lin.2.forward", root),
            "backward": replay(lin1, LIN1, root, pass_="backward"),
            "bad_json": replay(bad_json, LIN1, root),
            "bad_unit": replay(util.copy_archive(lin1, unit="layer"), LIN1, root),
            "bad_call": replay(util.copy_archive(lin1, call="1"), LIN1, root),
        }
        names = sorted(jobs)
        cls.res = dict(zip(names, util.run_many([(jobs[n], {}) for n in names])))

    def get(self, name):
        return self.ok(self.res[name], name)

    def failed(self, name):
        r = self.res[name]
        self.assertEqual(r.status, "failed", r.describe())
        return r.end["reason"]

    def same_as_control(self, name, ctl):
        """Every record of replay NAME but the reference's is the control's."""
        mine, theirs = self.get(name), self.ctl[ctl]
        own = [t for t in mine.tensors if not t["key"].startswith(REF)]
        want = [t for t in theirs.tensors if not t["key"].startswith(REF)]
        self.assertEqual([t["key"] for t in own], [t["key"] for t in want], name)
        for a, b in zip(own, want):
            self.assertEqual(a.header, b.header, a["key"])
            self.assertEqual(a.payload, b.payload, a["key"])
        return by_key(mine)

    def test_bit_for_bit(self):
        mine = self.same_as_control("lin1", "lin1")
        self.assertEqual(mine[LIN1 + ".output.0"]["capture"], "full")
        self.assertEqual(mine[LIN1 + ".input.0"].payload,
                         by_key(self.ctl["lin1"])[LIN1 + ".input.0"].payload)

    def test_two_inputs_one_strided(self):
        self.same_as_control("mix", "mix")

    def test_root_module(self):
        self.same_as_control("root", "root")

    def test_bfloat16(self):
        mine = self.same_as_control("bf16", "bf16")
        self.assertEqual(mine[LIN1 + ".input.0"]["dtype"], "bfloat16")
        ref = mine[REF + LIN1 + ".input.0"]
        self.assertEqual(ref["dtype"], "float64")
        want = util.floats(mine[LIN1 + ".input.0"].payload, "bfloat16")
        self.assertEqual(util.floats(ref.payload, "float64"), want)

    def test_without_target_op_and_at_op(self):
        # the replacement does not need the target: the same records at the cell's level
        mine = by_key(self.get("no_target_op"))
        ctl = by_key(self.ctl["lin1"])
        self.assertEqual(mine[LIN1 + ".output.0"].payload, ctl[LIN1 + ".output.0"].payload)
        self.assertEqual(mine[LIN1 + ".input.0"].payload, ctl[LIN1 + ".input.0"].payload)
        op = by_key(self.get("granularity_op"))
        self.assertEqual(op[LIN1 + ".output.0"].payload, ctl[LIN1 + ".output.0"].payload)
        self.assertIn("lin.1.forward/op.aten::addmm.0.output.0", op)

    def params(self, r):
        mine = by_key(r)
        w = util.floats(mine["lin.0.init.param.weight"].payload, "float32")
        b = util.floats(mine["lin.0.init.param.bias"].payload, "float32")
        return w, b

    def test_float64_reference(self):
        mine = by_key(self.get("lin1"))
        x = util.floats(mine[LIN1 + ".input.0"].payload, "float32")
        ref_in = mine[REF + LIN1 + ".input.0"]
        self.assertEqual(ref_in["dtype"], "float64")
        self.assertEqual(util.floats(ref_in.payload, "float64"), x)  # the recorded values
        # not what the float64 model computes there (the control's reference)
        ctl_ref = by_key(self.ctl["lin1"])[REF + LIN1 + ".input.0"]
        self.assertNotEqual(ref_in.payload, ctl_ref.payload)
        w, b = self.params(self.res["lin1"])
        want = linear(x, w, b, 2, 8, 8)
        got = util.floats(mine[REF + LIN1 + ".output.0"].payload, "float64")
        self.assertEqual(len(got), len(want))
        for g, v in zip(got, want):
            self.assertAlmostEqual(g, v, places=12)
        self.assertIn(REF + "head.0.forward.output.0", mine)

    def test_perturbed_inputs(self):
        r = self.get("perturbed")
        mine, ctl = by_key(r), by_key(self.ctl["lin1"])
        x = util.floats(mine[LIN1 + ".input.0"].payload, "float32")
        x_ctl = util.floats(ctl[LIN1 + ".input.0"].payload, "float32")
        self.assertEqual(x[1:], x_ctl[1:])
        self.assertEqual(x[0], struct.unpack("<f", struct.pack("<f", x_ctl[0] + 1.0))[0])
        out = util.floats(mine[LIN1 + ".output.0"].payload, "float32")
        out_ctl = util.floats(ctl[LIN1 + ".output.0"].payload, "float32")
        self.assertNotEqual(out[:8], out_ctl[:8])  # row 0 changed
        self.assertEqual(out[8:], out_ctl[8:])  # row 1 did not
        w, b = self.params(r)
        for g, v in zip(out, linear(x, w, b, 2, 8, 8)):
            self.assertAlmostEqual(g, v, places=5)
        # lin's call 0 as before; mix takes the replayed call's output
        for key in ("lin.0.forward.input.0", "lin.0.forward.output.0"):
            self.assertEqual(mine[key].payload, ctl[key].payload, key)
        self.assertEqual(mine["mix.0.forward.input.0"].payload, mine[LIN1 + ".output.0"].payload)
        self.assertNotEqual(mine["head.0.forward.output.0"].payload,
                            ctl["head.0.forward.output.0"].payload)

    def test_refusals(self):
        self.assertEqual(self.failed("no_module"), "target_inputs: the model has no module nosuch")
        self.assertEqual(self.failed("count"), "target_inputs: module lin call 1 has 1 tensor "
                         "inputs, the manifest records 2")
        self.assertEqual(self.failed("shape"), "target_inputs: module enc.0 call 0: input 0 "
                         "has shape [2, 6], the recorded one [2, 8]")
        self.assertEqual(self.failed("dtype"), "target_inputs: module lin call 1: input 0 is "
                         "float32, the recorded one bfloat16")
        self.assertEqual(self.failed("never"), "target_inputs: module lin call 2 never ran")
        self.assertEqual(self.failed("backward"), "target_inputs: module replay runs the "
                         "forward pass only, not pass backward")
        reason = self.failed("bad_json")
        self.assertIn("manifest.json is not JSON", reason)
        self.assertIn("manifest unit 'layer', the runner replays op or module",
                      self.failed("bad_unit"))
        self.assertIn("call '1' is not a call number", self.failed("bad_call"))

    def test_device_refused(self):
        import torch
        from capd_runner import opreplay
        from capd_runner.cell import CellFailed
        from capd_runner.spec import check
        s = check(replay(self.lin1_dir, LIN1, self.root, device="gpu"))
        with self.assertRaises(CellFailed) as cm:
            opreplay.build(s, torch.float32, lambda: self.fail("model built"))
        self.assertEqual(str(cm.exception), "target_inputs: module replay runs on the CPU only, "
                         "not device gpu")

    def test_repro_refuses(self):
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        for args in (["--json"], []):
            p = subprocess.run([util.PYTHON, REPRO, "--dir", self.lin1_dir] + args, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            text = (json.loads(p.stdout.decode())["error"] if args
                    else p.stderr.decode())
            self.assertIn("module lin (call 1)", text)
            self.assertIn("a module replay needs the model's code and runs through capd's "
                          "runner", text)
        # the arrays stay readable (repro.py's reader)
        from capd_runner import opreplay
        R = opreplay._repro()
        t = R.read_npy(os.path.join(self.lin1_dir, "inputs", "arg.0.npy"), "float32")
        self.assertEqual(list(t.shape), [2, 8])


if __name__ == "__main__":
    unittest.main()
