#!/usr/bin/env bash
# End-to-end test of hypermnf as a cluster: one PostgreSQL job store (scripts/lib/postgres.sh), one S3
# bucket on a real Garage server (scripts/lib/garage.sh) and three identical `hypermnf serve` instances
# sharing them (CPU backend, 2 workers each, 5 s job lease). tests/cluster/test_cluster.py then submits
# jobs across the instances, kill -9s the instance running one of them, and checks that every job ends
# exactly once with the bytes of `hypermnf run`, that any instance sees, cancels and serves any job,
# that identical requests are answered from the shared store and that DELETE empties the bucket.
# Then three fresh instances (allowed to read the bucket's objects by reference, `--input-bucket`) run
# tests/cluster/batch: a pooled batch of cubes put in the bucket, one instance kill -9ed mid-batch.
#
# Environment: HYPERMNF_BIN (default target/debug/hypermnf, built with `cargo build` if absent),
# CI_VENV (default .venv), HYPERMNF_CLUSTER_TIMEOUT (seconds for the Python part, default 420),
# PYTEST_ARGS (extra pytest arguments). On failure the instances' logs are copied to
# target/cluster-test-logs/ before the temp dir goes. Everything started here is stopped on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=lib/garage.sh
source scripts/lib/garage.sh
# shellcheck source=lib/instances.sh
source scripts/lib/instances.sh

step() { echo "== cluster-test: $*"; }
fail() { echo "cluster-test: FAIL: $*" >&2; exit 1; }

INSTANCES=3
WORKERS=2
LEASE=5s
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hypermnf-cluster.XXXXXX")

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    hypermnf_instances_stop
    if [ "$rc" != 0 ] && ls "$WORK"/node*.log >/dev/null 2>&1; then
        rm -rf "$ROOT/target/cluster-test-logs"
        mkdir -p "$ROOT/target/cluster-test-logs"
        cp "$WORK"/node*.log "$WORK"/node*.out "$ROOT/target/cluster-test-logs/" 2>/dev/null || true
        echo "cluster-test: the instances' logs are in target/cluster-test-logs/" >&2
    fi
    hypermnf_garage_stop
    hypermnf_postgres_stop
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# $WORK/instances.json: what the Python side needs to reach, kill and read each running instance.
write_instances() {
    "$VENV/bin/python" - "$WORK/instances.json" "$WORK" "${HYPERMNF_INSTANCE_PIDS[@]}" -- "${HYPERMNF_INSTANCE_URLS[@]}" <<'PY'
import json, sys
out, work, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
sep = rest.index("--")
pids, urls = rest[:sep], rest[sep + 1:]
json.dump([{"name": "ABC"[i], "url": u, "pid": int(p), "log": f"{work}/node{i}.log"}
           for i, (p, u) in enumerate(zip(pids, urls))], open(out, "w"), indent=1)
PY
}

step "python environment"
VENV=${CI_VENV:-.venv}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r tests/cluster/requirements.txt

step "hypermnf binary"
if [ -z "${HYPERMNF_BIN:-}" ]; then
    HYPERMNF_BIN=$ROOT/target/debug/hypermnf
    [ -x "$HYPERMNF_BIN" ] || cargo build --bins
fi
[ -x "$HYPERMNF_BIN" ] || fail "no hypermnf binary at $HYPERMNF_BIN"
export HYPERMNF_BIN
# A binary from before the PostgreSQL job store and the S3 store has neither option: say so plainly
# rather than three times in clap's words.
serve_help=$("$HYPERMNF_BIN" serve --help) || fail "$HYPERMNF_BIN serve --help failed"
for opt in --database-url --store --lease; do
    grep -q -- "$opt" <<<"$serve_help" || fail "$HYPERMNF_BIN serve has no $opt option (built before the cluster support?)"
done
echo "using $HYPERMNF_BIN"

step "PostgreSQL"
hypermnf_postgres_start || fail "PostgreSQL did not start"
echo "$HYPERMNF_TEST_POSTGRES_URL"

step "Garage (S3)"
hypermnf_garage_start hypermnf-cluster cluster || fail "Garage did not start"
hypermnf_garage_selfcheck || fail "Garage does not serve S3"
echo "$HYPERMNF_TEST_S3_URL at $AWS_ENDPOINT_URL"

# --early-start always: the CPU jobs of .npy uploads start before the upload is synced too (by default
# only GPU jobs do), so that jobs inserted already claimed meet the kills and the leases here.
step "$INSTANCES hypermnf serve instances (--workers $WORKERS --lease $LEASE --backend cpu --early-start always)"
hypermnf_instances_start "$INSTANCES" "$WORK" --workers "$WORKERS" --lease "$LEASE" --backend cpu --early-start always \
    || fail "the instances did not start"
write_instances

step "tests/cluster"
echo "(one instance is kill -9ed on purpose: bash reports it as 'Killed')"
export HYPERMNF_CLUSTER_FILE=$WORK/instances.json HYPERMNF_CLUSTER_WORK=$WORK HYPERMNF_CLUSTER_LEASE_S=${LEASE%s}
set +e
# The whole Python part is bounded too (each of its waits has its own, shorter timeout).
(cd "$ROOT" && timeout -k 10 "${HYPERMNF_CLUSTER_TIMEOUT:-420}" \
    "$VENV/bin/python" -m pytest -x -q -s -p no:cacheprovider --ignore=tests/cluster/batch ${PYTEST_ARGS:-} tests/cluster)
rc=$?
set -e
case $rc in
    0) ;;
    5) fail "pytest collected no tests" ;;
    124|137) fail "tests/cluster ran past ${HYPERMNF_CLUSTER_TIMEOUT:-420} s" ;;
    *) fail "tests/cluster failed (pytest exit $rc)" ;;
esac

# The batch test kills an instance of its own: fresh ones, on the same store and bucket, allowed to
# read the bucket's objects by reference. Logs of the first set are kept apart.
step "$INSTANCES fresh instances for tests/cluster/batch (--input-bucket $HYPERMNF_TEST_S3_BUCKET)"
hypermnf_instances_stop
mkdir -p "$WORK/first" && mv "$WORK"/node* "$WORK/first/" 2>/dev/null || true
hypermnf_instances_start "$INSTANCES" "$WORK" --workers "$WORKERS" --lease "$LEASE" --backend cpu \
    --input-bucket "$HYPERMNF_TEST_S3_BUCKET" || fail "the instances for the batch test did not start"
write_instances
step "tests/cluster/batch"
set +e
(cd "$ROOT" && timeout -k 10 "${HYPERMNF_CLUSTER_TIMEOUT:-420}" \
    "$VENV/bin/python" -m pytest -x -q -s -p no:cacheprovider ${PYTEST_ARGS:-} tests/cluster/batch)
rc=$?
set -e
case $rc in
    0) ;;
    5) fail "pytest collected no tests in tests/cluster/batch" ;;
    124|137) fail "tests/cluster/batch ran past ${HYPERMNF_CLUSTER_TIMEOUT:-420} s" ;;
    *) fail "tests/cluster/batch failed (pytest exit $rc)" ;;
esac
echo "cluster-test: all checks passed"
