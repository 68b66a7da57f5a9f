#!/bin/sh
# The stand-in postgres image's entrypoint: on an empty data directory, initdb with POSTGRES_USER as the
# superuser and POSTGRES_PASSWORD as its password (scram-sha-256 over TCP, trust only on the container's
# own Unix socket), create POSTGRES_DB; then run the server as the `postgres` user, listening on every
# interface of the container's network. Root runs only this script (to own the volume); the server
# never does.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

if [ "${1:-postgres}" != postgres ]; then
    exec "$@"
fi
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    chown postgres "$pwfile"
    as_postgres initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    # initdb allows TCP from the loopback only; the other containers of the network are "all".
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        # The initialising server listens on a private socket only: the health check (pg_isready on
        # the usual socket) must not pass, nor clients connect, before the real server runs.
        init_socket=$(mktemp -d)
        chown postgres "$init_socket"
        as_postgres pg_ctl --pgdata="$PGDATA" --silent --wait \
            -o "-c listen_addresses='' -c unix_socket_directories=$init_socket" start
        as_postgres psql --quiet --host="$init_socket" --username="$user" --dbname=postgres \
            --command="CREATE DATABASE \"$db\" OWNER \"$user\""
        as_postgres pg_ctl --pgdata="$PGDATA" --silent --wait --mode=fast stop
        rm -rf "$init_socket"
    fi
    echo "docker-entrypoint: initialised $PGDATA (superuser $user, database $db)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*'
