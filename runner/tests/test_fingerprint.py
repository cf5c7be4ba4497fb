"""The environment part of the fingerprint: which variables it records."""

import unittest

from capd_runner import fingerprint


class RelevantEnvTest(unittest.TestCase):
    def test_import_path_and_loader_variables_recorded(self):
        env = {"PYTHONPATH": "/x/perturbed:/x/runner", "LD_PRELOAD": "/x/libm.so",
               "OMP_NUM_THREADS": "2", "MKL_CBWR": "AVX2"}
        self.assertEqual(fingerprint.relevant_env(env), env)

    def test_other_variables_left_out(self):
        env = {"HOME": "/root", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "PATH": "/bin",
               "PYTHONPATH": "/p"}
        self.assertEqual(fingerprint.relevant_env(env), {"PYTHONPATH": "/p"})

    def test_sorted_by_name(self):
        out = fingerprint.relevant_env({"PYTHONPATH": "a", "CUDA_VISIBLE_DEVICES": "0"})
        self.assertEqual(list(out), ["CUDA_VISIBLE_DEVICES", "PYTHONPATH"])


if __name__ == "__main__":
    unittest.main()
