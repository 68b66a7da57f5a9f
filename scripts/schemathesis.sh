#!/usr/bin/env bash
# Holds the live server to openapi.yaml with schemathesis (pip install schemathesis): starts
# `hypermnf serve` on a free loopback port with a temporary data dir and input root, runs the
# generated requests with the server-error and conformance checks, and exits non-zero on any failure.
#
#   scripts/schemathesis.sh [--release] [--max-examples N] [--max-time SECONDS]
#
# Environment: SCHEMATHESIS (the schemathesis command; default `schemathesis`), HYPERMNF_BIN (a built
# binary to use instead of building one).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
max_examples=40
max_time=240
while [ $# -gt 0 ]; do
    case "$1" in
        --release) profile=release ;;
        --max-examples) max_examples="$2"; shift ;;
        --max-time) max_time="$2"; shift ;;
        *) echo "usage: $0 [--release] [--max-examples N] [--max-time SECONDS]" >&2; exit 2 ;;
    esac
    shift
done

st="${SCHEMATHESIS:-schemathesis}"
if ! command -v "$st" >/dev/null; then
    # Not installed: put it in the project's .venv (git-ignored; scripts/test.sh makes it), or make one.
    [ -x .venv/bin/python ] || python3 -m venv .venv
    echo "installing schemathesis into .venv ..." >&2
    .venv/bin/python -m pip install -q schemathesis >&2
    st=.venv/bin/schemathesis
fi

bin="${HYPERMNF_BIN:-}"
if [ -z "$bin" ]; then
    if [ "$profile" = release ]; then cargo build --release --bin hypermnf >&2; else cargo build --bin hypermnf >&2; fi
    bin="target/$profile/hypermnf"
fi

tmp="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/inputs"
# A small upload limit keeps generated bodies cheap; the CPU backend keeps the run device-independent.
"$bin" serve --listen 127.0.0.1:0 --data-dir "$tmp/data" --input-root "$tmp/inputs" --backend cpu \
    --max-upload-bytes 1048576 >"$tmp/stdout" 2>"$tmp/server.log" &
server_pid=$!

url=""
for _ in $(seq 1 200); do
    url="$(sed -n 's/^listening on //p' "$tmp/stdout" | head -n1)"
    [ -n "$url" ] && break
    kill -0 "$server_pid" 2>/dev/null || { echo "the server did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { echo "the server did not report its address" >&2; exit 1; }
echo "server at $url" >&2

set +e
"$st" run openapi.yaml --url "$url" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
    --max-examples "$max_examples" --max-time "$max_time" --workers 1 --request-timeout 30 \
    --suppress-health-check all --generation-database none --no-color
rc=$?
set -e
if grep -q "panicked" "$tmp/server.log"; then
    echo "the server panicked:" >&2
    grep -A5 "panicked" "$tmp/server.log" >&2
    rc=1
fi
kill -0 "$server_pid" 2>/dev/null || { echo "the server died during the run" >&2; rc=1; }
exit $rc
