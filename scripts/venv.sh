# scripts/venv.sh - sourced by the scripts that need a Python virtual
# environment of the project's own: the official-build lane
# (scripts/official-torch.sh) and the pinned clang-format (scripts/format).
#
# Each environment holds exactly what one file of requirements/ pins. It
# lives outside the checkout, so that a fresh clone, the copy
# scripts/cellroot.sh makes and every later run share it:
#   CAPD_DEV_DIR, when set;
#   /var/cache/capd as root (readable by the cells' user, nobody);
#   $XDG_CACHE_HOME/capd (~/.cache/capd) as anyone else, whose cells run as
#   themselves.
# An environment is complete when its stamp (the requirements file's digest,
# the base interpreter and its version) matches; a run that finds it
# complete does nothing, one that finds it incomplete or stale makes it anew.
#
# Usage (POSIX sh): . scripts/venv.sh; capd_venv DIR PYTHON REQUIREMENTS

capd_dev_dir() {
    if [ -n "${CAPD_DEV_DIR:-}" ]; then
        echo "$CAPD_DEV_DIR"
    elif [ "$(id -u)" -eq 0 ]; then
        echo /var/cache/capd
    else
        echo "${XDG_CACHE_HOME:-$HOME/.cache}/capd"
    fi
}

# capd_venv DIR PYTHON REQUIREMENTS: makes DIR a virtual environment of
# PYTHON holding REQUIREMENTS, unless it already is. pip's output goes to
# DIR.log, shown when it fails.
capd_venv() {
    v_dir=$1
    v_py=$2
    v_req=$3
    v_ver=$("$v_py" -c 'import sys; print(sys.version.split()[0])') || {
        echo "capd: $v_py does not run" >&2
        return 1
    }
    v_want="$(sha256sum <"$v_req" | cut -c1-16) $v_py $v_ver"
    if [ -x "$v_dir/bin/python" ] && [ "$(cat "$v_dir/.capd-stamp" 2>/dev/null)" = "$v_want" ]; then
        return 0
    fi
    echo "capd: making $v_dir from $v_req (Python $v_ver at $v_py; pip's log: $v_dir.log)" >&2
    mkdir -p "$(dirname "$v_dir")"
    chmod 0755 "$(dirname "$v_dir")"
    rm -rf "$v_dir"
    v_t0=$(date +%s)
    if ! "$v_py" -m venv "$v_dir" >"$v_dir.log" 2>&1 ||
        ! "$v_dir/bin/python" -m pip install --no-input -r "$v_req" >>"$v_dir.log" 2>&1; then
        tail -n 20 "$v_dir.log" >&2
        echo "capd: could not make $v_dir (above: the end of $v_dir.log)" >&2
        return 1
    fi
    chmod -R a+rX "$v_dir"
    echo "$v_want" >"$v_dir/.capd-stamp"
    echo "capd: $v_dir is ready ($(($(date +%s) - v_t0)) s)" >&2
}
