"""The native capture pipe (capd_runner/native.py, runner/native/capd_pipe.c)
against the Python pipeline it stands in for: the same frames, the same
hashes, in the same order, and every failure said clearly."""

import errno
import json
import os
import tempfile
import unittest

import torch

from capd_runner import capture, native, pipeline as P, tensors as T, zoo
from capd_runner.frames import FrameWriter
from tests import util
from tests.framereader import make_spec, parse


class _Base(unittest.TestCase):
    def setUp(self):
        util.require_native(self)

    def pipe_to_file(self, threads=1):
        """A pipe writing to a fresh temp file, both removed at cleanup."""
        fd, path = tempfile.mkstemp(prefix="capd-pipe-")
        self.addCleanup(os.unlink, path)
        pipe = native.Pipe(fd, threads)
        self.addCleanup(os.close, fd)
        return pipe, path


def _read_frames(path):
    with open(path, "rb") as f:
        return parse(f.read(), sequence=False)


_SIZES = {"float32": 4, "float64": 8, "int64": 8}


def _whole(f):
    """Whether the payload of tensor record ``f`` is all of the tensor (the
    bytes its hash is over)."""
    return (f["numel"] > 0 and f["dtype"] in _SIZES
            and len(f.payload) == f["numel"] * _SIZES[f["dtype"]])


class PipeTest(_Base):
    def test_hash_is_xxh3_128_of_the_bytes(self):
        pipe, _path = self.pipe_to_file(threads=2)
        try:
            datas = []
            for n in (0, 1, 2, 31, 32, 33, 63, 64, 65, 1000, 1 << 18):
                x = torch.arange(n, dtype=torch.uint8) * 7 + 3
                datas.append(x)
                pipe.analyze(x.data_ptr() if n else 0, n, native.Pipe.code(torch.uint8), 0, 0)
            pipe.drain()
            got = pipe.hashes(0, len(datas))
        finally:
            pipe.close()
        # XXH3-128 as the system's libxxhash computes it (util.xxh3_128),
        # not as the pipe's own build of the algorithm does.
        want = [util.xxh3_128(bytes(x.tolist())) for x in datas]
        self.assertEqual(got, want)

    def test_frames_and_sample_positions(self):
        pipe, path = self.pipe_to_file()
        x = T.det_normalish((1000,), T.generator(1), torch.float64)
        x[5] = float("nan")
        aid = pipe.analyze(x.data_ptr(), 1000, native.Pipe.code(torch.float64), 1, 7)
        pipe.emit(aid, b'{"kind":"tensor","seq":0,"key":"m.0.forward.output.0","module":"m",'
                       b'"call":0,"phase":"forward","role":"output","index":0,'
                       b'"dtype":"float64","shape":[1000],"numel":1000', 1)
        pipe.emit(aid, b'{"kind":"tensor","seq":1,"key":"n.0.forward.input.0","module":"n",'
                       b'"call":0,"phase":"forward","role":"input","index":0,'
                       b'"dtype":"float64","shape":[1000],"numel":1000', 0)
        pipe.drain()
        self.assertEqual(pipe.take_counts(), (2, 56))
        pipe.close()
        frames = _read_frames(path)
        self.assertEqual([f["seq"] for f in frames], [0, 1])
        ref = T.StatsEngine(use_native=False).stats(x)
        for f in frames:
            self.assertEqual(f["hash_alg"], "xxh3-128")
            self.assertEqual(f["hash"], util.xxh3_128(T.raw_bytes(x)))
            for k in ("nan", "pinf", "ninf", "zeros", "min", "max"):
                self.assertEqual(f["stats"][k], ref[k], k)
            for k in ("mean", "std", "l2"):
                self.assertAlmostEqual(f["stats"][k], ref[k], delta=1e-12 * abs(ref[k]))
        self.assertEqual(frames[0]["capture"], "sample")
        self.assertEqual(frames[0]["sample_positions"], "stride")
        pos = T.sample_positions(1000, 7)
        self.assertEqual(util.floats(frames[0].payload, "float64")[:5],
                         [x[p].item() for p in pos][:5])
        self.assertEqual(len(frames[0].payload), 7 * 8)
        self.assertEqual(frames[1]["capture"], "stats")
        self.assertEqual(frames[1].payload, b"")

    def test_bad_calls_are_refused(self):
        pipe, _path = self.pipe_to_file()
        try:
            with self.assertRaises(native.PipeError) as e:
                pipe.analyze(0, 4, 99, 1, 0)
            self.assertEqual(e.exception.errno, errno.EINVAL)
            with self.assertRaises(native.PipeError):
                pipe.analyze(0, 4, 0, 1, 0)  # data missing
            with self.assertRaises(native.PipeError):
                pipe.emit(0, b"{}", 0)  # no such analysis
            with self.assertRaises(native.PipeError):
                pipe.hashes(0, 1)
        finally:
            pipe.close()

    def test_write_error_is_reported(self):
        r, w = os.pipe()
        os.close(r)
        pipe = native.Pipe(w)
        x = torch.ones(10)
        aid = pipe.analyze(x.data_ptr(), 10, 0, 1, 0)
        pipe.emit(aid, b'{"kind":"tensor"', 0)
        with self.assertRaises(native.PipeError) as e:
            pipe.drain()
        self.assertEqual(e.exception.errno, errno.EPIPE)
        self.assertIn("Broken pipe", str(e.exception))
        pipe.close()
        os.close(w)

    def test_header_over_the_limit(self):
        pipe, path = self.pipe_to_file()
        x = torch.ones(3)
        aid = pipe.analyze(x.data_ptr(), 3, 0, 1, 0)
        pipe.emit(aid, b"{" + b"x" * 65500, 0)
        with self.assertRaises(native.PipeError) as e:
            pipe.drain()
        self.assertEqual(e.exception.errno, errno.EMSGSIZE)
        pipe.close()


class RecordCallTest(_Base):
    """capd_pipe_record: the analysis and the frame of a record in one call."""

    def pipe_to_file(self, threads=1):
        pipe, path = super().pipe_to_file(threads)
        if pipe.record_fn is None:
            pipe.close()
            self.skipTest("library without capd_pipe_record")
        return pipe, path

    def _prefix(self, seq, n):
        return (b'{"kind":"tensor","seq":%d,"key":"m.%d.forward.output.0","module":"m",'
                b'"call":%d,"phase":"forward","role":"output","index":0,"dtype":"float32",'
                b'"shape":[%d],"numel":%d' % (seq, seq, seq, n, n))

    def frames_of(self, one_call, sizes):
        """The file the pipe writes for one record per size, in one call
        (the tensors overwritten as soon as it returns: the pipe must not
        read them later) or in two (analyze, emit), and the hashes it kept."""
        pipe, path = self.pipe_to_file(threads=2)
        xs, live = [], []
        try:
            for seq, n in enumerate(sizes):
                x = T.det_normalish((n,), T.generator(seq), torch.float32)
                xs.append(x.clone())
                ptr, k, prefix = x.data_ptr() if n else 0, min(n, 5), self._prefix(seq, n)
                if one_call:
                    aid = pipe.record(ptr, n, 0, 1, k, prefix, seq % 2)
                    x.fill_(float("nan"))
                else:
                    aid = pipe.analyze(ptr, n, 0, 1, k)
                    pipe.emit(aid, prefix, seq % 2)
                    live.append(x)  # read by the threads until drain
                self.assertEqual(aid, seq)
            pipe.drain()
            hashes = pipe.hashes(0, len(sizes))
        finally:
            pipe.close()
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(hashes, [util.xxh3_128(bytes(T.raw_bytes(x))) for x in xs])
        return data, hashes

    def test_one_call_writes_what_two_calls_do(self):
        sizes = [0, 1, 7, 1000, 4096, 70000, 3, 1 << 18]
        one = self.frames_of(True, sizes)
        self.assertEqual(one, self.frames_of(False, sizes))
        frames = parse(one[0], sequence=False)
        self.assertEqual([f["seq"] for f in frames], list(range(len(sizes))))
        self.assertEqual([f["capture"] for f in frames[:3]], ["stats", "sample", "stats"])
        self.assertEqual(len(frames[1].payload), 4)

    def test_hash_only_records_write_nothing(self):
        pipe, path = self.pipe_to_file()
        x = torch.arange(10.0)
        try:
            self.assertEqual(pipe.record(x.data_ptr(), 10, 0, 0, 0, None, 0), 0)
            pipe.drain()
            self.assertEqual(pipe.hashes(0, 1), [util.xxh3_128(bytes(T.raw_bytes(x)))])
            self.assertEqual(pipe.take_counts(), (0, 0))
        finally:
            pipe.close()
        self.assertEqual(os.path.getsize(path), 0)

    def test_bad_records_are_refused_and_leave_nothing(self):
        pipe, path = self.pipe_to_file()
        x = torch.ones(4)
        prefix = self._prefix(0, 4)
        try:
            for args in ((x.data_ptr(), 4, 99, 1, 0, prefix, 0),  # no such dtype
                         (0, 4, 0, 1, 0, prefix, 0),  # data missing
                         (x.data_ptr(), -1, 0, 1, 0, prefix, 0),  # negative count
                         (x.data_ptr(), 4, 0, 1, 0, prefix, 2),  # no such capture
                         (x.data_ptr(), 4, 0, 1, 0, b"{" + b"x" * 65536, 0)):  # over MAX_HEADER
                with self.assertRaises(native.PipeError) as e:
                    pipe.record(*args)
                self.assertEqual(e.exception.errno, errno.EINVAL, args[1:])
                self.assertIn("capture pipe record", str(e.exception))
            # nothing was numbered or queued: the next record is analysis 0
            self.assertEqual(pipe.record(x.data_ptr(), 4, 0, 1, 0, prefix, 0), 0)
            pipe.drain()
            self.assertEqual(pipe.take_counts(), (1, 0))
        finally:
            pipe.close()
        self.assertEqual(len(_read_frames(path)), 1)


    def test_a_refused_record_fails_the_capture_clearly(self):
        # The pipeline's straight ctypes path still says what was refused.
        pl = P.Pipeline(FrameWriter(os.open(os.devnull, os.O_WRONLY)), sync=False, workers=1,
                        native=True)
        try:
            if pl.native_pipe.record_fn is None:
                self.skipTest("library without capd_pipe_record")
            x = torch.ones(4)
            for args in ((x.data_ptr(), 4, 99, 1, 0, b'{"kind":"tensor"', 0),
                         (x.data_ptr(), 4, 0, 1, 0, b'{"kind":"tensor"', 7)):
                with self.assertRaises(P.WorkerError) as e:
                    pl.native_record(*args)
                self.assertIn("capture pipe record: Invalid argument", str(e.exception))
            with self.assertRaises(P.WorkerError) as e:
                pl.native_emit(5, b'{"kind":"tensor"', 0)  # no such analysis
            self.assertIn("capture pipe emit: Invalid argument", str(e.exception))
        finally:
            pl.stop()
            os.close(pl.writer.fd)


class _Odd(torch.nn.Module):
    """Outputs of every kind the fast hooks hand back to the Python path."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.p = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        y = self.lin(x)
        deep = torch.zeros((1,) * 17)
        return ({"b": y.t(), "a": [y, torch.complex(y, y)]},
                (y.to(torch.int64), self.p, torch.ones(2, 3)[:, 1], deep), 7, None, [x, 1.5])


def _odd_model():
    return torch.nn.Sequential(torch.nn.ReLU(), _Odd(), ), (torch.randn(2, 4),)


class RecorderTest(_Base):
    """A whole capture through the pipe and through the Python pipeline."""

    def capture(self, model_name, level, use_native, pass_="forward", extra=None,
                max_bytes=None, inline=False, one_call=True, fast=False, prefix="", seq=0):
        """(frames, hashes, order, hash-only run's hashes, frames counted,
        snapshots back in the pool) of a capture of MODEL_NAME (a zoo name, or
        a function returning (model, inputs)); FAST: capd_fastrec's hooks where
        they apply (asserted on the forward captures at level stats)."""
        torch.manual_seed(0)
        if isinstance(model_name, str):
            model, inputs = zoo.build(model_name, 0, 2)
        else:
            model, inputs = model_name()
        fd, path = tempfile.mkstemp(prefix="capd-rec-")
        self.addCleanup(os.unlink, path)
        writer = FrameWriter(fd)
        pipe = P.Pipeline(writer, sync=False, workers=1, native=use_native)
        pipe.native_inline = inline
        pipe.native_one_call = one_call
        pipe.native_fast = fast
        old = P.MAX_BYTES
        if max_bytes is not None:
            P.MAX_BYTES = max_bytes
        try:
            rec = capture.Recorder(writer, pipe, level, 16, capture.PayloadBudget(1 << 40))
            rec.prefix, rec.seq = prefix, seq
            self.assertEqual(rec.native is not None, use_native)
            want_fast = fast and use_native and level == "stats" and inline is True
            if pass_ == "forward":
                model.eval()
                with torch.no_grad(), capture.Capture(model, rec) as cap:
                    self.assertEqual(cap.fast is not None, want_fast)
                    out = model(*inputs)
                    if extra is not None:
                        extra(rec)
            else:
                model.train()
                with capture.Capture(model, rec, taps=True):
                    out = model(*inputs)
                    (out.float() * 0.5).sum().backward()
            rec.sync()
            hashes = dict(rec.hashes)
            second = capture.Recorder(writer, pipe, "stats", 16, capture.PayloadBudget(0),
                                      emit=False)
            model.eval()
            with torch.no_grad(), capture.Capture(model, second) as cap:
                self.assertEqual(cap.fast is not None, fast and use_native and inline is True)
                model(*inputs)
            second.sync()
            pool_free = sum(len(v) for v in pipe.pool.free.values())
            pipe.stop()
        finally:
            P.MAX_BYTES = old
        os.close(fd)
        return _read_frames(path), hashes, rec.order, second.hashes, writer.frames, pool_free

    def assertSameHashes(self, pairs, what):
        """The pipe hashes with XXH3-128, the Python path with BLAKE2b-128:
        equal algorithms must give equal hashes, and across the two, tensors
        equal on one side must be equal on the other (a bijection)."""
        fwd, back = {}, {}
        for (alg_x, x), (alg_y, y) in pairs:
            if alg_x == alg_y:
                self.assertEqual(x, y, what)
            self.assertEqual(fwd.setdefault(x, y), y, what)
            self.assertEqual(back.setdefault(y, x), x, what)

    def assertSameCapture(self, a, b):
        fa, fb = a[0], b[0]
        self.assertEqual(len(fa), len(fb))
        pairs = []
        for x, y in zip(fa, fb):
            hx, hy = dict(x.header), dict(y.header)
            sx, sy = hx.pop("stats"), hy.pop("stats")
            pairs.append(((hx.pop("hash_alg"), hx.pop("hash")), (hy.pop("hash_alg"), hy.pop("hash"))))
            self.assertEqual(hy, dict(hx))
            # the Python pipeline's records say so; the pipe's too, bar the
            # tensors it cannot read (test_tensor_the_library_cannot_read...)
            self.assertEqual(pairs[-1][1][0], "blake2b-128")
            if x["dtype"] != "complex64":
                self.assertEqual(pairs[-1][0][0], "xxh3-128")
            for f in (x, y):
                if _whole(f):
                    self.assertEqual(f["hash"], util.record_hash(f, f.payload), f["key"])
            self.assertEqual(x.payload, y.payload, hx["key"])
            for k in ("nan", "pinf", "ninf", "zeros", "min", "max"):
                self.assertEqual(sx[k], sy[k], "%s %s" % (hx["key"], k))
            for k in ("mean", "std", "l2"):
                if sy[k] is None:
                    self.assertIsNone(sx[k])
                else:
                    self.assertLessEqual(abs(sx[k] - sy[k]), 1e-11 * abs(sy[k]) + 1e-300,
                                         "%s %s" % (hx["key"], k))
        self.assertSameHashes(pairs, "frames")
        # the hashes of the emitted run and of the hash-only run
        for i in (1, 3):
            self.assertEqual(sorted(a[i]), sorted(b[i]))
            self.assertSameHashes([((None, a[i][k]), ("", b[i][k])) for k in a[i]], "run %d" % i)
        self.assertEqual(a[2], b[2])  # record order
        self.assertEqual(a[4], b[4])  # frames counted by the writer

    def test_forward_models_both_levels(self):
        for name in ("mlp", "cnn", "transformer", "lstm", "embedding_bag"):
            for level in ("stats", "sample"):
                a = self.capture(name, level, True)
                b = self.capture(name, level, False)
                self.assertGreater(len(a[0]), 5, name)
                self.assertSameCapture(a, b)

    def test_backward_with_taps(self):
        a = self.capture("cnn", "sample", True, pass_="backward")
        b = self.capture("cnn", "sample", False, pass_="backward")
        self.assertTrue(any(f["role"] == "grad_output" for f in a[0]))
        self.assertSameCapture(a, b)

    def test_tensor_the_library_cannot_read_keeps_its_place(self):
        # A complex tensor takes the Python path inline, between pipe records.
        def extra(rec):
            rec.record("extra", 0, "forward", "output", 0,
                       torch.complex(torch.ones(3), -torch.ones(3)))
            rec.record("extra", 1, "forward", "output", 0, torch.arange(4.0))
        a = self.capture("mlp", "sample", True, extra=extra)
        b = self.capture("mlp", "sample", False, extra=extra)
        self.assertSameCapture(a, b)
        keys = [f["key"] for f in a[0]]
        self.assertEqual(keys[-2:], ["extra.0.forward.output.0", "extra.1.forward.output.0"])
        self.assertEqual([f["seq"] for f in a[0]], list(range(len(a[0]))))

    def test_inline_analysis_writes_the_same_frames(self):
        # CAPD_RUNNER_NATIVE_INLINE: the analysis in the hook, on the
        # tensor's own bytes; the frames are those of the threaded pipe, and
        # agree with the Python path's as the pipe's do (a backward pass's
        # gradients and the taps' clones included).
        for name, level, pass_ in (("cnn", "sample", "forward"), ("transformer", "stats", "forward"),
                                   ("cnn", "sample", "backward")):
            a = self.capture(name, level, True, pass_=pass_, inline=True)
            t = self.capture(name, level, True, pass_=pass_)
            b = self.capture(name, level, False, pass_=pass_)
            self.assertEqual([(f.header, f.payload) for f in a[0]],
                             [(f.header, f.payload) for f in t[0]], name)
            self.assertEqual(a[1:5], t[1:5], name)
            self.assertSameCapture(a, b)

    def test_bounded_snapshot_memory(self):
        # With room for almost nothing in flight, the hooks wait for the pipe
        # and every snapshot still comes back to the pool (the threads alone,
        # and the threads for the tensors over an inline bound).
        b = self.capture("cnn", "stats", False)
        for inline in (False, 256):
            a = self.capture("cnn", "stats", True, max_bytes=1, inline=inline)
            self.assertSameCapture(a, b)
            self.assertGreater(a[5], 0)

    def test_one_call_writes_the_frames_of_two_calls(self):
        # capd_pipe_record (one foreign call a record, the analysis in the
        # hook; for some tensors only, by size) writes byte for byte the
        # frames of the two-call path (snapshot in the runner's pool,
        # analyze, emit), with the same hashes and record order, forward and
        # backward (taps' clones and gradients included).
        cases = [("cnn", "sample", "forward"), ("transformer", "stats", "forward"),
                 ("lstm", "sample", "forward"), ("cnn", "sample", "backward")]
        try:
            zoo.build("resnet18", 0, 1)
            cases.append(("resnet18", "stats", "forward"))
        except zoo.ModelError:
            pass
        for name, level, pass_ in cases:
            old = self.capture(name, level, True, pass_=pass_, one_call=False)
            for inline in (True, 4096):
                new = self.capture(name, level, True, pass_=pass_, inline=inline)
                what = "%s %s %s inline=%s" % (name, level, pass_, inline)
                self.assertGreater(len(new[0]), 5, what)
                self.assertEqual([(f.header, f.payload) for f in new[0]],
                                 [(f.header, f.payload) for f in old[0]], what)
                self.assertEqual(new[1:5], old[1:5], what)

    def test_fast_hooks_write_the_frames_of_the_python_hooks(self):
        # capd_fastrec (the module hooks in C, where it is built for this
        # interpreter) writes byte for byte the frames of the Python hooks
        # (the one-call path), with the same hashes, record order and frame
        # counts, hash-only runs included; what it leaves to the Python path
        # (a parameter, a view, a complex tensor, a dict, a tensor over 16
        # dimensions, the sample level) keeps its place and its seq.
        if native.fastrec() is None:
            self.skipTest("capd_fastrec is not built for this interpreter")
        cases = [("mlp", "stats"), ("cnn", "stats"), ("transformer", "stats"),
                 ("lstm", "stats"), ("embedding_bag", "stats"), ("cnn", "sample"),
                 (_odd_model, "stats"), (_odd_model, "sample")]
        try:
            zoo.build("resnet18", 0, 1)
            cases.append(("resnet18", "stats"))
        except zoo.ModelError:
            pass
        for name, level in cases:
            for prefix, seq in (("", 0), ("ref.float64/", 17)):
                old = self.capture(name, level, True, inline=True, prefix=prefix, seq=seq)
                new = self.capture(name, level, True, inline=True, fast=True, prefix=prefix,
                                   seq=seq)
                what = "%s %s %r" % (name, level, prefix)
                self.assertGreater(len(new[0]), 5, what)
                self.assertEqual([(f.header, f.payload) for f in new[0]],
                                 [(f.header, f.payload) for f in old[0]], what)
                self.assertEqual(new[1:5], old[1:5], what)
                self.assertEqual(new[0][0]["seq"], seq, what)

    def test_fast_hooks_refused_record_fails_the_capture_clearly(self):
        # A call the pipe refuses (here a stand-in for capd_pipe_record and
        # capd_pipe_emit that refuses everything) fails the capture with
        # the pipeline's own message, as the Python hooks' calls do.
        fast = native.fastrec()
        if fast is None:
            self.skipTest("capd_fastrec is not built for this interpreter")
        import ctypes
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        refuse_record = ctypes.CFUNCTYPE(i64, vp, vp, i64, ctypes.c_int, ctypes.c_int, i64)(
            lambda *a: -errno.EINVAL)
        refuse_emit = ctypes.CFUNCTYPE(ctypes.c_int, vp, i64, vp, i64, ctypes.c_int)(
            lambda *a: -errno.EINVAL)
        pl = P.Pipeline(FrameWriter(os.open(os.devnull, os.O_WRONLY)), sync=False, workers=1,
                        native=True)
        try:
            rec = capture.Recorder(pl.writer, pl, "stats", 16, capture.PayloadBudget(1 << 40))
            model = torch.nn.Linear(3, 3)
            cap = capture.Capture(model, rec)
            self.assertIsNotNone(rec.fast_hooks(cap))
            addr = [ctypes.cast(f, vp).value for f in (refuse_record, refuse_emit)]
            hooks = fast.hooks(rec, cap, capture._CODES, capture._PREFIX_TAILS,
                               capture._prefix_tail, pl.native_failed, capture._flatten,
                               torch.Tensor, torch.strided, pl.native_pipe._p, *addr)
            with self.assertRaises(P.WorkerError) as e:
                hooks.pre(model, (torch.ones(2, 3),))
            self.assertIn("capture pipe record: Invalid argument", str(e.exception))
            # a tensor already analysed: its second record's emit is refused
            # when the hooks write their deferred records
            x = torch.ones(2, 3)
            real = rec.fast_hooks(cap)
            real.pre(model, (x,))
            real.flush()
            hooks.post(model, (x,), x)
            self.assertIn("capture pipe emit", str(self._raises(hooks.flush)))
        finally:
            pl.stop()
            os.close(pl.writer.fd)

    def _raises(self, fn, *args):
        with self.assertRaises(P.WorkerError) as e:
            fn(*args)
        return e.exception

    def test_level_full_stays_on_the_python_pipeline(self):
        fd, path = tempfile.mkstemp()
        os.close(fd)
        os.unlink(path)
        pipe = P.Pipeline(FrameWriter(os.open(os.devnull, os.O_WRONLY)), sync=False, workers=1,
                          native=True)
        rec = capture.Recorder(pipe.writer, pipe, "full", 16, capture.PayloadBudget(1 << 30))
        self.assertIsNone(rec.native)
        pipe.stop()


class CellTest(_Base):
    """A real runner process: the same cell with and without the library."""

    def test_cell_frames_match(self):
        results = []
        for env in ({}, {"CAPD_RUNNER_NATIVE": ""}):
            r = util.run(make_spec(model="cnn", pass_="backward", capture="sample",
                                   iterations=1), env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            results.append(r.frames)
        fp = [f for f in results[0] if f.kind == "env"][0]["fingerprint"]["stats_engine"]
        self.assertEqual(fp["name"], "native")
        fp = [f for f in results[1] if f.kind == "env"][0]["fingerprint"]["stats_engine"]
        self.assertEqual(fp, {"name": "torch", "reason": "CAPD_RUNNER_NATIVE not set"})
        ta = [f for f in results[0] if f.kind == "tensor"]
        tb = [f for f in results[1] if f.kind == "tensor"]
        self.assertEqual([(f["key"], f.payload) for f in ta], [(f["key"], f.payload) for f in tb])
        self.assertEqual(set(f["hash_alg"] for f in ta), {"xxh3-128"})
        self.assertEqual(set(f["hash_alg"] for f in tb), {"blake2b-128"})
        for f in ta + tb:
            if _whole(f):
                self.assertEqual(f["hash"], util.record_hash(f, f.payload), f["key"])
        nd = [[f["keys"] for f in fr if f.kind == "nondeterministic"] for fr in results]
        self.assertEqual(nd[0], nd[1])

    def test_bad_library_falls_back_and_says_why(self):
        d = util.tempdir()
        bad = os.path.join(d, "libcapd_analysis.so")
        with open(bad, "w") as f:
            f.write("not a library")
        r = util.run(make_spec(model="mlp", iterations=1), env={"CAPD_RUNNER_NATIVE": bad})
        self.assertEqual(r.returncode, 0, r.stderr)
        fp = [f for f in r.frames if f.kind == "env"][0]["fingerprint"]["stats_engine"]
        self.assertEqual(fp["name"], "torch")
        self.assertIn("cannot load " + bad, fp["reason"])
        self.assertTrue(any(f.kind == "tensor" for f in r.frames))


if __name__ == "__main__":
    unittest.main()


class PrefixCacheTest(unittest.TestCase):
    """The header prefix of a record comes from a cache of its text after
    "seq": the same bytes as frames.tensor_header_prefix, for every seq,
    across the cache's emptying at its bound."""

    def test_cached_prefix_is_the_formatted_one(self):
        import types
        from capd_runner import frames as F
        saved = capture.PREFIX_TAILS_MAX
        capture.PREFIX_TAILS_MAX = 3
        capture._PREFIX_TAILS.clear()
        try:
            rec = types.SimpleNamespace(emit=True, seq=7, level="stats")
            tensors = [torch.zeros(2, 3), torch.zeros(5, dtype=torch.float64),
                       torch.zeros(2, 3, dtype=torch.int32), torch.zeros(())]
            cases = [("m.0.forward.input.0", "m", 0, "forward", "input", 0, None),
                     ("m\u00e9.1.backward.param_grad.w", "m\u00e9", 1, "backward",
                      "param_grad", "w", None),
                     ("m.0.forward/op.aten::add.2.output.0", "m", 0, "forward", "output", 0,
                      ("aten::add", 2))]
            for rnd in range(3):  # hits, and misses after each emptying
                for t in tensors:
                    for key, module, call, phase, role, index, op in cases:
                        seq = rec.seq
                        prefix, kind = capture.Recorder._prefix(rec, key, module, call, phase,
                                                                role, index, t, op)
                        want = F.tensor_header_prefix(seq, key, module, call, phase, role,
                                                      index, T.dtype_name(t.dtype), t.shape,
                                                      t.numel(), op).encode("ascii")
                        self.assertEqual(prefix, want)
                        self.assertEqual(kind, 0)
                        self.assertEqual(rec.seq, seq + 1)
                        self.assertLessEqual(len(capture._PREFIX_TAILS), 3)
        finally:
            capture.PREFIX_TAILS_MAX = saved
            capture._PREFIX_TAILS.clear()
