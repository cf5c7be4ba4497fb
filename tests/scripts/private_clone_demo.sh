#!/bin/sh
# tests/scripts/private_clone_demo.sh SOURCE_DIR - the README's first command
# from a clone in a directory only its owner may enter (mode 0700, like
# /root): the short version of the demo (CAPD_DEMO_QUICK) must exit 0 and
# its comparison must find the perturbed width diverging at the first Linear
# layer and nothing else. Run as root, capd's cells run as nobody, which
# cannot read the clone: the demo then works from a copy it can read
# (scripts/cellroot.sh), and says so. Every process and file it made is
# removed, whatever happens.
set -u
SRC=${1:?source dir}
T=$(mktemp -d "${TMPDIR:-/tmp}/capd-private-XXXXXX")
STAGE=$(mktemp -d /var/tmp/capd-stage-test-XXXXXX)
cleanup() {
    # The demo's own trap stops its capd; this catches one left by a kill.
    pkill -f "$T/" 2>/dev/null
    pkill -f "$STAGE/" 2>/dev/null
    rm -rf "$T" "$STAGE"
}
trap cleanup EXIT INT TERM
chmod 0700 "$T"
mkdir "$T/clone"
# The suite may itself run from scripts/cellroot.sh's copy, which has no
# .git: copy the same files cellroot would, and let the demo decide afresh.
unset CAPD_CELLROOT
(cd "$SRC" && . scripts/cellroot.sh && cellroot_files |
    tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$T/clone" || exit 1
echo "clone in $T (mode $(stat -c %a "$T")), as $(id -un)"
CAPD_DEMO_QUICK=1 CAPD_STAGE_DIR="$STAGE" "$T/clone/scripts/demo" >"$T/out" 2>&1
rc=$?
cat "$T/out"
fail() { echo "FAIL: $*"; exit 1; }
[ $rc -eq 0 ] || fail "scripts/demo exited $rc"
if [ "$(id -u)" -eq 0 ]; then
    grep -q "working from a copy at $STAGE/" "$T/out" || fail "the demo did not say it works from a copy"
fi
W=$(sed -n 's/.*the head is perturbed at \([a-z0-9]*\)$/\1/p' "$T/out")
[ -n "$W" ] || fail "the demo did not say which width it perturbs"
grep -q "^diverged mlp/$W/forward: first divergence fc1.0.forward.output.0" "$T/out" ||
    fail "mlp/$W/forward did not diverge at the first Linear layer"
grep -q "^2 cells compared, 1 identical, 1 diverged" "$T/out" ||
    fail "the comparison is not 1 identical and 1 diverged"
echo "PASS: the demo ran from a 0700 directory and found mlp/$W/forward diverging at fc1"
