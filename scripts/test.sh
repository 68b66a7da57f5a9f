#!/usr/bin/env bash
# The whole test suite, as the README gives it: Rust unit and integration tests (GPU tests are reported
# as ignored on machines without a CUDA device), the comparison with Spectral Python on the real cubes,
# the Python client's tests against a live server, schemathesis against openapi.yaml, the static
# container checks, and the container built and run with podman (scripts/ci-container.sh, which installs
# podman and mmdebstrap from Debian's packages if they are missing). Python packages go into .venv
# (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "python environment (.venv)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r tests/python/requirements.txt
export PATH="$PWD/.venv/bin:$PATH"

step "cargo build"
cargo build --bins
export HYPERMNF_BIN="$PWD/target/debug/hypermnf"

step "cargo test"
cargo test --all-targets 2>&1 | tee /tmp/hypermnf-cargo-test.log
grep -q "test result: ok" /tmp/hypermnf-cargo-test.log

step "Spectral Python comparison (tests/python)"
python -m pytest -q tests/python

for s in scripts/ci-python.sh scripts/schemathesis.sh scripts/ci-docker.sh scripts/ci-container.sh; do
  step "$s"
  bash "$s"
done

printf '\nall test suites passed\n'
