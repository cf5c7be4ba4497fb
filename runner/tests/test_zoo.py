"""Every zoo model, forward and backward, as a real subprocess: status ok,
records in order, hashes stable within a cell (the runner's own second run:
no nondeterministic keys on CPU) and between two processes (the second one
with CAPD_RUNNER_SYNC=1, so the worker-thread and inline analysis agree)."""

import hashlib
import unittest

from tests import util

CELLS = [(m, p) for m in util.ZOO for p in ("forward", "backward")]
_results = {}


def setUpModule():
    jobs = []
    keys = []
    for model, pass_ in CELLS:
        for attempt in (1, 2):
            spec = util.make_spec(model, pass_=pass_, device=util.DEVICE, iterations=2, warmup=0)
            spec["attempt"] = attempt
            # The second process analyses inline (no worker thread): it must
            # produce the very same records.
            jobs.append((spec, {"env": {"CAPD_RUNNER_SYNC": "1"}} if attempt == 2 else {}))
            keys.append((model, pass_, attempt))
    for k, r in zip(keys, util.run_many(jobs)):
        _results[k] = r


class ZooTest(unittest.TestCase):
    def result(self, model, pass_, attempt=1):
        r = _results[(model, pass_, attempt)]
        if model in ("resnet18", "mobilenet_v3_small") and not util.has_torchvision():
            self.assertEqual(r.status, "failed", r.describe())
            self.assertIn("torchvision", r.end["reason"])
            self.skipTest("torchvision is not installed")
        self.assertEqual(r.status, "ok", r.describe())
        self.assertEqual(r.returncode, 0, r.describe())
        return r

    def check_common(self, r, pass_):
        env = r.one("env")
        fp = env["fingerprint"]
        self.assertEqual(env["effective_width"], fp["cpu_capability"])
        self.assertEqual(fp["torch"]["config_sha256"],
                         hashlib.sha256(fp["torch"]["config"].encode("utf-8")).hexdigest())
        ts = r.tensors
        self.assertTrue(ts)
        self.assertEqual([t["seq"] for t in ts], list(range(len(ts))))
        keys = [t["key"] for t in ts]
        self.assertEqual(len(keys), len(set(keys)), "duplicate keys")
        phases = [t["phase"] for t in ts]
        n_init = phases.count("init")
        self.assertGreater(n_init, 0)
        self.assertEqual(phases[:n_init], ["init"] * n_init, "init params come first")
        for t in ts[:n_init]:
            self.assertEqual(t["role"], "param")
            self.assertEqual(t["call"], 0)
        rest = ts[n_init:]
        self.assertEqual(rest[0]["key"], "model.0.forward.input.0")
        fw = [t for t in rest if t["phase"] == "forward"]
        self.assertEqual(fw[-1]["key"], "model.0.forward.output.0")
        timings = r.kinds("timing")
        self.assertEqual([t["process"] for t in timings], list(range(len(timings))),
                         "one timing frame per timing process, in order")
        self.assertEqual(len(timings), timings[0]["processes"])
        for timing in timings:
            self.assertEqual(timing["phase"], pass_)
            self.assertEqual(len(timing["samples_ns"]), timing["iterations"])
            self.assertTrue(all(isinstance(x, int) and x > 0 for x in timing["samples_ns"]))
        self.assertGreater(r.one("memory")["peak_rss_bytes"], 0)
        nd = r.one("nondeterministic")["keys"]
        if util.DEVICE == "cpu":
            self.assertEqual(nd, [], "nondeterministic keys on CPU")
        return ts, n_init

    def check_forward(self, r):
        ts, n_init = self.check_common(r, "forward")
        for t in ts[n_init:]:
            self.assertEqual(t["phase"], "forward")
            self.assertIn(t["role"], ("input", "output"))
            self.assertIsInstance(t["index"], int)

    def check_backward(self, r):
        ts, n_init = self.check_common(r, "backward")
        rest = ts[n_init:]
        phases = [t["phase"] for t in rest]
        first_bw = phases.index("backward")
        self.assertEqual(set(phases[first_bw:]), {"backward"}, "forward record after backward")
        self.assertEqual(rest[first_bw]["key"], "model.0.backward.grad_output.0")
        grads = [t for t in rest if t["role"] == "param_grad"]
        # Parameter gradients come last, one per parameter, in parameter order.
        self.assertEqual(rest[-len(grads):], grads)
        init = [(t["module"], t["index"]) for t in ts[:n_init]]
        self.assertEqual([(t["module"], t["index"]) for t in grads], init)
        for t in grads:
            self.assertEqual(t["call"], 0)
        roles = set(t["role"] for t in rest)
        self.assertTrue({"input", "output", "grad_output", "param_grad"} <= roles, roles)

    def check_stable(self, model, pass_):
        a = self.result(model, pass_, 1)
        b = self.result(model, pass_, 2)
        ha = dict((t["key"], (t["hash_alg"], t["hash"])) for t in a.tensors)
        hb = dict((t["key"], (t["hash_alg"], t["hash"])) for t in b.tensors)
        self.assertEqual(list(ha), list(hb), "keys differ between two processes")
        skip = set(a.one("nondeterministic")["keys"]) | set(b.one("nondeterministic")["keys"])
        # The async run may hash on the native pipe (XXH3-128) and the inline
        # one on the Python path (BLAKE2b-128): hashes of one algorithm must
        # be equal, and across the two, equal tensors must be equal on both
        # sides (the hashes map one to one).
        diff, fwd, back = [], {}, {}
        for k in ha:
            if k in skip:
                continue
            if ha[k][0] == hb[k][0]:
                if ha[k] != hb[k]:
                    diff.append(k)
            elif fwd.setdefault(ha[k], hb[k]) != hb[k] or back.setdefault(hb[k], ha[k]) != ha[k]:
                diff.append(k)
        self.assertEqual(diff, [], "hashes differ between two processes")

        def plain(t):
            h = dict(t.header)
            h.pop("hash")
            h.pop("hash_alg")
            return h
        if not skip:
            self.assertEqual([plain(t) for t in a.tensors], [plain(t) for t in b.tensors],
                             "async and inline analysis differ")


def _add(model, pass_):
    def test(self):
        r = self.result(model, pass_)
        if pass_ == "forward":
            self.check_forward(r)
        else:
            self.check_backward(r)
        self.check_stable(model, pass_)
    test.__name__ = "test_%s_%s" % (model, pass_)
    setattr(ZooTest, test.__name__, test)


for _m, _p in CELLS:
    _add(_m, _p)


class ZooDetailTest(unittest.TestCase):
    def test_mlp_shared_module_call_indices(self):
        r = _results[("mlp", "backward", 1)]
        keys = [t["key"] for t in r.tensors]
        for k in ("act.0.forward.input.0", "act.1.forward.output.0",
                  "act.0.backward.grad_output.0", "act.1.backward.grad_input.0"):
            self.assertIn(k, keys)
        # Backward runs the second call first.
        self.assertLess(keys.index("act.1.backward.grad_output.0"),
                        keys.index("act.0.backward.grad_output.0"))
        # Forward order: fc1, act(0), fc2, act(1), fc3.
        order = [k for k in keys if k.endswith("forward.output.0")]
        self.assertEqual(order, ["fc1.0.forward.output.0", "act.0.forward.output.0",
                                 "fc2.0.forward.output.0", "act.1.forward.output.0",
                                 "fc3.0.forward.output.0", "model.0.forward.output.0"])

    def test_grad_output_of_root_is_projection(self):
        # dL/d(output) of the root is the fixed projection: same in both passes' runs.
        a = _results[("mlp", "backward", 1)]
        b = _results[("cnn", "backward", 1)]
        ga = [t for t in a.tensors if t["key"] == "model.0.backward.grad_output.0"][0]
        gb = [t for t in b.tensors if t["key"] == "model.0.backward.grad_output.0"][0]
        self.assertEqual(ga["shape"], gb["shape"])  # both [2, 10]
        self.assertEqual(ga["hash"], gb["hash"])

    def test_transformer_layers_captured(self):
        r = _results[("transformer", "forward", 1)]
        mods = set(t["module"] for t in r.tensors)
        for m in ("encoder.layers.0.self_attn", "encoder.layers.1.linear1",
                  "encoder.layers.0.norm1", "encoder.layers.1.norm2", "norm", "head"):
            self.assertIn(m, mods)

    def test_lstm_tuple_output_flattened(self):
        r = _results[("lstm", "forward", 1)]
        outs = [t for t in r.tensors if t["module"] == "lstm" and t["role"] == "output"]
        self.assertEqual([t["index"] for t in outs], [0, 1, 2])  # out, h, c
        self.assertEqual(outs[0]["shape"], [8, 2, 32])
        self.assertEqual(outs[1]["shape"], [2, 2, 32])

    def test_embedding_bag_integer_inputs(self):
        r = _results[("embedding_bag", "backward", 1)]
        ins = [t for t in r.tensors if t["key"].startswith("model.0.forward.input.")]
        self.assertEqual([t["dtype"] for t in ins], ["int64", "int64"])
        grads = [t for t in r.tensors if t["key"] == "bag.0.backward.param_grad.weight"]
        self.assertEqual(len(grads), 1)


if __name__ == "__main__":
    unittest.main()
