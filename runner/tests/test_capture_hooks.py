"""How a capture hooks the model (capture.Capture): two process-wide hooks
(torch's register_module_forward_pre_hook and _hook) where it may, one pair
per module where a module has forward hooks of its own; the same records
either way, nothing of another module, nothing left installed."""

import os
import tempfile
import unittest

import torch

from capd_runner import capture, native, pipeline as P, zoo
from capd_runner.frames import FrameWriter
from tests import test_native_pipe as NP

_module = torch.nn.modules.module


class _Outside(torch.nn.Module):
    """A model that calls a module it does not own (kept in a plain list, so
    not one of its submodules)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.helpers = [torch.nn.Tanh()]

    def forward(self, x):
        return self.helpers[0](self.lin(x)) + 1


class _Doubled(torch.nn.Module):
    """A model whose submodule has a forward hook of its own that changes
    its output (the capture must see it changed, as per-module hooks do)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = torch.nn.ReLU()
        self.lin.register_forward_hook(lambda m, i, o: o * 2)

    def forward(self, x):
        return self.act(self.lin(x))


def _global_hooks():
    return len(_module._global_forward_pre_hooks) + len(_module._global_forward_hooks)


class CaptureHooksTest(unittest.TestCase):
    def setUp(self):
        if not capture._GLOBAL_HOOKS:
            self.skipTest("this torch has no register_module_forward_hook")
        self.addCleanup(setattr, capture, "GLOBAL_HOOKS", capture.GLOBAL_HOOKS)

    def frames(self, build, use_global, use_native, taps=False):
        """(tensor frames, hooks installed during the run) of a stats capture
        of BUILD() = (model, inputs); the Python hooks unless USE_NATIVE."""
        capture.GLOBAL_HOOKS = use_global
        torch.manual_seed(0)
        model, inputs = build()
        fd, path = tempfile.mkstemp(prefix="capd-hooks-")
        self.addCleanup(os.unlink, path)
        writer = FrameWriter(fd)
        pipe = P.Pipeline(writer, sync=False, workers=1, native=use_native)
        try:
            rec = capture.Recorder(writer, pipe, "stats", 16, capture.PayloadBudget(1 << 40))
            if taps:
                model.train()
                with capture.Capture(model, rec, taps=True) as cap:
                    model(*inputs).float().sum().backward()
                    handles = len(cap.handles)
            else:
                model.eval()
                with torch.no_grad(), capture.Capture(model, rec) as cap:
                    model(*inputs)
                    handles = len(cap.handles)
            rec.sync()
            writer.flush()
        finally:
            pipe.stop()
            os.close(fd)
        return [(f.header, f.payload) for f in NP._read_frames(path)], handles

    def paths(self):
        out = [False]
        if native.status()[0]:
            out.append(True)
        return out

    def test_global_hooks_write_the_frames_of_per_module_hooks(self):
        builds = [lambda n=n: zoo.build(n, 0, 2) for n in ("mlp", "cnn", "transformer")]
        try:
            zoo.build("resnet18", 0, 1)
            builds.append(lambda: zoo.build("resnet18", 0, 1))
        except zoo.ModelError:
            pass
        for i, build in enumerate(builds):
            for use_native in self.paths():
                for taps in (False, True):
                    what = "model %d native=%s taps=%s" % (i, use_native, taps)
                    per, n_per = self.frames(build, False, use_native, taps)
                    glob, n_glob = self.frames(build, True, use_native, taps)
                    self.assertEqual(n_glob, 2, what)
                    self.assertEqual(n_per, 2 * len(list(build()[0].modules())), what)
                    self.assertGreater(len(per), 5, what)
                    self.assertEqual(glob, per, what)
                    self.assertEqual(_global_hooks(), 0, what)

    def test_a_module_outside_the_model_is_not_recorded(self):
        build = lambda: (_Outside(), (torch.randn(2, 4),))  # noqa: E731
        for use_native in self.paths():
            glob, n = self.frames(build, True, use_native)
            self.assertEqual(n, 2)
            self.assertEqual(sorted({h["module"] for h, _ in glob}), ["lin", "model"])
            self.assertEqual(glob, self.frames(build, False, use_native)[0])

    def test_a_module_with_hooks_of_its_own_keeps_per_module_hooks(self):
        build = lambda: (_Doubled(), (torch.ones(2, 4),))  # noqa: E731
        for use_native in self.paths():
            frames, n = self.frames(build, True, use_native)
            self.assertEqual(n, 2 * 3)
            self.assertEqual(frames, self.frames(build, False, use_native)[0])
            # the capture sees lin's output after its own hook doubled it
            torch.manual_seed(0)
            model, (x,) = build()
            with torch.no_grad():
                want = model.lin(x)
            out = [h for h, _ in frames if h["key"] == "lin.0.forward.output.0"]
            self.assertEqual(len(out), 1)
            self.assertAlmostEqual(out[0]["stats"]["mean"], want.double().mean().item(), places=6)

    def test_hooks_are_removed_when_the_forward_fails(self):
        class Boom(torch.nn.Module):
            def forward(self, x):
                raise RuntimeError("boom")

        writer = FrameWriter(os.open(os.devnull, os.O_WRONLY))
        self.addCleanup(os.close, writer.fd)
        pipe = P.Pipeline(writer, sync=True)
        rec = capture.Recorder(writer, pipe, "stats", 16, capture.PayloadBudget(1 << 40))
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), Boom())
        before = _global_hooks()
        with self.assertRaisesRegex(RuntimeError, "boom"):
            with torch.no_grad(), capture.Capture(model, rec):
                model(torch.ones(1, 2))
        self.assertEqual(_global_hooks(), before)
        self.assertFalse(any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()))


if __name__ == "__main__":
    unittest.main()
