"""The records of option target_op's one op call (opcapture.py; docs/runner.md,
"Targeted capture"): capture.Recorder's way of recording a tensor whole,
whatever the cell's capture level, within capd's payload limits. A mixin of
capture.Recorder, whose state (pipeline, writer, budget, the snapshot and
record jobs) it uses.
"""

import torch


class TargetRecords(object):
    """capture.Recorder's record_full and its budget (_decide_full)."""

    def record_full(self, module, call, phase, role, index, t, op):
        """One record with the whole tensor as its payload whatever the
        cell's capture level: the target call of option target_op
        (opcapture.py), ``op`` its (name, occurrence, op_call text).

        Always the Python path, in this recorder and in the determinism
        run's alike (their hashes are of one algorithm and agree): a
        snapshot of its own, outside the analysis cache, so no other record
        changes. Within the payload limits capd enforces (max_payload_bytes
        in all, max_one_payload_bytes each); past them what _decide gives,
        with a note."""
        from capd_runner import capture as C

        if self.fast is not None:
            self.fast.flush()
        module = self.prefix + module
        key = "%s.%d.%s/op.%s.%d.%s.%s" % (module, call, phase, op[0], op[1], role, index)
        with self.lock:
            if t.dim() > C.MAX_NDIM:
                if self.emit:
                    msg = ("%s has %d dimensions, more than the protocol's %d: not recorded"
                           % (key, t.dim(), C.MAX_NDIM))
                    self.pipeline.note(lambda: self.writer.note("warn", msg))
                return
            p = self._plain(t)
            snap = torch.empty(p.shape, dtype=p.dtype)
            snap.copy_(p)
            an = C._Analysis()
            an.snapshot = snap.view(-1)
            an.keep = True  # _emit reads it; dropped with the job
            an.want_sample = True
            if not self.emit:
                job = C._RecordJob(self, key, None, an, None)
            else:
                header = (self.seq, key, module, call, phase, role, index, t.dtype, t.shape,
                          t.numel(), op)
                self.seq += 1
                job = C._RecordJob(self, key, header, an, self._decide_full(key, t))
            if self.native is None:
                self.pipeline.submit(job, snap.numel() * snap.element_size())
                return
            # After everything the pipe has queued, like a tensor it cannot read.
            self.pipeline.drain()
            job.compute()
            job.emit()
            self.writer.flush()

    def _decide_full(self, key, t):
        need = t.numel() * t.element_size()
        if need <= self.budget.one and self.budget.used + need <= self.budget.limit:
            self.budget.used += need
            return "full"
        kind = self._decide(key, t)
        msg = ("target_op: %s needs %d bytes, more than the payload limits allow "
               "(max_one_payload_bytes %d, max_payload_bytes %d, %d used): recorded at %s"
               % (key, need, self.budget.one, self.budget.limit, self.budget.used, kind))
        self.pipeline.note(lambda: self.writer.note("warn", msg))
        return kind

