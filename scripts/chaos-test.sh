#!/usr/bin/env bash
# The service while one of its parts goes away: three `hypermnf serve` instances (CPU backend, one
# worker each, 3 s leases) sharing a PostgreSQL run as production runs it (fsync and
# synchronous_commit on: scripts/lib/postgres.sh with HYPERMNF_PG_DURABLE=1) and a real Garage.
#
# Four rounds, one per fault, each while an upload, a running job and a download are in flight:
#   1. kill -9 of the instance running the job (restarted afterwards on its data dir, as a
#      supervisor would);
#   2. SIGSTOP of that instance for 6 s (past its 3 s lease), then SIGCONT;
#   3. PostgreSQL immediate stop (a crash), then start;
#   4. Garage killed, then started again.
# The upload (a 4 MB cube sent at 1 MB/s) goes to the instance running the job, as does the download
# (a 26 MB result read at 3 MB/s). The upload must be accepted (202, and its job then succeeds) or
# refused cleanly (503 with its code, or the connection reset when its instance is killed); the
# download must give the right bytes, or fail and give them on a retry after the recovery; the job
# must succeed once (another instance takes it over after the kill or past the lease; the workers
# resume by themselves once PostgreSQL or Garage is back). While PostgreSQL or Garage is down, the
# requests that need it answer 503 within a second with Retry-After and `database_unavailable` /
# `storage_unavailable`, /readyz says 503 within a second and /healthz 200; during the PostgreSQL
# outage the status of a job the instance saw succeed is answered from its job cache (200 with
# `X-Hypermnf-Stale: database_unavailable`), that of a running or unknown job is the 503.
#
# At the end: no 500 in any answer the script saw nor in the instances' logs; every accepted job
# succeeded, logged `job succeeded` exactly once across the logs, with the bytes of `hypermnf run`;
# no job queued or running; no scratch left in any instance's data dir; no object left in the bucket
# once every job is deleted; and bounded memory (below).
#
# Memory: each instance's VmHWM (peak resident set, the mapped uploads included) and RssAnon (its heap)
# are sampled every 0.5 s from /proc/PID/status, and both must stay below MEM_BOUND_MB = 560 MB. Why:
# one worker runs one job at a time, and the largest job here is a long one: a 1200 x 260 x 224 int16
# cube, 140 MB as uploaded and mapped, 560 MB were it all decoded to f64 at once (the CPU backend
# decodes it in blocks of lines); its outputs are small (3 components, 1 MB); an upload or a download in flight streams in
# parts of a few MB; the job cache's finished documents are a few KB here. Measured on two cores
# (2026-11-29, two runs): peaks of up to 427 MB VmHWM (140 MB of it the mapped cube) and up to 281 MB
# RssAnon per instance; RssAnon falls back between the jobs. 560 MB is 1.3 times the highest peak:
# allocator noise stays under it, while memory kept per job at the scale of a cube (a decoded cube is
# 560 MB) or buffers that grow with each outage cross it within these rounds. Smaller leaks are
# beyond this test.
#
# The CPU backend runs on one thread here (RAYON_NUM_THREADS=1, for the instances and for the
# `hypermnf run` they are compared with): the long job must still be running a second or two after it
# started, when the fault comes, and on two threads a 600-line job took only 1.15 s on a 2-core CI
# machine (2026-11-29) and ended first. One thread, 1200 lines: about 3 s of CPU for `hypermnf run`.
#
# Time: about 1.5 minutes on two cores (87-94 s measured, 2026-11-29). Environment: HYPERMNF_BIN
# (default target/debug/hypermnf, built if absent), CI_VENV (default .venv).
set -euo pipefail
export RAYON_NUM_THREADS=1
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=lib/garage.sh
source scripts/lib/garage.sh
# shellcheck source=lib/instances.sh
source scripts/lib/instances.sh

step() { echo "== chaos-test $(date +%H:%M:%S): $*"; }
fail() { echo "chaos-test: FAIL: $*" >&2; exit 1; }

LEASE=3s
SERVE_OPTS=(--workers 1 --lease "$LEASE" --backend cpu)
MEM_BOUND_MB=560
UPLOAD_RATE=1M     # the 4 MB upload lasts about 4 s
OUTAGE_S=12        # PostgreSQL and Garage stay down this long (the long job takes about 3-4 s)
DOWNLOAD_RATE=3M   # the 26 MB download lasts about 8 s, more than the sockets' buffers hold

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hypermnf-chaos.XXXXXX")
SAMPLER=
BG=()
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
    for pid in "${BG[@]}"; do kill "$pid" 2>/dev/null || true; done
    # A stopped instance would not see the SIGTERM.
    for pid in "${HYPERMNF_INSTANCE_PIDS[@]}"; do kill -CONT "$pid" 2>/dev/null || true; done
    hypermnf_instances_stop
    if [ "$rc" != 0 ]; then
        rm -rf "$ROOT/target/chaos-test-logs" && mkdir -p "$ROOT/target/chaos-test-logs"
        cp "$WORK"/node*.log "$WORK"/mem.log "$WORK"/statuses "$ROOT/target/chaos-test-logs/" 2>/dev/null || true
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
PY=$VENV/bin/python
if [ -z "${HYPERMNF_BIN:-}" ]; then
    HYPERMNF_BIN=$ROOT/target/debug/hypermnf
    [ -x "$HYPERMNF_BIN" ] || cargo build --bins
fi
export HYPERMNF_BIN

# ---- cubes: each job its own (the same cube and parameters again would be answered from the cache)

# cube N LINES SAMPLES BANDS: $WORK/cubeN.npy, int16, a few sources plus noise.
cube() { "$PY" -c "
import numpy as np, sys
n, lines, samples, bands = map(int, sys.argv[2:])
rng = np.random.default_rng(n)
x = rng.normal(0, 1, (lines, samples, 4)) @ rng.normal(0, 1, (4, bands)) * 40 + rng.normal(0, 3, (lines, samples, bands)) + 500
np.save(sys.argv[1], x.astype('<i2'))" "$WORK/cube$1.npy" "$@"; }

# ---- requests: every answer's status goes to $WORK/statuses (checked for 500s at the end)

STATUSES=$WORK/statuses
: >"$STATUSES"
# curl's answer as "STATUS SECONDS" (the body in $WORK/body, the headers in $WORK/headers).
call() {
    local out
    out=$(curl -s -o "$WORK/body" -D "$WORK/headers" -w '%{http_code} %{time_total}' --max-time 20 "$@") || true
    [ -n "$out" ] || out="000 20"
    echo "${out%% *} ${*: -1}" >>"$STATUSES"
    echo "$out"
}
# GET of URL $1 into file $2; prints the status (000 when no answer came).
fetch() {
    local status
    status=$(curl -s -o "$2" -w '%{http_code}' --max-time 60 "$1") || true
    status=${status:-000}
    echo "$status $1" >>"$STATUSES"
    echo "$status"
}
post() { call -X POST -H 'content-type: application/x-npy' --data-binary "@$WORK/cube$2.npy" "$1/v1/jobs?components=${3:-3}"; }
json_field() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$2" "$1"; }
job_status() { curl -s --max-time 5 "$1/v1/jobs/$2" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null || echo unknown; }

# Refused fast, as unavailable: STATUS SECONDS from `call`, the code expected.
expect_503() {
    local what=$1 got=$2 code=$3 status secs
    read -r status secs <<<"$got"
    [ "$status" = 503 ] || fail "$what: $status, not 503: $(cat "$WORK/body")"
    "$PY" -c "import sys; sys.exit(0 if float('$secs') < 1.0 else 1)" || fail "$what: the 503 took ${secs}s"
    grep -qi '^retry-after:' "$WORK/headers" || fail "$what: no Retry-After"
    grep -q "\"$code\"" "$WORK/body" || fail "$what: not $code: $(cat "$WORK/body")"
    echo "  $what: 503 $code in ${secs}s"
}

# ---- accepted jobs: id, cube, components (checked at the end)
ACC_IDS=()
ACC_CUBES=()
ACC_K=()
accept() { ACC_IDS+=("$1"); ACC_CUBES+=("$2"); ACC_K+=("$3"); }

# Submits cube $2 with $3 components to instance $1, expects 202; prints the job id.
submit() {
    local status
    read -r status _ <<<"$(post "$1" "$2" "$3")"
    [ "$status" = 202 ] || fail "POST of cube $2 to $1: $status $(cat "$WORK/body")"
    json_field id "$WORK/body"
}

# Waits (120 s) for job $2, asked of instance $1, to succeed.
wait_succeeded() {
    local url=$1 id=$2 deadline=$((SECONDS + 120)) status
    while :; do
        status=$(job_status "$url" "$id")
        [ "$status" = succeeded ] && return 0
        [ "$status" = failed ] && fail "job $id failed: $(curl -s "$url/v1/jobs/$id")"
        [ $SECONDS -lt $deadline ] || fail "job $id is still $status after 120 s"
        sleep 0.3
    done
}

# `hypermnf run`'s components of cube $1 with $2 components: $WORK/wantN-K.npy (computed once).
want() {
    local f=$WORK/want$1-$2.npy
    [ -f "$f" ] || "$HYPERMNF_BIN" run "$WORK/cube$1.npy" --out "$f" --components "$2" --backend cpu 2>/dev/null
    echo "$f"
}

# ---- the instances: started, restarted, and sampled

NODES=3
PIDS=()
URLS=()
start_all() {
    hypermnf_instances_start "$NODES" "$WORK" "${SERVE_OPTS[@]}" || fail "the instances did not start"
    PIDS=("${HYPERMNF_INSTANCE_PIDS[@]}")
    URLS=("${HYPERMNF_INSTANCE_URLS[@]}")
    write_pids
}
write_pids() {
    local i
    for i in "${!PIDS[@]}"; do echo "node$i ${PIDS[$i]}"; done >"$WORK/pids.tmp"
    mv "$WORK/pids.tmp" "$WORK/pids"
    # instances.sh stops what it started: keep it told of restarts.
    HYPERMNF_INSTANCE_PIDS=("${PIDS[@]}")
}

# Instance $1 started again on its data dir, its log appended to (its claims are under the same
# instance id, so it takes its own running jobs back at once), on a new port.
restart() {
    local i=$1 url deadline=$((SECONDS + 60))
    echo "--- restarted" >>"$WORK/node$i.log"
    NO_COLOR=1 "$HYPERMNF_BIN" serve --listen 127.0.0.1:0 --data-dir "$WORK/node$i" \
        --database-url "$HYPERMNF_TEST_POSTGRES_URL" --store "$HYPERMNF_TEST_S3_URL" "${SERVE_OPTS[@]}" \
        </dev/null >"$WORK/node$i.out" 2>>"$WORK/node$i.log" &
    PIDS[i]=$!
    write_pids
    until url=$(grep -o -m1 'http://127\.0\.0\.1:[0-9]*' "$WORK/node$i.out" 2>/dev/null); do
        kill -0 "${PIDS[$i]}" 2>/dev/null && [ $SECONDS -lt $deadline ] || fail "instance $i did not start again"
        sleep 0.2
    done
    URLS[i]=$url
    echo "  instance $i restarted: $url (pid ${PIDS[$i]})"
}

ready_again() {
    local url=$1 deadline=$((SECONDS + 60))
    until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url/readyz")" = 200 ]; do
        [ $SECONDS -lt $deadline ] || fail "$url is not ready within 60 s of the recovery"
        sleep 0.3
    done
}
all_ready_again() { local u; for u in "${URLS[@]}"; do ready_again "$u"; done; }

# Every 0.5 s, each instance's VmHWM and RssAnon (kB) to $WORK/mem.log as "NODE PID HWM ANON".
sample_memory() {
    while :; do
        while read -r node pid; do
            awk -v n="$node" -v p="$pid" '/^VmHWM:/ {h=$2} /^RssAnon:/ {a=$2} END {if (h) print n, p, h, a}' \
                "/proc/$pid/status" 2>/dev/null || true
        done <"$WORK/pids" >>"$WORK/mem.log"
        sleep 0.5
    done
}

# The instance whose log says it started job $1 last (the one running it).
runner_of() {
    local id=$1 i best= line
    for i in "${!PIDS[@]}"; do
        line=$(grep -n "job started.*job=$id" "$WORK/node$i.log" | tail -n 1 | cut -d: -f1 || true)
        [ -n "$line" ] && best=$i
    done
    echo "$best"
}

# ---- transfers in the background: each writes "STATUS SECONDS CURL_EXIT" to $WORK/TAG.status

slow_upload() {  # URL CUBE TAG
    local url=$1 n=$2 tag=$3
    (
        rc=0
        out=$(curl -s -o "$WORK/$tag.body" -D "$WORK/$tag.headers" -w '%{http_code} %{time_total}' --max-time 90 \
            --limit-rate "$UPLOAD_RATE" -X POST -H 'content-type: application/x-npy' -H 'Expect:' \
            --data-binary "@$WORK/cube$n.npy" "$url/v1/jobs?components=3") || rc=$?
        echo "${out:-000 0} $rc" >"$WORK/$tag.status"
    ) &
    BG+=("$!")
}

slow_download() {  # URL JOB TAG
    local url=$1 id=$2 tag=$3
    (
        rc=0
        out=$(curl -s -o "$WORK/$tag.npy" -w '%{http_code} %{time_total}' --max-time 90 --limit-rate "$DOWNLOAD_RATE" \
            "$url/v1/jobs/$id/result") || rc=$?
        echo "${out:-000 0} $rc" >"$WORK/$tag.status"
    ) &
    BG+=("$!")
}

wait_transfers() {
    local pid
    for pid in "${BG[@]}"; do wait "$pid" || true; done
    BG=()
}

# The upload TAG of cube N, its instance faulted by FAULT: accepted (kept for the end) or refused cleanly.
upload_outcome() {
    local tag=$1 n=$2 fault=$3 status secs rc
    read -r status secs rc <"$WORK/$tag.status"
    echo "$status upload $tag" >>"$STATUSES"
    case $status in
        202)
            accept "$(json_field id "$WORK/$tag.body")" "$n" 3
            echo "  upload: accepted (202 after ${secs}s)" ;;
        503)
            grep -Eq '"(database_unavailable|storage_unavailable)"' "$WORK/$tag.body" \
                || fail "upload during $fault: 503 without an unavailable code: $(cat "$WORK/$tag.body")"
            grep -qi '^retry-after:' "$WORK/$tag.headers" || fail "upload during $fault: 503 without Retry-After"
            echo "  upload: refused, $(grep -o '"code":"[a-z_]*"' "$WORK/$tag.body") after ${secs}s" ;;
        000)
            [ "$fault" = kill ] || fail "upload during $fault: no answer (curl exit $rc)"
            echo "  upload: connection lost with its instance (curl exit $rc)" ;;
        *) fail "upload during $fault: $status $(cat "$WORK/$tag.body" 2>/dev/null)" ;;
    esac
}

# The download TAG of job D: the right bytes, or a failure and the right bytes on a retry from URL.
download_outcome() {
    local tag=$1 url=$2 fault=$3 status secs rc
    read -r status secs rc <"$WORK/$tag.status"
    echo "$status download $tag" >>"$STATUSES"
    if [ "$status" = 200 ] && [ "$rc" = 0 ]; then
        cmp -s "$WORK/$tag.npy" "$D_WANT" || fail "download during $fault: complete (200) but other bytes than hypermnf run's"
        echo "  download: completed with the right bytes in ${secs}s"
        return
    fi
    case $status in 200 | 503 | 000) ;; *) fail "download during $fault: $status" ;; esac
    status=$(fetch "$url/v1/jobs/$D_ID/result" "$WORK/$tag.retry.npy")
    [ "$status" = 200 ] || fail "download retried after $fault: $status"
    cmp -s "$WORK/$tag.retry.npy" "$D_WANT" || fail "download retried after $fault: other bytes than hypermnf run's"
    echo "  download: broken off (status $status, curl exit $rc); the retry got the right bytes"
}

# ---- the set-up

step "PostgreSQL (durable), Garage, $NODES instances"
HYPERMNF_PG_DURABLE=1 hypermnf_postgres_start || fail "PostgreSQL did not start"
hypermnf_garage_start hypermnf-chaos chaos || fail "Garage did not start"
start_all
sample_memory &
SAMPLER=$!
for i in 1 2; do cube "$i" 60 50 24; done
cube 3 400 400 48                                 # the download's job: 26 MB of results with 40 components
for r in 1 2 3 4; do
    cube $((10 + r)) 1200 260 224                 # round r's long job (140 MB, seconds of CPU)
    cube $((20 + r)) 160 160 80                   # round r's upload (4 MB)
done

step "a job on each instance; the download's job"
accept "$(submit "${URLS[0]}" 1 3)" 1 3
accept "$(submit "${URLS[1]}" 2 3)" 2 3
D_ID=$(submit "${URLS[2]}" 3 40)
accept "$D_ID" 3 40
D_WANT=$(want 3 40)
wait_succeeded "${URLS[2]}" "$D_ID"
echo "  job $D_ID succeeded"

# ---- the rounds

# An outage that began at $1 (SECONDS) lasts OUTAGE_S: the long job ends its computation meanwhile
# and meets the outage when it stores or records its results.
outage_lasts() { while [ $((SECONDS - $1)) -lt "$OUTAGE_S" ]; do sleep 0.5; done; }

# round R FAULT: the long job of round R started, its runner V found; the download and the upload
# to V started; the fault; the recovery; the outcomes.
round() {
    local r=$1 fault=$2 id v deadline status down
    step "round $r: $fault during an upload, a running job and a download"
    # Every instance (a restarted one too) reads the download's job as succeeded: its job cache has it.
    for u in "${URLS[@]}"; do wait_succeeded "$u" "$D_ID"; done
    id=$(submit "${URLS[$((r % NODES))]}" $((10 + r)) 3)
    accept "$id" $((10 + r)) 3
    deadline=$((SECONDS + 60))
    until [ "$(job_status "${URLS[0]}" "$id")" = running ] && v=$(runner_of "$id") && [ -n "$v" ]; do
        [ $SECONDS -lt $deadline ] || fail "round $r: job $id is not running within 60 s"
        sleep 0.2
    done
    echo "  job $id runs on instance $v"
    slow_download "${URLS[$v]}" "$D_ID" "down$r"
    slow_upload "${URLS[$v]}" $((20 + r)) "up$r"
    sleep 1
    status=$(job_status "${URLS[$(((v + 1) % NODES))]}" "$id")
    [ "$status" = running ] || fail "round $r: job $id is $status at the fault, not running (make it longer)"
    case $fault in
        kill)
            kill -KILL "${PIDS[$v]}"
            wait "${PIDS[$v]}" 2>/dev/null || true
            wait_transfers
            upload_outcome "up$r" $((20 + r)) kill
            restart "$v"
            ;;
        stop)
            kill -STOP "${PIDS[$v]}"
            sleep 6
            kill -CONT "${PIDS[$v]}"
            wait_transfers
            upload_outcome "up$r" $((20 + r)) stop
            ;;
        postgres)
            hypermnf_postgres_crash
            down=$SECONDS
            local other=${URLS[$(((v + 1) % NODES))]} unknown
            expect_503 "POST /v1/jobs" "$(post "$other" 1 4)" database_unavailable
            expect_503 "GET /v1/jobs (list)" "$(call "$other/v1/jobs")" database_unavailable
            expect_503 "GET /v1/jobs/{id} of the running job" "$(call "$other/v1/jobs/$id")" database_unavailable
            unknown=$("$PY" -c 'import uuid; print(uuid.uuid4())')
            expect_503 "GET /v1/jobs/{id} of an unknown job" "$(call "$other/v1/jobs/$unknown")" database_unavailable
            read -r status secs <<<"$(call "$other/v1/jobs/$D_ID")"
            [ "$status" = 200 ] || fail "GET of the succeeded job $D_ID while the database is down: $status $(cat "$WORK/body")"
            grep -qi '^x-hypermnf-stale: database_unavailable' "$WORK/headers" || fail "the job cache's answer is not marked stale"
            [ "$(json_field status "$WORK/body")" = succeeded ] || fail "the job cache's answer: $(cat "$WORK/body")"
            echo "  GET /v1/jobs/{id} of a succeeded job: 200 from the job cache, marked stale, in ${secs}s"
            expect_503 "/readyz" "$(call "$other/readyz")" not_ready
            read -r status _ <<<"$(call "$other/healthz")"
            [ "$status" = 200 ] || fail "/healthz said $status while the database was down"
            # Down until the upload has ended: it meets the outage, not the recovery.
            wait_transfers
            upload_outcome "up$r" $((20 + r)) postgres
            outage_lasts "$down"
            hypermnf_postgres_restart || fail "PostgreSQL did not start again"
            ;;
        garage)
            hypermnf_garage_pause
            down=$SECONDS
            local other=${URLS[$(((v + 1) % NODES))]}
            expect_503 "POST /v1/jobs" "$(post "$other" 2 4)" storage_unavailable
            expect_503 "GET /v1/jobs/{id}/result" "$(call "$other/v1/jobs/$D_ID/result")" storage_unavailable
            expect_503 "/readyz" "$(call "$other/readyz")" not_ready
            read -r status _ <<<"$(call "$other/healthz")"
            [ "$status" = 200 ] || fail "/healthz said $status while the store was down"
            wait_transfers
            upload_outcome "up$r" $((20 + r)) garage
            outage_lasts "$down"
            hypermnf_garage_resume || fail "Garage did not start again"
            ;;
    esac
    all_ready_again
    download_outcome "down$r" "${URLS[$(((v + 2) % NODES))]}" "$fault"
    wait_succeeded "${URLS[$(((v + 1) % NODES))]}" "$id"
    echo "  job $id succeeded (last started on instance $(runner_of "$id"))"
}

round 1 kill
round 2 stop
round 3 postgres
round 4 garage

# ---- the checks

step "every accepted job succeeded once, with the bytes of hypermnf run"
for n in "${!ACC_IDS[@]}"; do
    id=${ACC_IDS[$n]}
    wait_succeeded "${URLS[$((n % NODES))]}" "$id"
    status=$(fetch "${URLS[$(((n + 1) % NODES))]}/v1/jobs/$id/result" "$WORK/got.npy")
    [ "$status" = 200 ] || fail "result of $id: $status"
    cmp -s "$WORK/got.npy" "$(want "${ACC_CUBES[$n]}" "${ACC_K[$n]}")" || fail "job $id: the result differs from hypermnf run's"
    times=$(cat "$WORK"/node*.log | grep -c "job succeeded.*job=$id" || true)
    [ "$times" = 1 ] || fail "job $id: 'job succeeded' logged $times times across the instances"
done
echo "  ${#ACC_IDS[@]} accepted jobs, each succeeded once with the bytes of hypermnf run"

step "no job stuck, no 500, no scratch left"
jobs=$(curl -s --max-time 5 "${URLS[0]}/v1/jobs?limit=1000")
"$PY" - "${ACC_IDS[@]}" <<PY || fail "the job list"
import json, sys
jobs = json.loads('''$jobs''')["jobs"]
ids = sorted(j["id"] for j in jobs)
assert ids == sorted(sys.argv[1:]), f"jobs {ids}, accepted {sorted(sys.argv[1:])}"
stuck = [(j["id"], j["status"]) for j in jobs if j["status"] != "succeeded"]
assert not stuck, f"not succeeded: {stuck}"
PY
if grep -v '^[0-9]\{3\} ' "$STATUSES" | grep -q .; then fail "unreadable status lines: $(grep -v '^[0-9]\{3\} ' "$STATUSES" | head -n 3)"; fi
! grep -q '^5[0-9][0-9] ' <(grep -v '^503 ' "$STATUSES") || fail "a 5xx other than 503: $(grep '^5' "$STATUSES" | grep -v '^503' | head -n 5)"
! grep -q 'internal error' "$WORK"/node*.log || fail "an internal error in the logs: $(grep -h 'internal error' "$WORK"/node*.log | head -n 3)"
! grep -q 'panicked' "$WORK"/node*.log || fail "a panic in the logs: $(grep -h 'panicked' "$WORK"/node*.log | head -n 3)"
echo "  $(wc -l <"$STATUSES") answers: $(cut -d' ' -f1 "$STATUSES" | sort | uniq -c | tr -s ' ' | tr '\n' ',')"
deadline=$((SECONDS + 15))
while left=$(find "$WORK"/node*/scratch "$WORK"/node*/objects/scratch -mindepth 1 2>/dev/null | head -n 5) && [ -n "$left" ]; do
    [ $SECONDS -lt $deadline ] || fail "scratch left behind: $left"
    sleep 0.3
done
echo "  no scratch left in any instance's data dir"

step "memory"
kill "$SAMPLER" 2>/dev/null || true
SAMPLER=
awk -v bound=$((MEM_BOUND_MB * 1024)) '
    { if ($3 > hwm[$1]) hwm[$1] = $3; if ($4 > anon[$1]) anon[$1] = $4; n[$1]++ }
    END {
        bad = 0
        for (k in hwm) {
            printf "  %s: VmHWM %d MB, RssAnon at most %d MB (%d samples)\n", k, hwm[k] / 1024, anon[k] / 1024, n[k]
            if (hwm[k] > bound || anon[k] > bound) bad = 1
        }
        if (length(hwm) == 0) bad = 1
        exit bad
    }' "$WORK/mem.log" || fail "an instance went past ${MEM_BOUND_MB} MB (or no memory was sampled)"

step "no orphan objects"
for id in "${ACC_IDS[@]}"; do
    curl -s -o /dev/null -w '%{http_code}\n' -X DELETE "${URLS[0]}/v1/jobs/$id" | grep -qx 204 || fail "DELETE $id"
done
# Nothing but the readiness probe's object may stay once every job is deleted: not the refused
# uploads' inputs, nor anything of the jobs.
"$PY" - <<'PY' || fail "objects left in the bucket after every job was deleted"
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
echo "chaos-test: ok ($SECONDS s)"
