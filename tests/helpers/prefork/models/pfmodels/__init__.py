"""User models for tests/test_prefork.c: cells that behave badly inside a
prefork child (crash, hang, allocate past their memory limit) and one that
behaves."""
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
        if self.action == "memhog":
            # 2 GiB in 16 MiB tensors, every page written, 5 ms apart so a
            # 100 ms watchdog sees it grow; a cell under its limit never
            # gets to the end.
            hold = []
            for _ in range(128):
                hold.append(torch.ones(4 << 20))
                time.sleep(0.005)
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
memhog = _make("memhog")


def _facts():
    """What isolation a cell process has, printed to its log."""
    import json
    import resource

    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    fds = {}
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            fds[fd] = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            pass
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    sig = ctypes.c_int(-1)
    libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    return {
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
        "uid": os.getuid(), "gid": os.getgid(), "no_new_privs": status.get("NoNewPrivs"),
        "pdeathsig": sig.value, "cwd_is_scratch": os.getcwd() == os.path.dirname(
            os.environ.get("CAPD_CELL_SPEC", "")),
        "rlimits": dict((n, resource.getrlimit(getattr(resource, "RLIMIT_" + n))[0])
                        for n in ("AS", "CPU", "NOFILE", "NPROC", "CORE")),
        "sockets": sorted(fd for fd, t in fds.items() if t.startswith("socket:")),
        "fds_0_3": [fds.get(str(i), "")[:5] for i in range(4)],
        "env_width": os.environ.get("ATEN_CPU_CAPABILITY"),
    }


def facts(seed, batch, dtype):
    import json
    print("CAPD-FACTS " + json.dumps(_facts(), sort_keys=True), flush=True)
    return ok(seed, batch, dtype)
