"""In-process tests of the hot path: header encoding, buffer pool, the
analysis pipeline's batching and ordering, Recorder async vs inline."""

import json
import math
import os
import threading
import unittest

import torch

from capd_runner import capture, frames as F, pipeline as P, tensors as T


class HeaderEncodingTest(unittest.TestCase):
    """tensor_header_line(tensor_header_prefix(...)) is byte for byte what
    encode_header writes for the same dict."""

    def reference(self, seq, key, module, call, phase, role, index, dtype, shape, numel, stats,
                  hash_hex, capture_kind, nbytes):
        header = {"kind": "tensor", "seq": seq, "key": key, "module": module, "call": call,
                  "phase": phase, "role": role, "index": index, "dtype": dtype,
                  "shape": list(shape), "numel": numel, "stats": stats, "hash": hash_hex,
                  "hash_alg": T.HASH_ALG, "capture": capture_kind}
        if capture_kind == "sample":
            header["sample_positions"] = "stride"
        if nbytes:
            header["nbytes"] = nbytes
        return F.encode_header(header)

    def fast(self, seq, key, module, call, phase, role, index, dtype, shape, numel, stats,
             hash_hex, capture_kind, nbytes):
        return F.tensor_header_line(
            F.tensor_header_prefix(seq, key, module, call, phase, role, index, dtype, shape,
                                   numel), stats, hash_hex, capture_kind, nbytes, T.HASH_ALG)

    def test_same_bytes(self):
        eng = T.StatsEngine()
        g = T.generator(4)
        stats_list = [
            eng.stats(T.det_normalish((100,), g)),
            eng.stats(torch.tensor([float("nan"), float("inf")])),  # all None but counts
            eng.stats(torch.zeros(0)),
            eng.stats(torch.tensor([-0.0, 0.0])),
            eng.stats(torch.tensor([1e-300, 5e20, -3.0], dtype=torch.float64)),
            eng.stats(torch.tensor([2 ** 40, -7], dtype=torch.int64)),
        ]
        modules = ["model", "layer1.0.conv1", 'we"ird\\na\u00efve.\u6f22\u5b57',
                   capture.safe_fqn("ctl\x01\x7f\x9fchars"), "x" * 300, "emoji\U0001F600"]
        shapes = [torch.Size([]), torch.Size([0]), torch.Size([2, 64, 16, 16]), (3,),
                  torch.Size([1] * 16)]
        n = 0
        for module in modules:
            for index in (0, 17, "weight", "w\u00e9ird\"name"):
                for st in stats_list:
                    for kind, nbytes in (("stats", 0), ("sample", 512), ("full", 1 << 33)):
                        shape = shapes[n % len(shapes)]
                        args = (n * 7919, "%s.3.forward.output.%s" % (module, index), module, 3,
                                "forward", "output", index, "float32", shape, 12345, st,
                                "9f86d081884c7d659a2feaa0c55ad015", kind, nbytes)
                        self.assertEqual(self.fast(*args), self.reference(*args), args)
                        n += 1
        self.assertGreater(n, 400)

    def test_nonfinite_value_refused(self):
        # The engine never produces one; the fast path must not write it.
        st = dict(T._EMPTY_STATS)
        st["mean"] = float("nan")
        with self.assertRaises(ValueError):
            self.fast(0, "k", "m", 0, "forward", "output", 0, "float32", (1,), 1, st, "00",
                      "stats", 0)
        with self.assertRaises(ValueError):
            self.reference(0, "k", "m", 0, "forward", "output", 0, "float32", (1,), 1, st,
                           "00", "stats", 0)

    def test_too_large(self):
        with self.assertRaises(F.HeaderTooLarge):
            self.fast(0, "k" * 70000, "m", 0, "forward", "output", 0, "float32", (1,), 1,
                      None, "00", "stats", 0)


class BufferPoolTest(unittest.TestCase):
    def test_take_give_by_shape(self):
        pool = P.BufferPool(limit=1 << 20)
        flat, shaped, raw = pool.take(torch.float32, torch.Size([2, 3]))
        self.assertEqual(tuple(shaped.shape), (2, 3))
        self.assertEqual(flat.shape, (6,))
        self.assertEqual(flat.data_ptr(), shaped.data_ptr())
        shaped.copy_(torch.arange(6, dtype=torch.float32).reshape(2, 3).t().reshape(2, 3))
        if raw is not None:
            self.assertEqual(bytes(raw), bytes(T.raw_bytes(flat)))
            self.assertEqual(T.hash_bytes(raw), T.content_hash(shaped))
        entry = (flat, shaped, raw)
        pool.give(entry)
        self.assertIs(pool.take(torch.float32, torch.Size([2, 3])), entry)
        other = pool.take(torch.float32, torch.Size([3, 2]))  # same numel, other shape
        self.assertIsNot(other, entry)
        self.assertEqual(tuple(other[1].shape), (3, 2))
        pool.give(entry)
        self.assertEqual(pool.bytes, 24)
        big = pool.take(torch.float64, torch.Size([1 << 18]))  # 2 MiB: over the limit
        pool.give(big)
        self.assertEqual(pool.bytes, 24)


class _OrderJob(P.Job):
    def __init__(self, out, i, work=False):
        self.out, self.i, self.work = out, i, work
        self.computed = False

    def compute(self):
        if self.work:
            torch.ones(1000).sum()
        self.computed = True

    def emit(self):
        assert self.computed
        self.out.append(self.i)


class PipelineTest(unittest.TestCase):
    def run_jobs(self, workers, pattern):
        out = []
        writer = F.FrameWriter(os.open(os.devnull, os.O_WRONLY))
        pipe = P.Pipeline(writer, sync=False, workers=workers)
        try:
            for i in range(1000):
                work = pattern(i)
                pipe.submit(_OrderJob(out, i, work), 4096 if work else 0)
            pipe.drain()
        finally:
            pipe.stop()
        return out

    def test_order_kept_whatever_wakes_the_workers(self):
        patterns = [lambda i: False,  # never a wake-up job: queue fills past MAX_JOBS
                    lambda i: True,
                    lambda i: i % 97 == 0,
                    lambda i: i < 3]
        for workers in (1, 2, 3):
            for pattern in patterns:
                self.assertEqual(self.run_jobs(workers, pattern), list(range(1000)))

    def test_worker_error_surfaces(self):
        class Bad(P.Job):
            def compute(self):
                raise RuntimeError("boom")
        writer = F.FrameWriter(os.open(os.devnull, os.O_WRONLY))
        pipe = P.Pipeline(writer, sync=False, workers=1)
        try:
            pipe.submit(Bad(), 0)
            with self.assertRaises(P.WorkerError) as cm:
                pipe.drain()
            self.assertIn("boom", str(cm.exception))
        finally:
            pipe.stop()


class _T(torch.nn.Module):
    """Returns a non-contiguous view (and an int tensor, a 0-d one)."""

    def forward(self, x):
        return x.t(), (x > 0).to(torch.int64).sum(1), x.sum()


class _Second(torch.nn.Module):
    def forward(self, xs):
        return xs[0]


class RecorderModesTest(unittest.TestCase):
    """The same module run through the async pipeline (1 and 2 workers) and
    inline gives the same frames, byte for byte, at every capture level."""

    def frames_of(self, model, x, level, sync, workers=1, emit=True):
        r, w = os.pipe()
        chunks = []

        def reader():
            while True:
                b = os.read(r, 1 << 16)
                if not b:
                    break
                chunks.append(b)
        th = threading.Thread(target=reader)
        th.start()
        writer = F.FrameWriter(w)
        pipe = P.Pipeline(writer, sync=sync, workers=workers)
        try:
            rec = capture.Recorder(writer, pipe, level, 16, capture.PayloadBudget(6000),
                                   emit=emit)
            with torch.no_grad():
                with capture.Capture(model, rec):
                    model(x)
                    model(x)  # second call: call index 1, cache hits on the same input
            pipe.drain()
            writer.flush()
        finally:
            pipe.stop()
            os.close(w)
            th.join()
            os.close(r)
        return b"".join(chunks), rec.hashes

    def test_modes_agree(self):
        g = T.generator(9)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(inplace=True),
                                    torch.nn.Linear(16, 4), torch.nn.Softmax(dim=1), _T(),
                                    _Second())
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(T.det_uniform(p.shape, g, 0.5))
        x = T.det_normalish((5, 8), g)
        for level in ("stats", "sample", "full"):
            ref, ref_hashes = self.frames_of(model, x, level, sync=True)
            self.assertTrue(ref)
            for workers in (1, 2):
                got, hashes = self.frames_of(model, x, level, sync=False, workers=workers)
                self.assertEqual(got, ref, (level, workers))
                self.assertEqual(hashes, ref_hashes)
            # The non-contiguous output is hashed as its C-contiguous bytes.
            want = T.content_hash(model[:4](x).t().contiguous())
            self.assertEqual(ref_hashes["4.0.forward.output.0"], want)
            self.assertEqual(ref_hashes["5.0.forward.output.0"], want)
            # The hash-only run agrees on every key's hash.
            _none, only = self.frames_of(model, x, level, sync=False, emit=False)
            self.assertEqual(only, ref_hashes)
            for line in ref.split(b"\n"):
                if line.startswith(b"{"):
                    h = json.loads(line)
                    if h.get("stats") and h["stats"]["mean"] is not None:
                        self.assertTrue(math.isfinite(h["stats"]["mean"]))


if __name__ == "__main__":
    unittest.main()
