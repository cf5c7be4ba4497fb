"""The records of option target_op's one call (docs/runner.md, "Targeted
capture"): an op call (opcapture.py) or a module call's forward
(``<fqn>.<call>.forward``: ModuleTarget, from capture.Capture's hooks).

TargetRecords is capture.Recorder's way of recording a tensor whole,
whatever the cell's capture level, within capd's payload limits: a mixin of
capture.Recorder, whose state (pipeline, writer, budget, the snapshot and
record jobs) it uses.
"""

import re

import torch

# A module call's key up to the role: <fqn>.<call>.<phase>
_MODULE_CALL = re.compile(r"^(?P<fqn>.+)\.(?P<call>[0-9]+)\.(?P<phase>forward|backward)$")


class TargetRecords(object):
    """capture.Recorder's record_full and its budget (_decide_full)."""

    def record_full(self, module, call, phase, role, index, t, op=None):
        """One record with the whole tensor as its payload whatever the
        cell's capture level: the target call of option target_op, ``op``
        its (name, occurrence, op_call text) for an op call (opcapture.py),
        None for a module call's input or output (ModuleTarget), whose key
        and header are those Recorder.record gives it.

        Always the Python path, in this recorder and in the determinism
        run's alike (their hashes are of one algorithm and agree): a
        snapshot of its own, outside the analysis cache, so no other record
        changes. Within the payload limits capd enforces (max_payload_bytes
        in all, max_one_payload_bytes each); past them what _decide gives,
        with a note."""
        from capd_runner import capture as C

        module, key = self._begin(module, call, phase, role, index, op)
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



def module_target(target, rec):
    """A ModuleTarget for option target_op TARGET when it names a module
    call (no ``/op.`` in it: opcapture.py has those), else None; None too
    for a recorder with a prefix (the float64 reference targets nothing)."""
    if not target or "/op." in target or rec.prefix:
        return None
    return ModuleTarget(target, rec)


class ModuleTarget(object):
    """Option target_op naming a module call, ``<fqn>.<call>.forward``:
    capture.Capture records that call's inputs and outputs with
    Recorder.record_full (at() says when). At the end of the capture run
    (stop) a note says when it never ran, or that a backward phase cannot
    be targeted (a module call's gradients come from its taps, with no
    whole-tensor records)."""

    def __init__(self, target, rec):
        self.target = target
        self.rec = rec
        m = _MODULE_CALL.match(target)
        self.phase = m.group("phase") if m else None
        self.where = (m.group("fqn"), int(m.group("call"))) if m else None
        self.hit = False
        self.noted = False

    def at(self, fqn, call):
        """Whether the forward call CALL of module FQN is the target."""
        if self.phase != "forward" or self.where != (fqn, call):
            return False
        self.hit = True
        return True

    def stop(self):
        if self.noted or self.hit or not self.rec.emit:
            return
        self.noted = True
        if self.phase == "backward":
            msg = ("target_op %s: a module call's backward phase cannot be targeted, only "
                   "<fqn>.<call>.forward; nothing targeted" % self.target)
        else:
            msg = "target_op %s never ran in this cell" % self.target
        rec = self.rec
        rec.pipeline.note(lambda: rec.writer.note("warn", msg))
