#!/bin/sh
# Configures and builds capd into BUILD_DIR (default ./build).
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# CAPD_BUILD_TARGETS (space-separated) builds only those targets.
set -eu
cd "$(dirname "$0")/.."
dir=${1:-build}
[ $# -gt 0 ] && shift
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
# shellcheck disable=SC2086
cmake --build "$dir" -j"$(nproc)" ${CAPD_BUILD_TARGETS:+--target $CAPD_BUILD_TARGETS}
