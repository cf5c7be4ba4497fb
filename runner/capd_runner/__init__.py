"""capd_runner: runs one capd cell (model x width x pass) and writes frames.

Started by capd as ``<interpreter> -m capd_runner`` with the directory that
holds this package on PYTHONPATH. See docs/runner.md and docs/protocol.md.

Keep this package importable on Python 3.6 (PyTorch 1.10 still supports it):
no walrus, no dataclasses, no ``from __future__ import annotations``.
"""

__version__ = "0.1.0"
PROTOCOL = 1
RUNNER_NAME = "capd_runner/" + __version__
