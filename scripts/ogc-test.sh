#!/usr/bin/env bash
# OGC API - Processes with the real client: installs tests/ogc/requirements.txt (OWSLib, pytest, ...)
# into the project's .venv and runs tests/ogc against a live `hypermnf serve` the suite starts itself
# (CPU backend, --input-root tests/data, two API keys). Exits non-zero on any failure, including a
# pytest run that collected no test. About 25 s on 2 cores with a debug build.
# Environment: HYPERMNF_BIN (default: the newest of target/{release,debug}/hypermnf, built with
# `cargo build` if there is none), CI_VENV (default .venv), PYTEST_ARGS (extra pytest arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

fail() { echo "ogc-test: FAIL: $*" >&2; exit 1; }

VENV=${CI_VENV:-.venv}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY=$VENV/bin/python
"$PY" -m pip install --quiet --disable-pip-version-check -r tests/ogc/requirements.txt

if [ -z "${HYPERMNF_BIN:-}" ]; then
    for candidate in $(ls -t target/release/hypermnf target/debug/hypermnf 2>/dev/null); do
        HYPERMNF_BIN=$ROOT/$candidate
        break
    done
fi
if [ -z "${HYPERMNF_BIN:-}" ]; then
    cargo build --bin hypermnf
    HYPERMNF_BIN=$ROOT/target/debug/hypermnf
fi
[ -x "$HYPERMNF_BIN" ] || fail "no hypermnf binary at $HYPERMNF_BIN"
export HYPERMNF_BIN
echo "ogc-test: using $HYPERMNF_BIN"

set +e
"$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests/ogc
rc=$?
set -e
case $rc in
    0) echo "ogc-test: all checks passed" ;;
    5) fail "pytest collected no tests" ;;
    *) fail "pytest exited with $rc" ;;
esac
