#!/usr/bin/env bash
# The reliability tests of tests/hostile, against live `hypermnf serve` processes that the tests start
# themselves (~30 s): the hostile HTTP corpus (>= 50 hostile requests, each answered by a 4xx JSON
# problem with a stable code; odd but valid cubes: a job that ends with the right reason; the server
# healthy after each), auth (a key sees only its own jobs; --input-root cannot be escaped), crash
# safety (kill -9 mid-job and mid-upload; a full and a read-only data dir, where mounting a tmpfs is
# permitted) and load (50 submitting clients + 200 status readers). The last test prints and asserts
# the counts of 5xx answers, panics in the server logs and hung requests over the run: all 0.
# Environment: HYPERMNF_BIN (default target/debug/hypermnf, built if missing), CI_VENV (default .venv),
# PYTEST_ARGS (extra pytest arguments). Exits non-zero on any failure, or when no test was collected.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${CI_VENV:-.venv}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/hostile/requirements.txt
if [ -z "${HYPERMNF_BIN:-}" ]; then
    [ -x target/debug/hypermnf ] || cargo build --bin hypermnf
    HYPERMNF_BIN=$ROOT/target/debug/hypermnf
fi
export HYPERMNF_BIN
set +e
(cd tests/hostile && "$VENV/bin/python" -m pytest -q -s -p no:cacheprovider ${PYTEST_ARGS:-} .)
rc=$?
set -e
case $rc in
    0) echo "hostile-test: all checks passed" ;;
    5) echo "hostile-test: FAIL: pytest collected no tests" >&2; exit 1 ;;
    *) echo "hostile-test: FAIL: pytest exited with $rc" >&2; exit 1 ;;
esac
