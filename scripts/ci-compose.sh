#!/usr/bin/env bash
# docker/compose.cluster.yaml brought up for real with podman, where no image registry can be reached:
#   1. podman-compose from PyPI (Debian 12's 1.0.3 cannot run this file: docker/README.md says why);
#   2. local stand-ins for the two public images the file names, passed as POSTGRES_IMAGE and
#      GARAGE_IMAGE: PostgreSQL from Debian's package (docker/stand-ins/postgres) and Garage from the
#      binary scripts/lib/garage.sh builds from crates.io (docker/stand-ins/garage); hypermnf itself is
#      the image scripts/ci-container.sh built (localhost/hypermnf:ci), passed as HYPERMNF_IMAGE;
#   3. the compose file itself, unchanged, with fresh secrets in its env file: PostgreSQL + Garage + two
#      instances on a podman bridge network (names resolved by podman's DNS), ports on 127.0.0.1;
#   4. a job submitted to A is polled and downloaded through B and equals `hypermnf run` byte for byte;
#      the identical request on B is a cache hit; a job deleted through A leaves no object in the bucket;
#   5. `podman-compose down` and `up` again (volumes kept): the job and its result are still there, on
#      both instances;
#   6. `down -v`: containers, network and volumes go (images stay, as caches).
# Run by scripts/ci-container.sh after its own checks (it needs the image that script builds).
# Environment: HYPERMNF_TOOLS_DIR (default ~/.cache/hypermnf-tools), HYPERMNF_BIN (the host's build to
# compare with; default target/debug/hypermnf, built if missing), CI_VENV (default .venv),
# HYPERMNF_CI_A_PORT / HYPERMNF_CI_B_PORT (default 18081 / 18082).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

fail() { echo "ci-compose: FAIL: $*" >&2; exit 1; }
step() { echo "== ci-compose: $* ($(( SECONDS - t0 ))s)"; }
t0=$SECONDS

HYPERMNF_IMAGE=${HYPERMNF_IMAGE:-localhost/hypermnf:ci}
POSTGRES_IMAGE=localhost/hypermnf-standin/postgres:15-bookworm
GARAGE_IMAGE=localhost/hypermnf-standin/garage:2.5.0
PROJECT=hypermnf-ci-cluster
A_PORT=${HYPERMNF_CI_A_PORT:-18081}
B_PORT=${HYPERMNF_CI_B_PORT:-18082}
CUBE=tests/data/salinasA_224_bip_be

# ---- 1. tools -------------------------------------------------------------------------------------------
step "tools"
# shellcheck source=lib/container.sh
source scripts/lib/container.sh
# shellcheck source=lib/garage.sh
source scripts/lib/garage.sh
hypermnf_container_tools
VENV=${CI_VENV:-.venv}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# 1.6.0: `depends_on` conditions, `name:`, secrets and env files as Compose v2 reads them.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check podman-compose==1.6.0
podman image exists "$HYPERMNF_IMAGE" || fail "no image $HYPERMNF_IMAGE: run scripts/ci-container.sh"

work=$(mktemp -d)
compose() {
    "$VENV/bin/podman-compose" --in-pod=false -p "$PROJECT" \
        -f "$work/compose.cluster.yaml" --env-file "$work/cluster.env" "$@"
}
cleanup() {
    compose down -v -t 5 >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# ---- 2. stand-in images ---------------------------------------------------------------------------------
step "stand-in images"
hypermnf_base_debian
hypermnf_base_postgres
podman build --quiet --format docker --pull=never --network none \
    --build-arg BASE_IMAGE="$BASE_POSTGRES" -t "$POSTGRES_IMAGE" docker/stand-ins/postgres >/dev/null \
    || fail "building $POSTGRES_IMAGE failed"
hypermnf_garage_install
mkdir "$work/garage-context"
cp "$(hypermnf_garage_bin)" "$work/garage-context/garage"
podman build --quiet --format docker --pull=never --network none \
    --build-arg BASE_IMAGE="$BASE_DEBIAN" -t "$GARAGE_IMAGE" \
    -f docker/stand-ins/garage/Dockerfile "$work/garage-context" >/dev/null \
    || fail "building $GARAGE_IMAGE failed"
for image in "$HYPERMNF_IMAGE" "$POSTGRES_IMAGE" "$GARAGE_IMAGE"; do
    echo "$image: $(( $(podman image inspect --format '{{.Size}}' "$image") / 1000000 )) MB"
done

# ---- 3. the compose file, with fresh secrets ------------------------------------------------------------
# The file and garage.toml as they are in the repository, in a directory of their own, where the secrets
# it reads (api-keys.txt, cluster.env) are written.
step "compose up"
cp docker/compose.cluster.yaml docker/garage.toml "$work/"
hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }
key="ci-$(hex 16)"
printf 'ci:%s\n' "$key" >"$work/api-keys.txt"
chmod 644 "$work/api-keys.txt"
cat >"$work/cluster.env" <<ENV
POSTGRES_PASSWORD=$(hex 24)
S3_ACCESS_KEY_ID=GK$(hex 12)
S3_SECRET_ACCESS_KEY=$(hex 32)
S3_BUCKET=hypermnf
GARAGE_RPC_SECRET=$(hex 32)
HYPERMNF_IMAGE=$HYPERMNF_IMAGE
POSTGRES_IMAGE=$POSTGRES_IMAGE
GARAGE_IMAGE=$GARAGE_IMAGE
HYPERMNF_A_PORT=$A_PORT
HYPERMNF_B_PORT=$B_PORT
ENV
# What an earlier run killed before its clean-up left.
compose down -v -t 5 >/dev/null 2>&1 || true

container_of() {
    podman ps -a -q --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" | head -n1
}
# podman 4.3 lacks the `podman wait --condition=healthy` that podman-compose uses for `condition:
# service_healthy` (it warns and goes on), and without systemd no health check runs by itself. So this
# script brings the services up in the order the file's depends_on gives, and runs each container's own
# health check until it passes (hypermnf_wait_healthy).
wait_healthy() {
    local id
    id=$(container_of "$1")
    [ -n "$id" ] || fail "no container for $1"
    hypermnf_wait_healthy "$id" "$1" 150
}
garage() { podman exec "$(container_of garage)" /garage -c /etc/garage.toml "$@"; }
# Garage has no health check (neither has its public image): it is ready once its bootstrap made the
# bucket.
wait_garage() {
    local started=$SECONDS
    until garage bucket info hypermnf >/dev/null 2>&1; do
        [ $(( SECONDS - started )) -lt 90 ] || { podman logs "$(container_of garage)" >&2; fail "garage not ready within 90 s"; }
        sleep 0.5
    done
    echo "garage ready, bucket hypermnf exists ($(( SECONDS - started ))s)"
}
bucket_objects() { garage bucket info hypermnf | awk '/^Objects:/ {print $2}'; }
up() {
    local started=$SECONDS
    compose up -d --no-build postgres garage >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "compose up (postgres, garage)"; }
    wait_healthy postgres
    wait_garage
    compose up -d --no-build >>"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "compose up"; }
    wait_healthy hypermnf-a
    wait_healthy hypermnf-b
    # Healthy inside the container is not yet reachable from the host: after a `down` and `up` the
    # published ports answered only a moment later (curl: connection refused, seen on a loaded machine).
    local port
    for port in "$A_PORT" "$B_PORT"; do
        until curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/healthz"; do
            [ $(( SECONDS - started )) -lt 200 ] || fail "port $port does not answer from the host"
            sleep 0.5
        done
    done
    echo "cluster up in $(( SECONDS - started ))s; restarts: $(for s in postgres garage hypermnf-a hypermnf-b; do
        printf '%s %s  ' "$s" "$(podman inspect --format '{{.RestartCount}}' "$(container_of "$s")")"; done)"
}
up
podman ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}  {{.Image}}  {{.Status}}  {{.Ports}}'

# ---- 4. a job across the instances ----------------------------------------------------------------------
A=http://127.0.0.1:$A_PORT
B=http://127.0.0.1:$B_PORT
api() { curl -fsS --max-time 60 -H "Authorization: Bearer $key" "$@"; }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
submit() {  # submit BASE_URL COMPONENTS -> the job's JSON
    api -X POST "$1/v1/jobs" -F "header=@$CUBE.hdr" -F "data=@$CUBE.img" -F "params={\"components\": $2}"
}
wait_succeeded() {  # wait_succeeded BASE_URL JOB
    local deadline=$(( SECONDS + 300 )) status
    while :; do
        status=$(api "$1/v1/jobs/$2" | json "['status']")
        case "$status" in
            succeeded) return 0 ;;
            failed|canceled) api "$1/v1/jobs/$2" >&2; fail "job $2 $status" ;;
        esac
        [ $SECONDS -lt $deadline ] || fail "job $2 still $status after 300 s"
        sleep 0.5
    done
}

step "submit $CUBE to A, poll and download through B"
objects_empty=$(bucket_objects)
job=$(submit "$A" 10 | json "['id']")
wait_succeeded "$B" "$job"
api "$B/v1/jobs/$job/result" -o "$work/b.npy"
api "$A/v1/jobs/$job/result" -o "$work/a.npy"
bin=${HYPERMNF_BIN:-target/debug/hypermnf}
[ -x "$bin" ] || nice -n 10 cargo build --locked --quiet --bin hypermnf
"$bin" run "$CUBE.hdr" --components 10 --out "$work/host.npy" 2>/dev/null
cmp "$work/host.npy" "$work/b.npy" || fail "B's result differs from hypermnf run"
cmp "$work/host.npy" "$work/a.npy" || fail "A's result differs from hypermnf run"
echo "job $job: result through A and B identical to hypermnf run ($(stat -c %s "$work/b.npy") bytes)"
# (|| true: an instance whose log does not name the job must not end the script under set -e)
ran_on=$(for s in hypermnf-a hypermnf-b; do podman logs "$(container_of $s)" 2>&1 | grep -q "$job" && printf '%s ' "$s" || true; done)
echo "instances whose log names the job: ${ran_on:-none}; objects in the bucket: $objects_empty before, $(bucket_objects) after"

step "the identical request on B"
[ "$(submit "$B" 10 | json "['id']")" = "$job" ] || fail "the identical request on B made a new job"
[ "$(submit "$B" 10 | json "['cached']")" = True ] || fail "the identical request on B is not cached"
echo "B answered with job $job, cached: true"

step "a job deleted through A leaves nothing in the bucket"
before=$(bucket_objects)
other=$(submit "$B" 4 | json "['id']")
wait_succeeded "$A" "$other"
during=$(bucket_objects)
api -X DELETE "$A/v1/jobs/$other" >/dev/null
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" "$B/v1/jobs/$other")
[ "$code" = 404 ] || fail "the deleted job answers $code on B"
after=$(bucket_objects)
echo "objects: $before before job $other, $during with it, $after after DELETE"
[ "$during" -gt "$before" ] || fail "job $other stored nothing in the bucket?"
[ "$after" = "$before" ] || fail "DELETE left $(( after - before )) objects behind"

# ---- 5. down and up again -------------------------------------------------------------------------------
step "compose down, up again (volumes kept)"
compose down -t 10 >>"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "compose down"; }
[ -z "$(container_of hypermnf-a)" ] || fail "compose down left containers"
up
for url in "$A" "$B"; do
    [ "$(api "$url/v1/jobs/$job" | json "['status']")" = succeeded ] || fail "after the restart job $job is not succeeded on $url"
    api "$url/v1/jobs/$job/result" -o "$work/again.npy"
    cmp "$work/host.npy" "$work/again.npy" || fail "the result on $url changed across the restart"
done
echo "job $job and its result survived down/up on both instances"

step "done"
echo "ci-compose: all checks passed"
