# shellcheck shell=bash
# A real S3-compatible server for tests (Garage, https://garagehq.deuxfleurs.fr), no mock: source this
# file, then
#
#     hypermnf_garage_start [BUCKET [PREFIX]]   # exports AWS_* and HYPERMNF_TEST_S3_URL=s3://BUCKET/PREFIX
#     trap hypermnf_garage_stop EXIT            # (or call it from the caller's own cleanup)
#
# One single-node Garage in a fresh temp dir, every port (S3, RPC, admin) on 127.0.0.1, a random RPC
# secret, access key and admin token per start. `garage server --single-node --default-bucket` does
# the bootstrap inside the server before it opens its ports: it assigns this node the layout (zone
# dc1, capacity of its disk) and applies it, imports the access key from GARAGE_DEFAULT_ACCESS_KEY /
# GARAGE_DEFAULT_SECRET_KEY, creates the bucket GARAGE_DEFAULT_BUCKET and allows the key on it
# (read, write, owner). So once the admin API says healthy, S3 requests with the key work: no CLI
# round trips, no window where the bucket does not exist yet.
#
# The binary comes from crates.io (`cargo install garage`), built once per machine into
# ${HYPERMNF_TOOLS_DIR:-~/.cache/hypermnf-tools}/garage-2.5.0 and reused afterwards. That build took
# 57m44s wall clock (16m41s of CPU) on a 2-core machine shared with other compilations (release
# profile): a fresh CI machine pays it once; cache that directory between runs. HYPERMNF_GARAGE_BIN
# names a garage binary to use instead.
#
# hypermnf_garage_selfcheck puts, gets, lists and deletes an object with curl's SigV4 signing (no
# Python needed): proof that what runs is a working S3 endpoint with the exported credentials.

HYPERMNF_GARAGE_VERSION=2.5.0

hypermnf_garage_bin() {
    printf '%s\n' "${HYPERMNF_GARAGE_BIN:-${HYPERMNF_TOOLS_DIR:-$HOME/.cache/hypermnf-tools}/garage-$HYPERMNF_GARAGE_VERSION/bin/garage}"
}

hypermnf_garage_install() {
    local bin root
    bin=$(hypermnf_garage_bin)
    [ -x "$bin" ] && return 0
    if [ -n "${HYPERMNF_GARAGE_BIN:-}" ]; then
        echo "garage.sh: HYPERMNF_GARAGE_BIN=$HYPERMNF_GARAGE_BIN is not an executable" >&2
        return 1
    fi
    root=$(dirname "$(dirname "$bin")")
    # lmdb only (no sqlite, no k2v, no consul/kubernetes discovery, no telemetry): the least to build.
    echo "garage.sh: building garage $HYPERMNF_GARAGE_VERSION into $root (once per machine; about an hour on 2 busy cores)" >&2
    nice -n 10 cargo install garage --version "$HYPERMNF_GARAGE_VERSION" --locked --no-default-features \
        --features bundled-libs,lmdb --root "$root" || { echo "garage.sh: cargo install garage failed" >&2; return 1; }
    [ -x "$bin" ] || { echo "garage.sh: no binary at $bin after cargo install" >&2; return 1; }
}

hypermnf_garage_hex() {  # N random bytes as hex
    od -An -vtx1 -N "$1" /dev/urandom | tr -d ' \n'
}

hypermnf_garage_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The garage CLI against the running server (e.g. `hypermnf_garage_cli bucket info hypermnf-test`).
hypermnf_garage_cli() {
    "$(hypermnf_garage_bin)" -c "$HYPERMNF_GARAGE_DIR/garage.toml" "$@"
}

hypermnf_garage_start() {
    hypermnf_garage_stop
    hypermnf_garage_install || return 1
    local bucket=${1:-hypermnf-test} prefix=${2:-hypermnf} bin dir s3 rpc admin token key secret deadline code
    bin=$(hypermnf_garage_bin)
    dir=$(mktemp -d "${TMPDIR:-/tmp}/hypermnf-garage.XXXXXX")
    # Not exported, and tagged with this shell's pid: a script run from this one (which sources this
    # file again, e.g. cluster-test.sh from test.sh) starts its own server and never stops this one.
    HYPERMNF_GARAGE_SHELL=$$
    HYPERMNF_GARAGE_DIR=$dir
    token=$(hypermnf_garage_hex 32)
    key=GK$(hypermnf_garage_hex 12)
    secret=$(hypermnf_garage_hex 32)
    # Three free ports; a port lost to a race makes the server exit, which the wait below reports.
    s3=$(hypermnf_garage_free_port)
    rpc=$(hypermnf_garage_free_port)
    admin=$(hypermnf_garage_free_port)
    # compression off and no fsync: test data, and CPU is the scarce resource on CI machines.
    cat >"$dir/garage.toml" <<TOML
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "lmdb"
replication_factor = 1
compression_level = "none"
metadata_fsync = false
data_fsync = false
rpc_bind_addr = "127.0.0.1:$rpc"
rpc_public_addr = "127.0.0.1:$rpc"
rpc_secret = "$(hypermnf_garage_hex 32)"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$s3"

[admin]
api_bind_addr = "127.0.0.1:$admin"
admin_token = "$token"
TOML
    # The command in a file of its own: hypermnf_garage_resume starts the same server again.
    cat >"$dir/run.sh" <<RUN
GARAGE_DEFAULT_ACCESS_KEY=$key GARAGE_DEFAULT_SECRET_KEY=$secret GARAGE_DEFAULT_BUCKET=$bucket \\
    RUST_LOG=${HYPERMNF_GARAGE_LOG:-garage=warn} exec "$bin" -c "$dir/garage.toml" server --single-node --default-bucket
RUN
    bash "$dir/run.sh" </dev/null >>"$dir/garage.log" 2>&1 &
    HYPERMNF_GARAGE_PID=$!
    echo "$HYPERMNF_GARAGE_PID" >"$dir/garage.pid"
    # Ready = the admin API's /health answers 200 (layout applied, node up); bounded at 60 s.
    deadline=$((SECONDS + 60))
    while :; do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$admin/health" || true)
        [ "$code" = 200 ] && break
        if ! kill -0 "$HYPERMNF_GARAGE_PID" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
            tail -n 30 "$dir/garage.log" >&2
            echo "garage.sh: garage did not become healthy (admin /health: ${code:-no answer})" >&2
            hypermnf_garage_stop
            return 1
        fi
        sleep 0.2
    done
    export HYPERMNF_GARAGE_ADMIN_URL="http://127.0.0.1:$admin" HYPERMNF_GARAGE_ADMIN_TOKEN=$token
    export AWS_ENDPOINT_URL="http://127.0.0.1:$s3" AWS_ACCESS_KEY_ID=$key AWS_SECRET_ACCESS_KEY=$secret
    export AWS_REGION=garage AWS_DEFAULT_REGION=garage AWS_ALLOW_HTTP=true
    export HYPERMNF_TEST_S3_BUCKET=$bucket HYPERMNF_TEST_S3_URL="s3://$bucket/$prefix"
}

# The server stopped (SIGKILL, as a crash), its data, keys and ports kept.
hypermnf_garage_pause() {
    kill -KILL "$HYPERMNF_GARAGE_PID" 2>/dev/null || true
    wait "$HYPERMNF_GARAGE_PID" 2>/dev/null || true
}

# The paused server started again; returns once its admin API says it is healthy (60 s at most).
hypermnf_garage_resume() {
    local deadline code
    bash "$HYPERMNF_GARAGE_DIR/run.sh" </dev/null >>"$HYPERMNF_GARAGE_DIR/garage.log" 2>&1 &
    HYPERMNF_GARAGE_PID=$!
    deadline=$((SECONDS + 60))
    until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$HYPERMNF_GARAGE_ADMIN_URL/health" || true)" = 200 ]; do
        if ! kill -0 "$HYPERMNF_GARAGE_PID" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
            tail -n 30 "$HYPERMNF_GARAGE_DIR/garage.log" >&2
            echo "garage.sh: garage did not become healthy again" >&2
            return 1
        fi
        sleep 0.2
    done
}

hypermnf_garage_stop() {
    local dir=${HYPERMNF_GARAGE_DIR:-} pid=${HYPERMNF_GARAGE_PID:-} i
    [ -n "$dir" ] && [ "${HYPERMNF_GARAGE_SHELL:-}" = "$$" ] || return 0
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
    unset HYPERMNF_GARAGE_DIR HYPERMNF_GARAGE_PID HYPERMNF_GARAGE_SHELL HYPERMNF_GARAGE_ADMIN_URL HYPERMNF_GARAGE_ADMIN_TOKEN \
        AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION AWS_DEFAULT_REGION AWS_ALLOW_HTTP \
        HYPERMNF_TEST_S3_BUCKET HYPERMNF_TEST_S3_URL
    return 0
}

# Put, get, list and delete one object through the S3 API with the exported credentials.
hypermnf_garage_selfcheck() {
    local url="$AWS_ENDPOINT_URL/$HYPERMNF_TEST_S3_BUCKET" obj body got
    local sig=(--aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"
               -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -sS --fail --max-time 10)
    obj="selfcheck/$(hypermnf_garage_hex 4).txt"
    body="hypermnf garage selfcheck $(date +%s%N)"
    curl "${sig[@]}" -X PUT --data-binary "$body" "$url/$obj" >/dev/null \
        || { echo "garage.sh: selfcheck PUT failed" >&2; return 1; }
    got=$(curl "${sig[@]}" "$url/$obj") || { echo "garage.sh: selfcheck GET failed" >&2; return 1; }
    [ "$got" = "$body" ] || { echo "garage.sh: selfcheck GET returned other bytes" >&2; return 1; }
    curl "${sig[@]}" "$url?list-type=2&prefix=selfcheck%2F" | grep -q "<Key>$obj</Key>" \
        || { echo "garage.sh: selfcheck LIST does not show the object" >&2; return 1; }
    curl "${sig[@]}" -X DELETE "$url/$obj" >/dev/null || { echo "garage.sh: selfcheck DELETE failed" >&2; return 1; }
    curl "${sig[@]}" "$url?list-type=2&prefix=selfcheck%2F" | grep -q "<Key>" \
        && { echo "garage.sh: selfcheck object still listed after DELETE" >&2; return 1; }
    return 0
}
