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
# shellcheck source=lib/pytest-env.sh
source scripts/lib/pytest-env.sh

hypermnf_venv -r tests/ogc/requirements.txt

hypermnf_binary
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
