#!/bin/sh
# capd in any CI system (GitLab, Jenkins, Buildkite...): register the build
# this pipeline just made, capture its commit, compare it with its control,
# post the Markdown report on the pull request, and fail on a regression.
# docs/deploy.md "CI integration" explains the set-up; github-actions.yml is
# the same flow as a GitHub Actions workflow.
#
# The CI job must run on the capd host (or share its file system): capd runs
# the cells itself, with the interpreter and PYTHONPATH registered here, so
# BUILD_PYTHON and BUILD_PYTHONPATH must exist there and be readable by the
# user cells run as (run_as_user).
#
# Environment:
#   CAPD_SERVER          capd's URL (default http://127.0.0.1:8470)
#   CAPD_ADMIN_TOKEN     token with scope admin: registering a build chooses
#                        what the host executes (unset: CAPD_TOKEN, else
#                        capctl's own discovery, DATA/admin.token)
#   CAPD_TOKEN           token with scope submit, for submitting and reading
#   CAPD_DATA_DIR        capd's data dir, whose admin.token capctl reads when
#                        no token is given (a CI job on the capd host)
#   CAPCTL               the client (default: capctl on PATH)
#   PROJECT              project name (default pytorch)
#   COMMIT               the commit that was built (required)
#   BRANCH               its branch (optional)
#   CONTROL_COMMIT       what to compare with, usually the merge base; it must
#                        have been captured (run this script on the main
#                        branch's commits too, without CONTROL_COMMIT)
#   SOURCE_TREE          the checkout the build was made from (provenance:
#                        generated dispatch sources, stale headers, dirty
#                        submodules); default: the current directory
#   BUILD_PYTHON         interpreter of the build (required)
#   BUILD_PYTHONPATH     where the built framework is importable from
#   BUILD_NAME           default: <project>-<first 12 digits of COMMIT>
#   MODELS WIDTHS PASSES the matrix (default mlp,cnn / default,avx2,avx512 /
#                        forward,backward)
#   SUBMIT_ARGS          more `capctl submit` flags (e.g. --iterations 30)
#   REGISTER_ARGS        more `capctl builds register` flags (--env K=V...)
#   WAIT_TIMEOUT         seconds to wait for the capture (default 7200)
#   REPORT               where the Markdown report goes (default capd-report.md)
#   FAIL_ON              regression (default): numerics, outcomes and perf
#                        fail the check; numerics: perf is reported but does
#                        not fail it (a CI host shared with other work)
#   GITHUB_TOKEN, GITHUB_REPOSITORY (owner/name), PR_NUMBER: when all set,
#                        the report is posted on the pull request (one
#                        comment, updated on every run); GITHUB_API_URL
#                        defaults to https://api.github.com
#
# Exit status: 0 the comparison passed (or there is no control) and every
# cell ended ok, 1 a regression (capctl diff) or a cell not ok, 2 an error.
set -eu

: "${COMMIT:?COMMIT is required}"
: "${BUILD_PYTHON:?BUILD_PYTHON is required}"
CAPCTL=${CAPCTL:-capctl}
PROJECT=${PROJECT:-pytorch}
SOURCE_TREE=${SOURCE_TREE:-$(pwd)}
BUILD_NAME=${BUILD_NAME:-$PROJECT-$(printf %.12s "$COMMIT")}
MODELS=${MODELS:-mlp,cnn}
WIDTHS=${WIDTHS:-default,avx2,avx512}
PASSES=${PASSES:-forward,backward}
WAIT_TIMEOUT=${WAIT_TIMEOUT:-7200}
REPORT=${REPORT:-capd-report.md}
GITHUB_API_URL=${GITHUB_API_URL:-https://api.github.com}
export CAPD_SERVER="${CAPD_SERVER:-http://127.0.0.1:8470}"

# 1. Register the fresh build under a per-commit name (--replace: a re-run
#    of the same commit points it at the new tree). A queued job looks its
#    build up when it starts, so one name per commit keeps jobs apart.
set -- --name "$BUILD_NAME" --python "$BUILD_PYTHON" --replace \
    --description "$PROJECT $COMMIT${BRANCH:+ ($BRANCH)}"
[ -n "${BUILD_PYTHONPATH:-}" ] && set -- "$@" --env "PYTHONPATH=$BUILD_PYTHONPATH"
# shellcheck disable=SC2086
CAPD_TOKEN=${CAPD_ADMIN_TOKEN:-${CAPD_TOKEN:-}} "$CAPCTL" builds register "$@" ${REGISTER_ARGS:-}

# 2. Capture the commit and wait. Exit 3 means some cell is not ok (a crash
#    or an unsupported width): the comparison below still says which and
#    decides. The idempotency key makes a retried CI step reuse its job.
set -- --project "$PROJECT" --commit "$COMMIT" --build "$BUILD_NAME" \
    --models "$MODELS" --widths "$WIDTHS" --passes "$PASSES" \
    --source-tree "$SOURCE_TREE" --idempotency-key "ci-$PROJECT-$COMMIT-${CI_RUN_ID:-0}" \
    --wait --wait-timeout "$WAIT_TIMEOUT"
[ -n "${BRANCH:-}" ] && set -- "$@" --branch "$BRANCH"
[ -n "${CONTROL_COMMIT:-}" ] && set -- "$@" --control-commit "$CONTROL_COMMIT"
rc=0
# shellcheck disable=SC2086
"$CAPCTL" submit "$@" ${SUBMIT_ARGS:-} || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    echo "capd-ci: the capture failed (capctl submit exit $rc)" >&2
    exit 2
fi
if [ -z "${CONTROL_COMMIT:-}" ]; then
    echo "capd-ci: captured $COMMIT (no control to compare with)"
    [ "$rc" -eq 0 ] || exit 1
    exit 0
fi

# 3. Compare with the control: exit 0 pass, 1 regression, 2 error.
diff_rc=0
"$CAPCTL" diff --commit "$COMMIT" --format md --fail-on "${FAIL_ON:-regression}" \
    --wait-timeout 600 >"$REPORT" || diff_rc=$?
if [ "$diff_rc" -eq 2 ]; then
    echo "capd-ci: no comparison (is the control $CONTROL_COMMIT captured?)" >&2
    exit 2
fi
cat "$REPORT"

# 4. Post the report on the pull request: one comment, found again by its
#    marker and updated, so re-runs do not pile comments up. GitHub caps a
#    comment at 65536 characters.
if [ -n "${GITHUB_TOKEN:-}" ] && [ -n "${GITHUB_REPOSITORY:-}" ] && [ -n "${PR_NUMBER:-}" ]; then
    python3 - "$REPORT" <<'PY'
import json, os, sys, urllib.request
marker = "<!-- capd-report -->"
body = open(sys.argv[1], encoding="utf-8", errors="replace").read()
if len(body) > 60000:
    body = body[:60000] + "\n\n_(report cut at 60000 characters; `capctl diff` has all of it)_\n"
body = marker + "\n" + body
api = os.environ["GITHUB_API_URL"].rstrip("/")
repo, pr = os.environ["GITHUB_REPOSITORY"], os.environ["PR_NUMBER"]
headers = {"Authorization": "Bearer " + os.environ["GITHUB_TOKEN"],
           "Accept": "application/vnd.github+json", "Content-Type": "application/json"}
def call(method, url, data=None):
    req = urllib.request.Request(url, method=method, headers=headers,
                                 data=json.dumps(data).encode() if data is not None else None)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")
existing = None
for page in range(1, 11):
    comments = call("GET", f"{api}/repos/{repo}/issues/{pr}/comments?per_page=100&page={page}")
    existing = next((c for c in comments if c.get("body", "").startswith(marker)), None)
    if existing or len(comments) < 100:
        break
if existing:
    call("PATCH", f"{api}/repos/{repo}/issues/comments/{existing['id']}", {"body": body})
else:
    call("POST", f"{api}/repos/{repo}/issues/{pr}/comments", {"body": body})
PY
fi

# 5. The check fails on a regression, and on cells that did not end ok.
if [ "$diff_rc" -eq 1 ]; then
    echo "capd-ci: regression against $CONTROL_COMMIT (report above)" >&2
    exit 1
fi
if [ "$rc" -ne 0 ]; then
    echo "capd-ci: some cells of $COMMIT did not end ok (capctl submit listed them)" >&2
    exit 1
fi
exit 0
