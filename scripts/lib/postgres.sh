# shellcheck shell=bash
# A throwaway PostgreSQL server for tests: source this file, then
#
#     hypermnf_postgres_start            # exports HYPERMNF_TEST_POSTGRES_URL
#     trap hypermnf_postgres_stop EXIT   # (or call it from the caller's own cleanup)
#
# The server runs as the `postgres` user from a fresh temp dir, listens on 127.0.0.1 only, on a free
# port, with trust authentication (loopback, throwaway data) and durability off (fsync etc.: nothing
# here must survive a crash, and it makes the tests faster). Nothing is installed system-wide except
# Debian's `postgresql` package when no server binaries are found (a fresh CI machine has none).
# Starting again in the same shell first stops the previous server; stopping twice is harmless.
#
# HYPERMNF_PG_DURABLE=1 starts it as production runs it instead (fsync, synchronous_commit and
# full_page_writes on): a test that crashes the server (hypermnf_postgres_crash, then
# hypermnf_postgres_restart on the same data and port) must, or accepted jobs vanish with the crash.

# Where the server's binaries are: the newest major version installed.
hypermnf_postgres_bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && printf '%s\n' "$dir"
}

hypermnf_postgres_install() {
    hypermnf_postgres_bindir >/dev/null && return 0
    echo "postgres.sh: installing Debian's postgresql (no server binaries found)" >&2
    # The package would otherwise create and start a system-wide "main" cluster on port 5432, which
    # the tests don't use and which would be left running: tell postgresql-common not to create it.
    if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
        mkdir -p /etc/postgresql-common
        echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.conf
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold postgresql >/dev/null
    hypermnf_postgres_bindir >/dev/null || { echo "postgres.sh: postgresql installed but no initdb found" >&2; return 1; }
}

# A TCP port that nothing listens on right now (the server may still lose a race for it: start retries).
hypermnf_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Runs a command as the postgres user from a directory it may read (runuser keeps the caller's working
# directory, which postgres usually cannot enter, and the tools warn about it).
hypermnf_as_postgres() {
    (cd "$HYPERMNF_PG_DIR" && runuser -u postgres -- "$@")
}

hypermnf_postgres_start() {
    hypermnf_postgres_stop
    hypermnf_postgres_install || return 1
    local bin port attempt db=${1:-hypermnf}
    bin=$(hypermnf_postgres_bindir)
    # Not exported, and tagged with this shell's pid: a script run from this one (which sources this
    # file again, e.g. cluster-test.sh from test.sh) starts its own server and never stops this one.
    HYPERMNF_PG_SHELL=$$
    HYPERMNF_PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hypermnf-pg.XXXXXX")
    chown postgres: "$HYPERMNF_PG_DIR"
    if ! hypermnf_as_postgres "$bin/initdb" -D "$HYPERMNF_PG_DIR/data" -U postgres -A trust -E UTF8 \
            --no-sync >"$HYPERMNF_PG_DIR/initdb.log" 2>&1; then
        cat "$HYPERMNF_PG_DIR/initdb.log" >&2
        echo "postgres.sh: initdb failed" >&2
        hypermnf_postgres_stop
        return 1
    fi
    # Another process may take the free port between the check and the bind: try a few ports.
    # Dynamic shared memory in files under the data dir (mmap), not in /dev/shm: a container run on the
    # same machine (scripts/ci-container.sh) may empty /dev/shm, and the server then refuses every new
    # connection ("could not open shared memory segment"), as seen here.
    local durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    [ "${HYPERMNF_PG_DURABLE:-0}" = 1 ] && durability="-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
    for attempt in 1 2 3; do
        port=$(hypermnf_free_port)
        HYPERMNF_PG_OPTIONS="-c listen_addresses=127.0.0.1 -p $port -k $HYPERMNF_PG_DIR $durability \
                -c max_connections=200 -c dynamic_shared_memory_type=mmap"
        if hypermnf_as_postgres "$bin/pg_ctl" -D "$HYPERMNF_PG_DIR/data" -l "$HYPERMNF_PG_DIR/server.log" \
                -w -t 30 -s start -o "$HYPERMNF_PG_OPTIONS" >/dev/null 2>&1; then
            break
        fi
        port=
    done
    if [ -z "$port" ]; then
        tail -n 20 "$HYPERMNF_PG_DIR/server.log" >&2 || true
        echo "postgres.sh: the server did not start" >&2
        hypermnf_postgres_stop
        return 1
    fi
    if ! hypermnf_as_postgres "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres "$db" >&2; then
        echo "postgres.sh: createdb $db failed" >&2
        hypermnf_postgres_stop
        return 1
    fi
    HYPERMNF_PG_PORT=$port
    export HYPERMNF_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/$db"
}

# The server killed as a crash would (immediate stop: no checkpoint), its data and port kept.
hypermnf_postgres_crash() {
    hypermnf_as_postgres "$(hypermnf_postgres_bindir)/pg_ctl" -D "$HYPERMNF_PG_DIR/data" -m immediate -w -t 30 -s stop
}

# The crashed server started again on its data and port (it replays its write-ahead log).
hypermnf_postgres_restart() {
    hypermnf_as_postgres "$(hypermnf_postgres_bindir)/pg_ctl" -D "$HYPERMNF_PG_DIR/data" -l "$HYPERMNF_PG_DIR/server.log" \
        -w -t 60 -s start -o "$HYPERMNF_PG_OPTIONS" >/dev/null
}

hypermnf_postgres_stop() {
    local dir=${HYPERMNF_PG_DIR:-} bin
    [ -n "$dir" ] && [ "${HYPERMNF_PG_SHELL:-}" = "$$" ] || return 0
    if [ -f "$dir/data/postmaster.pid" ] && bin=$(hypermnf_postgres_bindir); then
        # immediate: no checkpoint, nothing is kept anyway.
        hypermnf_as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate -w -t 30 -s stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    unset HYPERMNF_PG_DIR HYPERMNF_PG_PORT HYPERMNF_PG_SHELL HYPERMNF_PG_OPTIONS HYPERMNF_TEST_POSTGRES_URL
    return 0
}
