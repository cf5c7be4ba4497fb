#!/bin/sh
# Installs everything capd needs to build, test and run its main job on a
# Debian 12 (bookworm) or 13 (trixie) machine, and says which release it
# found. Idempotent: packages already present are skipped, and apt-get update
# runs only when something is missing.
#
# Package names that differ by release are chosen here: the compiler-rt of
# the installed clang (libclang-rt-N-dev, N = clang's major version: 14 on
# bookworm, 19 on trixie) and Python 3.11 for the official-build lane
# (scripts/official-torch.sh; bookworm's own Python, a package that trixie
# images keep from bookworm). The pinned clang-format is not a Debian
# package: scripts/format installs it from PyPI (requirements/clang-format.txt),
# the same version whatever the release ships.
set -eu
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

# The release, from /etc/os-release (VERSION_CODENAME), else /etc/debian_version.
codename=""
[ -r /etc/os-release ] && codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
debver=$(cat /etc/debian_version 2>/dev/null || echo unknown)
if [ -z "$codename" ]; then
    case "$debver" in
    12*) codename=bookworm ;;
    13*) codename=trixie ;;
    *) codename=unknown ;;
    esac
fi
case "$codename" in
bookworm | trixie) echo "capd: install-deps: Debian $debver ($codename)" >&2 ;;
*) echo "capd: install-deps: Debian $debver ($codename): not a release capd is tested on" \
    "(12 bookworm, 13 trixie); trying bookworm's package names" >&2 ;;
esac

updated=""
install_missing() {
    missing=""
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing="$missing $p"
        fi
    done
    [ -z "$missing" ] && return 0
    echo "capd: installing:$missing" >&2
    if [ -z "$updated" ]; then
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
        updated=1
    fi
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
}

# python3-dev: the headers of Debian's Python, for the runner's optional
# CPython extension capd_fastrec (docs/runner.md).
# python3-venv: the virtual environment of the pinned clang-format.
# groff-base + man-db: tests/test_deploy.c renders the man pages (docs/man/).
# libamdhip64-dev: the HIP runtime headers for the GPU probe capd-gpuinfo
# (docs/gpu.md); it runs without an AMD GPU and then reports none.
# openssl: tests/test_tls.c makes a self-signed certificate with it at run
# time (libmicrohttpd's TLS itself is GnuTLS, part of libmicrohttpd-dev).
# slurm-wlm + munge: tests/slurm/cluster.sh runs a one-node Slurm for
# tests/test_slurm_cluster.c (docs/scale.md).
# chromium: the dashboard's browser tests (tests/browser, with playwright-core
# from npm, which needs Node.js 20 or newer; bookworm's own nodejs is older,
# so it is only installed when there is no node at all).
# clang: the libFuzzer targets (scripts/fuzz), with its compiler-rt below.
PKGS="build-essential cmake pkg-config clang
libmicrohttpd-dev libjansson-dev libsqlite3-dev libuv1-dev libcriterion-dev
libcurl4-openssl-dev python3-yaml libzstd-dev libxxhash-dev
python3-torch python3-torchvision python3-torchaudio python3-numpy python3-dev python3-venv
sqlite3 curl groff-base man-db libamdhip64-dev openssl chromium slurm-wlm munge"
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
# Python 3.11 for the official lane: bookworm's python3 is 3.11; trixie has
# no python3.11 of its own, so there it must already be installed (the
# project's images keep it) or be given as CAPD_OFFICIAL_BASE_PYTHON.
if [ "$codename" = bookworm ] || [ "$codename" = unknown ]; then
    PKGS="$PKGS python3.11 python3.11-venv"
fi
# shellcheck disable=SC2086
install_missing $PKGS

# The compiler-rt (sanitizers, libFuzzer) of the clang that is installed.
clang_major=$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9][0-9]*\)\..*/\1/p' | head -1)
if [ -n "$clang_major" ]; then
    install_missing "libclang-rt-$clang_major-dev"
else
    echo "capd: install-deps: clang --version says no version; the fuzz targets will be skipped" >&2
fi
