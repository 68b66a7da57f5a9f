#!/usr/bin/env bash
# The web page in a real browser: Debian's chromium and chromium-driver (installed with apt-get when
# missing), Selenium from tests/web/requirements.txt in the project's .venv, and tests/web against a
# live `hypermnf serve` the test starts itself. It uploads real cubes through the page, waits for the
# jobs, and checks the eigenvalue plot and the component quicklooks (non-blank pixels). Screenshots
# stay in tests/web/artifacts/ (git-ignored). Exits non-zero on any failure, including a pytest run
# that collected no test. About 15 s on 2 cores with a debug build, once Chromium is installed.
# Environment: HYPERMNF_BIN (default: the newest of target/{release,debug}/hypermnf, built with
# `cargo build` if there is none), CI_VENV (default .venv), PYTEST_ARGS, CHROMIUM, CHROMEDRIVER.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

fail() { echo "web-test: FAIL: $*" >&2; exit 1; }
# shellcheck source=lib/pytest-env.sh
source scripts/lib/pytest-env.sh

if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ] || [ ! -x "${CHROMEDRIVER:-/usr/bin/chromedriver}" ]; then
    echo "web-test: installing chromium and chromium-driver (apt-get)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || fail "no chromium at ${CHROMIUM:-/usr/bin/chromium}"
[ -x "${CHROMEDRIVER:-/usr/bin/chromedriver}" ] || fail "no chromedriver at ${CHROMEDRIVER:-/usr/bin/chromedriver}"

hypermnf_venv -r tests/web/requirements.txt

hypermnf_binary
echo "web-test: using $HYPERMNF_BIN, $("${CHROMIUM:-/usr/bin/chromium}" --version 2>/dev/null | head -n1)"

rm -rf tests/web/artifacts
set +e
"$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests/web
rc=$?
set -e
case $rc in
    0) echo "web-test: all checks passed; screenshots in tests/web/artifacts/" ;;
    5) fail "pytest collected no tests" ;;
    *) fail "pytest exited with $rc (screenshots so far in tests/web/artifacts/)" ;;
esac
