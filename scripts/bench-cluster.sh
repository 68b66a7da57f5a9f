#!/usr/bin/env bash
# Jobs per second for 1, 2 and 3 `hypermnf serve` instances on this machine, sharing one PostgreSQL job
# store and one S3 bucket on a real Garage server (the setup of scripts/cluster-test.sh), on a stream of
# distinct small cubes (tests/cluster/bench_cluster.py). A benchmark, not a test: it prints one JSON
# line per instance count and asserts nothing about the rates.
#
# Environment: HYPERMNF_BIN (default target/release/hypermnf, built if absent), BENCH_JOBS (default 60),
# BENCH_CUBE ("LINES SAMPLES BANDS", default "64 64 32"), BENCH_BACKEND (default auto), BENCH_WORKERS
# (per instance, default 1), CI_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=lib/garage.sh
source scripts/lib/garage.sh
# shellcheck source=lib/instances.sh
source scripts/lib/instances.sh

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hypermnf-bench-cluster.XXXXXX")
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    hypermnf_instances_stop
    hypermnf_garage_stop
    hypermnf_postgres_stop
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

VENV=${CI_VENV:-.venv}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r tests/cluster/requirements.txt

if [ -z "${HYPERMNF_BIN:-}" ]; then
    HYPERMNF_BIN=$ROOT/target/release/hypermnf
    [ -x "$HYPERMNF_BIN" ] || cargo build --release --bin hypermnf
fi
export HYPERMNF_BIN
read -r lines samples bands <<<"${BENCH_CUBE:-64 64 32}"

hypermnf_postgres_start >/dev/null
hypermnf_garage_start hypermnf-bench bench >/dev/null
echo "# $(date -u +%F) $(nproc) cores, $HYPERMNF_BIN, backend ${BENCH_BACKEND:-auto}, ${BENCH_WORKERS:-1} worker(s) per instance" >&2
for n in 1 2 3; do
    mkdir -p "$WORK/n$n"
    hypermnf_instances_start "$n" "$WORK/n$n" --workers "${BENCH_WORKERS:-1}" --backend "${BENCH_BACKEND:-auto}" >&2
    # A different seed range per round: no job is a cache hit of an earlier round's.
    "$VENV/bin/python" tests/cluster/bench_cluster.py --jobs "${BENCH_JOBS:-60}" --seed $((n * 100000)) \
        --lines "$lines" --samples "$samples" --bands "$bands" "${HYPERMNF_INSTANCE_URLS[@]}"
    hypermnf_instances_stop
done
