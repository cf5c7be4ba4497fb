"""User models for tests/test_prefork.c: cells that behave badly inside a
prefork child (crash, hang) and one that behaves."""
import os
import signal
import time

import torch


class _Linear(torch.nn.Module):
    def __init__(self, action=None):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.action = action

    def forward(self, x):
        if self.action == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.action == "hang":
            time.sleep(3600)
        return self.fc(x)


def _make(action):
    def factory(seed, batch, dtype):
        with torch.no_grad():
            m = _Linear(action)
            m.fc.weight.copy_(torch.arange(16, dtype=torch.float32).reshape(4, 4) / 16)
            m.fc.bias.zero_()
        return m, torch.arange(batch * 4, dtype=torch.float32).reshape(batch, 4) / 8
    return factory


ok = _make(None)
segv = _make("segv")
hang = _make("hang")
