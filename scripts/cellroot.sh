# scripts/cellroot.sh - sourced by scripts/demo and scripts/test, right after
# they cd to the checkout: makes sure capd's cells can read this tree.
#
# capd started as root runs its cells as an unprivileged user (run_as_user,
# default nobody; docs/security.md), never as root. Those cells must read
# what lives in the checkout: the runner package (runner/), the built
# helpers and native library (build/), the example builds (examples/). A
# clone in a directory only its owner may enter (mode 0700, like /root, the
# home of root on Debian) denies them all, and capd rightly refuses to start
# cells there. So when the script runs as root and the cell user cannot read
# this tree, it works from a copy of the tree that the cell user can read,
# under /var/tmp/capd-stage-0/ (CAPD_STAGE_DIR overrides), and says so: the
# tracked and untracked, not ignored files, refreshed on every run (a build
# directory in the copy is kept, so later builds are incremental).
# Everything else is unchanged: capd keeps its cell user and keeps refusing
# data dirs and builds that user cannot reach.
#
# Usage (POSIX sh): . scripts/cellroot.sh; cellroot_enter "$0" "$@"

# Whether the cell user (nobody) can read PATH. Only root switches users.
cellroot_reachable() {
    [ "$(id -u)" -ne 0 ] && return 0
    setpriv --reuid=65534 --regid=65534 --clear-groups -- test -r "$1" 2>/dev/null
}

# The files of the checkout, NUL-separated: what git tracks plus untracked
# files it does not ignore; every file but build outputs without git.
cellroot_files() {
    if [ -d .git ] || [ -f .git ]; then
        git ls-files -z --cached --others --exclude-standard
    else
        find . -path ./build -prune -o -path './build-*' -prune -o -type f -print0
    fi
}

cellroot_enter() {
    script=$1
    shift
    [ -n "${CAPD_CELLROOT:-}" ] && return 0
    cellroot_reachable "$(pwd)/runner/capd_runner/__init__.py" && return 0
    stage=${CAPD_STAGE_DIR:-/var/tmp/capd-stage-$(id -u)}
    dest="$stage/$(pwd | sha256sum | cut -c1-12)"
    echo "capd: cells run as nobody when capd runs as root, and nobody cannot read $(pwd)" >&2
    echo "capd: (a directory only its owner may enter); working from a copy at $dest" >&2
    mkdir -p "$dest"
    chmod 0755 "$stage" "$dest"
    find "$dest" -mindepth 1 -maxdepth 1 ! -name 'build*' -exec rm -rf {} +
    cellroot_files | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$dest"
    chmod -R a+rX "$dest"
    cellroot_reachable "$dest/runner/capd_runner/__init__.py" || {
        echo "capd: the copy at $dest is not readable by nobody either (set CAPD_STAGE_DIR)" >&2
        exit 1
    }
    CAPD_CELLROOT="$dest" exec "$dest/scripts/$(basename "$script")" "$@"
}
