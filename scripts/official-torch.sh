#!/bin/sh
# scripts/official-torch.sh - the official-build lane: a virtual environment
# with PyTorch's own wheel (MKL, oneDNN, Inductor), torchvision, timm and
# transformers, every package pinned in requirements/official-torch.txt.
# Prints the lane's interpreter on stdout, for capd to register as a build
# (POST /v1/builds {"python": ...}); says what it does on stderr.
#
# Idempotent: with the lane complete it checks it and prints the path in a
# few seconds; a changed requirements file makes the lane anew (about 1.5
# minutes from this machine's local wheels). Where it lives: scripts/venv.sh
# (/var/cache/capd/official-torch as root). The base interpreter is a
# Python 3.11 (the wheels are cp311): CAPD_OFFICIAL_BASE_PYTHON, else
# /usr/bin/python3.11 (Debian's, with python3.11-venv). It exits non-zero,
# saying why, where the lane cannot be made (another architecture, no Python
# 3.11, a wheel that pip cannot get).
set -eu
cd "$(dirname "$0")/.."
. scripts/venv.sh

arch=$(uname -m)
if [ "$arch" != x86_64 ]; then
    echo "capd: official lane: the pinned wheels are for x86_64, this machine is $arch" >&2
    exit 2
fi
base=${CAPD_OFFICIAL_BASE_PYTHON:-/usr/bin/python3.11}
if [ ! -x "$base" ]; then
    echo "capd: official lane: no Python 3.11 at $base (install Debian's python3.11 and" >&2
    echo "capd: python3.11-venv, or set CAPD_OFFICIAL_BASE_PYTHON to a Python 3.11 that" >&2
    echo "capd: the cells' user can run)" >&2
    exit 2
fi
lane="$(capd_dev_dir)/official-torch"
capd_venv "$lane" "$base" requirements/official-torch.txt || exit 1
# The lane must be what it claims: the official build, with MKL.
if ! info=$("$lane/bin/python" -c '
import torch, torchvision, timm, transformers
assert torch.backends.mkl.is_available(), "no MKL in this torch"
blas = [s for s in torch.__config__.show().replace(",", "\n").split() if s.startswith("BLAS_INFO=")]
print("torch", torch.__version__, (blas or ["BLAS_INFO=?"])[0], "torchvision", torchvision.__version__,
      "timm", timm.__version__, "transformers", transformers.__version__)
' 2>&1); then
    echo "$info" >&2
    echo "capd: official lane at $lane does not import; remove it to make it anew" >&2
    exit 1
fi
echo "capd: official lane: $info" >&2
echo "$lane/bin/python"
