#!/usr/bin/env bash
# The whole test suite, as the README gives it: Rust unit and integration tests (GPU tests are reported
# as ignored on machines without a CUDA device), every kernel program compiled by NVRTC (NVIDIA's wheel,
# scripts/lib/nvrtc.sh), the parsers fuzzed, the doc tests and the library
# example, the comparison with Spectral Python on the real cubes, the Python client's tests against a
# live server, the hostile-input and auth tests (scripts/hostile-test.sh), OGC API - Processes with
# OWSLib (scripts/ogc-test.sh), the web page in Chromium (scripts/web-test.sh), schemathesis against
# openapi.yaml, the static container checks, the cluster test (three instances on PostgreSQL + S3,
# scripts/cluster-test.sh), and the container built and run with podman and the cluster compose file
# brought up (scripts/ci-container.sh, scripts/ci-compose.sh). Python packages go into .venv
# (git-ignored). System-wide, only Debian's packages are installed when missing: postgresql
# (scripts/lib/postgres.sh), chromium and chromium-driver (scripts/web-test.sh), podman and mmdebstrap
# (scripts/ci-container.sh), all fetched in the background while the crate builds (scripts/lib/prefetch.sh);
# Garage is built once into ~/.cache/hypermnf-tools, as are the container's local base images.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=lib/garage.sh
source scripts/lib/garage.sh
# shellcheck source=lib/gdal.sh
source scripts/lib/gdal.sh
# shellcheck source=lib/nvrtc.sh
source scripts/lib/nvrtc.sh
# shellcheck source=lib/prefetch.sh
source scripts/lib/prefetch.sh

# Each step says when it starts (seconds since this script began): where CI's time goes shows in its log.
step() { printf '\n== %s (at %d s)\n' "$*" "$SECONDS"; }
# The PostgreSQL and Garage servers started below go on any exit.
cleanup() {
  hypermnf_prefetch_stop
  hypermnf_garage_stop
  hypermnf_postgres_stop
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "python environment (.venv)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r tests/python/requirements.txt
export PATH="$PWD/.venv/bin:$PATH"

# Debian's packages and the Garage build, in the background while the crate builds (scripts/lib/prefetch.sh).
step "prefetch: Debian packages and Garage, in the background"
hypermnf_prefetch_start

# Every target, tests included, builds without a lint warning (a test target that no longer builds
# would otherwise show only when its own step runs).
step "cargo clippy"
cargo clippy --all-targets -- -D warnings

# `cargo test --all-targets` also builds the binary (target/debug/hypermnf) that the integration tests
# and every later step run: no separate `cargo build`, which would compile the dependencies that the
# dev-dependencies' features change (faer, sqlx, reqwest, ... 57 crates) and the crate itself once more.
# Built before the servers are waited for, so that the background prefetch overlaps this build too.
step "cargo test --no-run (build the tests and the binary)"
cargo test --all-targets --no-run

# The Rust tests of the PostgreSQL job store and the S3 storage run against real servers: a throwaway
# PostgreSQL and a single-node Garage (built once per machine by cargo install, cached under
# ~/.cache/hypermnf-tools). HYPERMNF_REQUIRE_*=1 makes those tests fail, rather than skip, when their
# server is missing.
step "PostgreSQL and Garage (S3) for cargo test"
hypermnf_prefetch_wait
hypermnf_postgres_start
export HYPERMNF_REQUIRE_POSTGRES=1
echo "HYPERMNF_TEST_POSTGRES_URL=$HYPERMNF_TEST_POSTGRES_URL"
hypermnf_garage_start
hypermnf_garage_selfcheck
export HYPERMNF_REQUIRE_S3=1
# The real AVIRIS-NG and EMIT samples are read from ../shared/data/formats (CI has a copy of shared/
# beside the clone; see its PROVENANCE.md): their tests fail, rather than skip, without it.
export HYPERMNF_REQUIRE_FORMATS=1
echo "HYPERMNF_TEST_S3_URL=$HYPERMNF_TEST_S3_URL (AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL)"

# Run under a time limit: a test that hangs ends the run within 20 minutes (the tests take about 3 on 2
# cores), with the log naming it, instead of taking the CI's whole time.
step "cargo test"
timeout -k 30 1200 cargo test --all-targets 2>&1 | tee /tmp/hypermnf-cargo-test.log
grep -q "test result: ok" /tmp/hypermnf-cargo-test.log
# Copied aside: the GDAL step's `cargo test --features gdal` puts a GDAL-linked build at the same path,
# and the later steps run (and ci-docker.sh checks the libraries of) the default build.
[ -x target/debug/hypermnf ] || { echo "cargo test left no binary at target/debug/hypermnf" >&2; exit 1; }
mkdir -p target/ci && cp target/debug/hypermnf target/ci/hypermnf
export HYPERMNF_BIN="$PWD/target/ci/hypermnf"

# Every kernel program (the pipeline's, the eigen step's, the GPU hash table's) compiled by NVRTC, as a
# GPU host would at its first job, with the NVRTC the container ships (scripts/lib/nvrtc.sh): without a
# GPU this is where a kernel that does not compile shows. Those tests skipped above, with no libnvrtc.
step "kernels compile with NVRTC (cargo test --lib -- compile_with_nvrtc compiles_with_nvrtc)"
hypermnf_nvrtc_install
LD_LIBRARY_PATH="$HYPERMNF_NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" HYPERMNF_REQUIRE_NVRTC=1 \
  cargo test --lib -- compile_with_nvrtc compiles_with_nvrtc 2>&1 | tee /tmp/hypermnf-cargo-test-nvrtc.log
grep -q "test result: ok. 3 passed" /tmp/hypermnf-cargo-test-nvrtc.log

# The GDAL formats (feature `gdal`): EMIT/NEON/PRISMA/GeoTIFF readers and COG outputs. Only this test
# binary is built with the feature (the crate once more; the dependencies are shared), so the rest of
# the suite keeps testing the default, system-library-free build. HYPERMNF_REQUIRE_FORMATS=1 (above)
# makes its shared samples and Python modules required.
step "GDAL formats (cargo test --features gdal --test formats_gdal)"
hypermnf_gdal_install
cargo clippy --features gdal --lib --bins --test formats_gdal -- -D warnings
cargo test --features gdal --test formats_gdal 2>&1 | tee /tmp/hypermnf-cargo-test-gdal.log
grep -q "test result: ok" /tmp/hypermnf-cargo-test-gdal.log

step "fuzz the parsers (scripts/fuzz.sh 50000: 50 000 inputs per parser, ~20 s; 10^6 is the dedicated run)"
bash scripts/fuzz.sh 50000

# `cargo test --all-targets` builds the examples and runs no doc tests: the library's doc tests (which
# include the README's Rust example) and its example program run here (~1 min on 2 cores, most of it the
# doc tests' build).
step "library doc tests and examples/mnf_ndarray.rs"
cargo test --doc
cargo run --example mnf_ndarray

step "Spectral Python comparison (tests/python)"
python -m pytest -q tests/python

for s in scripts/ci-python.sh scripts/hostile-test.sh scripts/ogc-test.sh scripts/web-test.sh scripts/schemathesis.sh scripts/ci-docker.sh scripts/cluster-test.sh scripts/chaos-test.sh scripts/ci-container.sh; do
  step "$s"
  bash "$s"
done

printf '\nall test suites passed (%d s)\n' "$SECONDS"
