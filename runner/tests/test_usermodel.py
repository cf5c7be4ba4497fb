"""In-process tests of the user-model import rules (capd_runner.usermodel).
Every case here is refused before any module is imported."""

import os
import sys
import unittest

import torch  # noqa: F401  (so "torch" counts as already imported)

from capd_runner import usermodel
from tests import util


class RefusalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = util.tempdir()
        util.write_tree(cls.root, {"okpkg/__init__.py": "", "okpkg/m.py": "def f(s, b, d):\n    return 1\n"})
        cls.other = util.tempdir()
        util.write_tree(cls.other, {"otherpkg/__init__.py": "raise SystemExit('imported!')\n"})

    def refused(self, name, roots, *words):
        before = list(sys.path)
        with self.assertRaises(usermodel.UserModelError) as cm:
            usermodel.load_factory(name, roots)
        self.assertEqual(sys.path, before, "sys.path changed by a refused load")
        for w in words:
            self.assertIn(w, str(cm.exception))

    def test_names(self):
        for name in ("..okpkg.m:f", "okpkg..m:f", ".okpkg.m:f", "okpkg/m:f", "/abs/okpkg/m.py:f",
                     "okpkg.m:", "okpkg.m:f.g", "okpkg.m:f:g", "ok pkg.m:f", "okpkg.m"):
            self.refused(name, [self.root], "refused")

    def test_roots(self):
        self.refused("okpkg.m:f", [], "model_roots")
        self.refused("okpkg.m:f", ["relative/dir"], "absolute")
        self.refused("okpkg.m:f", [self.root + "/../" + os.path.basename(self.root)], "..")
        self.refused("okpkg.m:f", [os.path.join(self.root, "nonexistent")], "not a directory")

    def test_not_in_roots(self):
        # otherpkg exists, but not under the roots: never imported.
        sys.path.append(self.other)
        try:
            self.refused("otherpkg:f", [self.root], "no module or package")
        finally:
            sys.path.remove(self.other)
        self.assertNotIn("otherpkg", sys.modules)

    def test_already_imported_elsewhere(self):
        self.refused("json:loads", [self.root], "already imported")
        self.refused("torch.nn:Linear", [self.root], "already imported")
        self.refused("unittest.mock:Mock", [self.root], "already imported")


if __name__ == "__main__":
    unittest.main()
