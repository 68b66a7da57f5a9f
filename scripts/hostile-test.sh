#!/usr/bin/env bash
# The hostile HTTP corpus and the auth tests (tests/hostile) against live `hypermnf serve` processes
# that the tests start themselves: >= 50 hostile requests, each answered by a 4xx JSON problem with a
# stable code (odd but valid cubes: a job that ends with a reason), the server healthy after each,
# and at the end the counts of 5xx answers, panics in the server logs and hung requests, all 0.
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
