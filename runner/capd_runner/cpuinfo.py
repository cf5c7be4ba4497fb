"""/proc/cpuinfo as the kernel lists it, without torch: what the fingerprint
(fingerprint.cpu_info), the BLAS readers (libs.cpu_vendor), the runner's
tests and bench/report.py read of the CPU."""


def first_processor(path="/proc/cpuinfo"):
    """The fields of the first processor listed in PATH by lower-case name
    ("model name", "vendor_id", "flags", ...), values stripped; {} where
    PATH cannot be read."""
    try:
        with open(path, "r") as f:
            text = f.read()
    except OSError:
        return {}
    first = {}
    for line in text.split("\n"):
        if not line.strip():
            if first:
                break
            continue
        k, sep, v = line.partition(":")
        if sep:
            first.setdefault(k.strip().lower(), v.strip())
    return first
