#!/usr/bin/env bash
# The service while its database or its object store goes away: PostgreSQL run as production runs it
# (fsync and synchronous_commit on: scripts/lib/postgres.sh with HYPERMNF_PG_DURABLE=1), a real Garage
# and two `hypermnf serve` instances sharing them (CPU backend, 3 s leases).
#
#   1. PostgreSQL crashes (immediate stop) and starts again; 2. Garage is killed and starts again.
#
# While each is down it checks that requests which need it answer 503 within a second, with
# Retry-After and the code `database_unavailable` / `storage_unavailable` (never a 500), that /readyz
# says 503 within a second and /healthz 200, and that a refused upload leaves no scratch behind. Once
# it is back: /readyz is 200 again, the workers claim by themselves, every accepted job succeeds
# exactly once with the bytes of `hypermnf run`, no job is stuck, and no object is orphaned.
# Not yet here (issue 33): the faults during an upload, a running job and a download, kill -9 and
# SIGSTOP of an instance (tests/cluster covers kill -9), and a third instance.
#
# Environment: HYPERMNF_BIN (default target/debug/hypermnf, built if absent), CI_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=lib/garage.sh
source scripts/lib/garage.sh
# shellcheck source=lib/instances.sh
source scripts/lib/instances.sh

step() { echo "== chaos-test: $*"; }
fail() { echo "chaos-test: FAIL: $*" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hypermnf-chaos.XXXXXX")
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    hypermnf_instances_stop
    if [ "$rc" != 0 ]; then
        rm -rf "$ROOT/target/chaos-test-logs" && mkdir -p "$ROOT/target/chaos-test-logs"
        cp "$WORK"/node*.log "$ROOT/target/chaos-test-logs/" 2>/dev/null || true
        echo "chaos-test: the instances' logs are in target/chaos-test-logs/" >&2
    fi
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
    HYPERMNF_BIN=$ROOT/target/debug/hypermnf
    [ -x "$HYPERMNF_BIN" ] || cargo build --bins
fi
export HYPERMNF_BIN

# Small cubes, each its own (a job of the same cube and parameters would be answered from the cache).
cube() { "$VENV/bin/python" -c "
import numpy as np, sys
rng = np.random.default_rng($1)
x = rng.normal(0, 1, (60, 50, 3)) @ rng.normal(0, 1, (3, 24)) * 40 + rng.normal(0, 3, (60, 50, 24)) + 500
np.save(sys.argv[1], x.astype('<i2'))" "$WORK/cube$1.npy"; }

# curl's answer as "STATUS SECONDS" (the body in $WORK/body, the headers in $WORK/headers).
call() { curl -s -o "$WORK/body" -D "$WORK/headers" -w '%{http_code} %{time_total}' --max-time 20 "$@" || echo "000 20"; }
post() { call -X POST -H 'content-type: application/x-npy' --data-binary "@$WORK/cube$2.npy" "$1/v1/jobs?components=3"; }

# Refused fast, as unavailable: STATUS SECONDS from `call`, the code expected.
expect_503() {
    local what=$1 got=$2 code=$3 status secs
    read -r status secs <<<"$got"
    [ "$status" = 503 ] || fail "$what: $status, not 503: $(cat "$WORK/body")"
    "$VENV/bin/python" -c "import sys; sys.exit(0 if float('$secs') < 1.0 else 1)" || fail "$what: the 503 took ${secs}s"
    grep -qi '^retry-after:' "$WORK/headers" || fail "$what: no Retry-After"
    grep -q "\"$code\"" "$WORK/body" || fail "$what: not $code: $(cat "$WORK/body")"
    echo "  $what: 503 $code in ${secs}s"
}

ready_again() {
    local url=$1 deadline=$((SECONDS + 60))
    until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url/readyz")" = 200 ]; do
        [ $SECONDS -lt $deadline ] || fail "$url is not ready within 60 s of the restart"
        sleep 0.3
    done
}

# Waits for job $2 on instance $1 to succeed (120 s), then checks its components against `hypermnf run`.
succeeds_as_run() {
    local url=$1 id=$2 n=$3 deadline=$((SECONDS + 120)) status
    while :; do
        status=$(curl -s --max-time 5 "$url/v1/jobs/$id" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null || echo unknown)
        [ "$status" = succeeded ] && break
        [ "$status" = failed ] && fail "job $id failed: $(curl -s "$url/v1/jobs/$id")"
        [ $SECONDS -lt $deadline ] || fail "job $id is still $status after 120 s"
        sleep 0.3
    done
    curl -s --max-time 20 -o "$WORK/got$n.npy" "$url/v1/jobs/$id/result"
    "$HYPERMNF_BIN" run "$WORK/cube$n.npy" --out "$WORK/want$n.npy" --components 3 --backend cpu 2>/dev/null
    cmp -s "$WORK/got$n.npy" "$WORK/want$n.npy" || fail "job $id: the result differs from hypermnf run's"
    echo "  job $id succeeded with the bytes of hypermnf run"
}

# Submits cube $2 to instance $1 ($3 says when, for a failure), expects it accepted, and checks that it
# succeeds with the bytes of `hypermnf run`; the job is added to `accepted`.
accepted_job() {
    local url=$1 n=$2 when=$3 status id
    read -r status _ <<<"$(post "$url" "$n")"
    [ "$status" = 202 ] || fail "$when: $status $(cat "$WORK/body")"
    id=$("$VENV/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$WORK/body")
    accepted+=("$id")
    succeeds_as_run "$url" "$id" "$n"
}

# Both instances ready again after an outage (/readyz 200).
both_ready_again() {
    ready_again "$A"
    ready_again "$B"
}

step "PostgreSQL (durable), Garage, two instances"
HYPERMNF_PG_DURABLE=1 hypermnf_postgres_start || fail "PostgreSQL did not start"
hypermnf_garage_start hypermnf-chaos chaos || fail "Garage did not start"
hypermnf_instances_start 2 "$WORK" --workers 1 --lease 3s --backend cpu || fail "the instances did not start"
A=${HYPERMNF_INSTANCE_URLS[0]}
B=${HYPERMNF_INSTANCE_URLS[1]}
for i in 1 2 3 4; do cube "$i"; done
accepted=()

accepted_job "$A" 1 "the first job"
id1=${accepted[0]}

step "PostgreSQL crashes"
hypermnf_postgres_crash
expect_503 "POST /v1/jobs" "$(post "$A" 2)" database_unavailable
expect_503 "GET /v1/jobs/{id}" "$(call "$B/v1/jobs/$id1")" database_unavailable
expect_503 "GET /v1/jobs" "$(call "$A/v1/jobs")" database_unavailable
expect_503 "/readyz" "$(call "$A/readyz")" not_ready
read -r status _ <<<"$(call "$A/healthz")"
[ "$status" = 200 ] || fail "/healthz said $status while the database was down"
left=$(find "$WORK"/node0/objects/scratch -mindepth 1 2>/dev/null | head -n 5 || true)
[ -z "$left" ] || fail "a refused upload left scratch behind: $left"
sleep 3 # the workers fail to claim meanwhile, and back off
hypermnf_postgres_restart || fail "PostgreSQL did not start again"
both_ready_again
accepted_job "$B" 2 "after the restart"

step "Garage is killed"
hypermnf_garage_pause
expect_503 "POST /v1/jobs" "$(post "$A" 3)" storage_unavailable
expect_503 "GET /v1/jobs/{id}/result" "$(call "$B/v1/jobs/$id1/result")" storage_unavailable
expect_503 "/readyz" "$(call "$B/readyz")" not_ready
read -r status _ <<<"$(call "$B/healthz")"
[ "$status" = 200 ] || fail "/healthz said $status while the store was down"
hypermnf_garage_resume || fail "Garage did not start again"
both_ready_again
accepted_job "$A" 3 "after Garage came back"

step "every accepted job once, none stuck, no orphan objects"
jobs=$(curl -s --max-time 5 "$A/v1/jobs?limit=100")
"$VENV/bin/python" - "${accepted[@]}" <<PY || fail "the job list"
import json, sys
jobs = json.loads('''$jobs''')["jobs"]
ids = [j["id"] for j in jobs]
assert sorted(ids) == sorted(sys.argv[1:]), f"jobs {ids}, accepted {sys.argv[1:]}"
assert all(j["status"] == "succeeded" for j in jobs), [j["status"] for j in jobs]
PY
for id in "${accepted[@]}"; do
    curl -s -o /dev/null -w '%{http_code}\n' -X DELETE "$A/v1/jobs/$id" | grep -qx 204 || fail "DELETE $id"
done
# Nothing but the readiness probe's object may stay once every job is deleted: not the refused
# uploads' inputs, nor anything of the jobs.
"$VENV/bin/python" - <<'PY' || fail "objects left in the bucket after every job was deleted"
import os, time
import boto3
from botocore.config import Config
bucket, _, prefix = os.environ["HYPERMNF_TEST_S3_URL"].removeprefix("s3://").partition("/")
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ["AWS_REGION"],
                  config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=30))
def left():
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].startswith(prefix + "/health/")]
    return keys
deadline, keys = time.monotonic() + 15, left()
while keys and time.monotonic() < deadline:
    time.sleep(0.3)
    keys = left()
assert not keys, f"left in s3://{bucket}/{prefix}: {keys[:10]}"
print(f"  s3://{bucket}/{prefix} holds nothing but the readiness probe")
PY
echo "chaos-test: ok"
