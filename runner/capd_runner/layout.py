"""The address-space layout of the runner's processes: fixed, not drawn anew
by each exec.

A process's speed depends on where its code, heap and stacks lie (cache
sets, 4K aliasing, TLB reach): with address-space layout randomisation
(ASLR) every exec draws a layout, and every fork keeps its parent's. A
cell's timing processes are forks of one template per side (capd_runner/
timing.py), so all of a side's processes share one draw: measured here
(Debian's torch 1.13, one transformer layer, 8 templates of 5 forks), the
template means differed by 0.9% (sd) where the processes of one template
differed by 0.56%, which the pairs' test, blind to the draw, takes for a
difference between builds. With the layout fixed (what ``setarch -R`` does)
the template means differed by 0.30% and the processes by 0.33%:
identical builds time the same layout, and a build that moves its own
code or data is timed at the layout it gets (docs/compare.md, "Address
layout").

``fix`` runs first in each of the runner's entry points (a cell, a
zygote, a timing template or process): where the process's personality
lacks ADDR_NO_RANDOMIZE it sets it and execs the same command line in the
environment the process was exec'd with, so the interpreter starts again
(tens of milliseconds, before torch is imported) in a fixed layout; its
children inherit the personality. Where the kernel refuses (a seccomp
profile, as Docker's default one, allows personality() only for a few
values) the process goes on as it is, and ``state`` says why: the
fingerprint records it (``address_layout``), so a comparison of a fixed
and a randomised side shows it in the environment diff.
"""

import os
import sys

ADDR_NO_RANDOMIZE = 0x0040000
QUERY = 0xFFFFFFFF
# Why fix() left this process's layout randomised; None where it did not.
_WHY = None


def _personality(persona):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.personality.restype = ctypes.c_int
    libc.personality.argtypes = [ctypes.c_ulong]
    r = libc.personality(persona)
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def exec_environ():
    """The environment this process was exec'd with (before the
    interpreter's own additions, such as PEP 538's LC_CTYPE), from /proc;
    os.environ where that fails."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return dict(os.environ)
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[os.fsdecode(k)] = os.fsdecode(v)
    return env


def fix(module, argv):
    """Execs this process again (python -m MODULE ARGV) with a fixed
    layout where it has none and the kernel lets it; returns when the
    layout is fixed already or cannot be."""
    global _WHY
    if not sys.platform.startswith("linux"):
        _WHY = "not Linux: the layout is the platform's"
        return
    try:
        cur = _personality(QUERY)
    except (OSError, AttributeError) as e:
        _WHY = "personality() cannot be read: %s" % e
        return
    if cur & ADDR_NO_RANDOMIZE:
        return
    try:
        _personality(cur | ADDR_NO_RANDOMIZE)
    except OSError as e:
        _WHY = "the kernel refused personality(ADDR_NO_RANDOMIZE): %s" % e.strerror
        return
    cmd = list(getattr(sys, "orig_argv", None) or [sys.executable, "-m", module] + list(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, cmd, exec_environ())
    except OSError as e:
        _personality(cur)
        _WHY = "cannot exec the interpreter again: %s" % e


def state():
    """``fixed``, or ``randomized: WHY``."""
    if _WHY is not None:
        return "randomized: " + _WHY
    try:
        if _personality(QUERY) & ADDR_NO_RANDOMIZE:
            return "fixed"
    except OSError as e:
        return "randomized: personality() cannot be read: %s" % e
    # fix() was not called in this process (a library use of the runner)
    return "randomized: the runner's entry point did not fix it"
