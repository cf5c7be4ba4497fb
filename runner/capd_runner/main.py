"""Entry point: ``python -m capd_runner`` (a cell, spec from $CAPD_CELL_SPEC)
or ``python -m capd_runner --list-models``."""

import json
import sys
import traceback

from capd_runner import PROTOCOL, RUNNER_NAME, __version__, layout

USAGE = """usage: python -m capd_runner              run the cell named by $CAPD_CELL_SPEC
       python -m capd_runner --list-models  print the model zoo as JSON
       python -m capd_runner --version
       python -m capd_runner --timing-template CMD_FD RES_FD
                                            (a paired cell's control-build template)
       python -m capd_runner --timing-process INDEX RES_FD [--control] [--profile]
                                            (one timing process, where it cannot be forked;
                                            --profile: the profiled one)
Frames go to the spec's frame_fd (3); see docs/protocol.md and docs/runner.md."""

EXIT_USAGE = 2
# What may follow --timing-process INDEX RES_FD (capd_runner/timing.py _spawn).
PROCESS_FLAGS = ([], ["--control"], ["--profile"], ["--control", "--profile"])


def main(argv):
    layout.fix("capd_runner", argv)  # first: it may exec this process again
    if argv:
        if argv[0] == "--list-models" and len(argv) == 1:
            from capd_runner import catalog
            sys.stdout.write(json.dumps(catalog.list_models(), indent=1) + "\n")
            return 0
        if argv[0] == "--version" and len(argv) == 1:
            sys.stdout.write("%s (protocol %d)\n" % (RUNNER_NAME, PROTOCOL))
            return 0
        if (argv[0] == "--timing-template" and len(argv) == 3 and argv[1].isdigit()
                and argv[2].isdigit()):
            from capd_runner import timing
            return timing.template_main(int(argv[1]), int(argv[2]))
        if (argv[0] == "--timing-process" and len(argv) in (3, 4, 5) and argv[1].isdigit()
                and argv[2].isdigit() and argv[3:] in PROCESS_FLAGS):
            from capd_runner import timing
            return timing.process_main(int(argv[1]), int(argv[2]), "--control" in argv[3:],
                                       "--profile" in argv[3:])
        if argv[0] in ("-h", "--help"):
            sys.stdout.write(USAGE + "\n")
            return 0
        sys.stderr.write(USAGE + "\n")
        return EXIT_USAGE

    import faulthandler
    faulthandler.enable()  # a segfault in a kernel leaves a Python stack in the log

    from capd_runner import spec as specmod
    from capd_runner.frames import FrameWriter

    try:
        spec = specmod.load()
        error = None
        fd = spec.frame_fd
    except specmod.SpecError as e:
        spec = None
        error = str(e)
        fd = specmod.peek_frame_fd()

    writer = FrameWriter(fd)
    try:
        writer.hello(PROTOCOL, RUNNER_NAME)
    except OSError as e:
        sys.stderr.write("capd_runner %s: cannot write frames to fd %d: %s\n" % (__version__, fd, e))
        return EXIT_USAGE
    if error is not None:
        writer.end("failed", error)
        return 1

    from capd_runner import cell
    try:
        return cell.run(spec, writer)
    except Exception as e:  # a runner bug: still say so in the frames
        if not writer.ended:
            try:
                writer.flush()
                writer.note("error", traceback.format_exc())
                writer.end("failed", "runner error: %s: %s" % (type(e).__name__, e))
            except Exception:
                pass
        traceback.print_exc()
        return 1
