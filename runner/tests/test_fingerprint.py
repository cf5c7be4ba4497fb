"""The environment part of the fingerprint: which variables it records."""

import unittest

from capd_runner import fingerprint


class RelevantEnvTest(unittest.TestCase):
    def test_import_path_and_loader_variables_recorded(self):
        env = {"PYTHONPATH": "/x/perturbed:/x/runner", "LD_PRELOAD": "/x/libm.so",
               "OMP_NUM_THREADS": "2", "MKL_CBWR": "AVX2"}
        self.assertEqual(fingerprint.relevant_env(env), env)

    def test_every_ordinary_variable_recorded(self):
        env = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "BLIS_ARCH_TYPE": "haswell",
               "PATH": "/bin", "LANG": "C.UTF-8", "CAPD_WIDTH": "avx2"}
        self.assertEqual(fingerprint.relevant_env(env), env)

    def test_secrets_redacted(self):
        env = {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "GITHUB_TOKEN": "t", "db_password": "p",
               "MY_API_KEY": "k", "SSH_AUTH_SOCK": "/run/a", "HTTP_COOKIE": "c",
               "XDG_SESSION_ID": "3", "SIGNING_KEY": "x", "PRIVATE_THING": "y",
               "PIP_INDEX_URL": "https://user:hunter2@pypi.example/simple",
               "PATH": "/bin", "KEYBOARD": "us"}
        out = fingerprint.relevant_env(env)
        self.assertEqual(sorted(out), sorted(env))
        for k in env:
            if k in ("PATH", "KEYBOARD"):
                self.assertEqual(out[k], env[k], k)
            else:
                self.assertEqual(out[k], "<redacted>", k)

    def test_per_cell_variables_left_out(self):
        scratch = "/var/lib/capd/cells/c1/scratch"
        env = {"CAPD_CELL_SPEC": scratch + "/cell.json", "HOME": scratch, "PWD": "/x",
               "OLDPWD": "/y", "SHLVL": "1", "_": "/usr/bin/python3", "TMPDIR": scratch + "/t",
               "OMP_NUM_THREADS": "1"}
        rec, per_cell, left_out = fingerprint.split_env(env, scratch)
        self.assertEqual(rec, {"OMP_NUM_THREADS": "1"})
        self.assertEqual(per_cell, ["CAPD_CELL_SPEC", "HOME", "OLDPWD", "PWD", "SHLVL", "TMPDIR",
                                    "_"])
        self.assertEqual(left_out, [])

    def test_home_outside_scratch_recorded(self):
        rec = fingerprint.relevant_env({"HOME": "/root", "CAPD_CELL_SPEC": "/s/cell.json"},
                                       scratch="/var/lib/capd/x")
        self.assertEqual(rec, {"HOME": "/root"})

    def test_sorted_by_name(self):
        out = fingerprint.relevant_env({"PYTHONPATH": "a", "CUDA_VISIBLE_DEVICES": "0"})
        self.assertEqual(list(out), ["CUDA_VISIBLE_DEVICES", "PYTHONPATH"])

    def test_limits(self):
        big = "x" * (fingerprint.ENV_VALUE_MAX + 1)
        out = fingerprint.relevant_env({"BIG": big})
        self.assertRegex(out["BIG"], r"^<%d bytes, sha256 [0-9a-f]{64}>$" % len(big))
        many = dict(("V%05d" % i, "y" * 1000) for i in range(100))
        rec, _per_cell, left_out = fingerprint.split_env(many)
        self.assertTrue(left_out)
        self.assertEqual(sorted(list(rec) + left_out), sorted(many))
        self.assertLessEqual(sum(len(k) + len(v) for k, v in rec.items()),
                             fingerprint.ENV_TOTAL_MAX)
        self.assertGreater(min(left_out), max(rec))


if __name__ == "__main__":
    unittest.main()
