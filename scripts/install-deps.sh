#!/bin/sh
# Installs everything capd needs to build, test and run its main job on a
# Debian (bookworm) machine. Idempotent: packages already present are skipped
# by apt itself, and apt-get update runs only when something is missing.
set -eu
# clang + libclang-rt-14-dev: the libFuzzer targets (scripts/fuzz).
# python3-dev: the headers of Debian's Python, for the runner's optional
# CPython extension capd_fastrec (docs/runner.md).
# groff-base + man-db: tests/test_deploy.c renders the man pages (docs/man/).
# libamdhip64-dev: the HIP runtime headers for the GPU probe capd-gpuinfo
# (docs/gpu.md); it runs without an AMD GPU and then reports none.
PKGS="build-essential cmake pkg-config clang-format clang libclang-rt-14-dev
libmicrohttpd-dev libjansson-dev libsqlite3-dev libuv1-dev libcriterion-dev
libcurl4-openssl-dev python3-yaml libzstd-dev libxxhash-dev python3-torch python3-torchvision python3-torchaudio python3-numpy python3-dev sqlite3 curl
groff-base man-db
libamdhip64-dev
openssl
chromium
slurm-wlm munge"
# openssl: tests/test_tls.c makes a self-signed certificate with it at run
# time (libmicrohttpd's TLS itself is GnuTLS, part of libmicrohttpd-dev).
# slurm-wlm + munge: tests/slurm/cluster.sh runs a one-node Slurm for
# tests/test_slurm_cluster.c (docs/scale.md).
# chromium: the dashboard's browser tests (tests/browser, with playwright-core
# from npm, which needs Node.js 20 or newer; Debian's own nodejs is older, so
# it is only installed when there is no node at all).
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "capd: installing:$missing" >&2
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
fi
