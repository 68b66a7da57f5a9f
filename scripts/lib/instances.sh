# shellcheck shell=bash
# Sourceable: N `hypermnf serve` instances on loopback ports sharing the PostgreSQL job store and the S3
# bucket that scripts/lib/postgres.sh and scripts/lib/garage.sh started (their variables must be set).
#
#   hypermnf_instances_start N WORKDIR [serve options...]   sets HYPERMNF_INSTANCE_PIDS and _URLS (arrays);
#                                                           logs in WORKDIR/nodeI.log, stdout in nodeI.out
#   hypermnf_instances_stop                                 SIGTERM, then SIGKILL after 10 s
#
# Needs HYPERMNF_BIN. All instances start at once, as a cluster would: they race for the schema
# migrations on purpose. Port 0: each picks a free port and prints it ("listening on http://ADDR"), so
# no port can be lost to a race. NO_COLOR: plain log lines (tests grep `job started` / `job=<id>`).

HYPERMNF_INSTANCE_PIDS=()
HYPERMNF_INSTANCE_URLS=()

hypermnf_instances_start() {
    local n=$1 work=$2 i url deadline
    shift 2
    HYPERMNF_INSTANCE_PIDS=()
    HYPERMNF_INSTANCE_URLS=()
    for i in $(seq 0 $((n - 1))); do
        NO_COLOR=1 "$HYPERMNF_BIN" serve --listen 127.0.0.1:0 --data-dir "$work/node$i" \
            --database-url "$HYPERMNF_TEST_POSTGRES_URL" --store "$HYPERMNF_TEST_S3_URL" "$@" \
            </dev/null >"$work/node$i.out" 2>"$work/node$i.log" &
        HYPERMNF_INSTANCE_PIDS+=("$!")
    done
    for i in $(seq 0 $((n - 1))); do
        deadline=$((SECONDS + 60))
        until url=$(grep -o -m1 'http://127\.0\.0\.1:[0-9]*' "$work/node$i.out" 2>/dev/null); do
            if ! kill -0 "${HYPERMNF_INSTANCE_PIDS[$i]}" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
                tail -n 30 "$work/node$i.log" >&2
                echo "instances.sh: instance $i did not print its address within 60 s" >&2
                return 1
            fi
            sleep 0.2
        done
        until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url/readyz")" = 200 ]; do
            if ! kill -0 "${HYPERMNF_INSTANCE_PIDS[$i]}" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
                tail -n 30 "$work/node$i.log" >&2
                echo "instances.sh: instance $i ($url) is not ready (/readyz) within 60 s" >&2
                return 1
            fi
            sleep 0.2
        done
        HYPERMNF_INSTANCE_URLS+=("$url")
        echo "instance $i: $url (pid ${HYPERMNF_INSTANCE_PIDS[$i]})"
    done
}

hypermnf_instances_stop() {
    local pid i
    # SIGTERM first (graceful: workers give their jobs back), then SIGKILL after 10 s.
    for pid in "${HYPERMNF_INSTANCE_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${HYPERMNF_INSTANCE_PIDS[@]}"; do
        for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    HYPERMNF_INSTANCE_PIDS=()
    HYPERMNF_INSTANCE_URLS=()
}
