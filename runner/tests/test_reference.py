"""The job option reference float64: after the cell's own capture the
runner sends the same inputs through a float64 copy of the model on the
CPU, each record again under ref.float64/<key> at the cell's capture level
(docs/compare.md, "Reference arbiter")."""

import unittest

from tests import util

PREFIX = "ref.float64/"


class ReferenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        jobs = [(util.make_spec("mlp", pass_="backward", capture="sample", sample_size=16,
                                iterations=1, reference="float64"), {}),
                (util.make_spec("mlp", capture="sample", sample_size=16, iterations=1), {})]
        cls.ref, cls.plain = util.run_many(jobs)

    def test_every_run_record_has_its_float64_twin(self):
        r = self.ref
        self.assertEqual(r.status, "ok", r.describe())
        own = [t for t in r.tensors if not t["key"].startswith(PREFIX)]
        refs = dict((t["key"][len(PREFIX):], t) for t in r.tensors if t["key"].startswith(PREFIX))
        run_keys = [t["key"] for t in own if ".init." not in t["key"]]
        self.assertTrue(run_keys)
        self.assertEqual(sorted(run_keys), sorted(refs), "one twin per record of the run")
        by_key = dict((t["key"], t) for t in own)
        for key, t in refs.items():
            self.assertEqual(t["dtype"], "float64", key)
            self.assertEqual(t["shape"], by_key[key]["shape"], key)
            self.assertEqual(t["capture"], "sample", key)
            self.assertEqual(t["module"], PREFIX + by_key[key]["module"], key)
            vals = util.floats(t.payload, "float64")
            mine = util.floats(by_key[key].payload, "float32")
            self.assertEqual(len(vals), len(mine), key)
            # The same computation in float64: close to the float32 values.
            for a, b in zip(vals, mine):
                self.assertLessEqual(abs(a - b), 1e-4 * max(1.0, abs(a)), key)
        seqs = [t["seq"] for t in r.tensors]
        self.assertEqual(seqs, sorted(set(seqs)), "seq strictly increasing across both")

    def test_none_sends_no_reference(self):
        r = self.plain
        self.assertEqual(r.status, "ok", r.describe())
        self.assertFalse([t for t in r.tensors if t["key"].startswith(PREFIX)])


if __name__ == "__main__":
    unittest.main()
