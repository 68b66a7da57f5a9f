#!/usr/bin/env bash
# The reliability tests of tests/hostile, against live `hypermnf serve` processes that the tests start
# themselves (~30 s): the hostile HTTP corpus (>= 50 hostile requests, each answered by a 4xx JSON
# problem with a stable code; odd but valid cubes: a job that ends with the right reason; the server
# healthy after each), auth (a key sees only its own jobs; --input-root cannot be escaped), crash
# safety (kill -9 mid-job and mid-upload; a full and a read-only data dir, where mounting a tmpfs is
# permitted) and load (50 submitting clients + 200 status readers). The last test prints and asserts
# the counts of 5xx answers, panics in the server logs and hung requests over the run: all 0.
# Environment: HYPERMNF_BIN (default: the newest of target/{release,debug}/hypermnf, built if missing), CI_VENV (default .venv),
# PYTEST_ARGS (extra pytest arguments). Exits non-zero on any failure, or when no test was collected.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
fail() { echo "hostile-test: FAIL: $*" >&2; exit 1; }
# shellcheck source=lib/pytest-env.sh
source scripts/lib/pytest-env.sh
hypermnf_venv -r tests/hostile/requirements.txt
hypermnf_binary
set +e
(cd tests/hostile && "$PY" -m pytest -q -s -p no:cacheprovider ${PYTEST_ARGS:-} .)
rc=$?
set -e
case $rc in
    0) echo "hostile-test: all checks passed" ;;
    5) fail "pytest collected no tests" ;;
    *) fail "pytest exited with $rc" ;;
esac
