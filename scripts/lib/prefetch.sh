# shellcheck shell=bash
# What the later test steps install, started in the background at the beginning of scripts/test.sh so
# that it overlaps the crate's own build instead of following it (a fresh CI machine has none of it):
#
#     hypermnf_prefetch_start    # after the Python environment, before the crate is built
#     hypermnf_prefetch_wait     # before the first step that needs PostgreSQL or Garage
#
# 1. Debian's packages (PostgreSQL, GDAL, Chromium, podman and mmdebstrap), through the same install
#    functions the steps call, one after the other: downloads and unpacking, little CPU;
# 2. Garage, built with `nice` (scripts/lib/garage.sh): it takes the cores the crate's build leaves idle
#    (linking, the long single-crate compiles at its end) rather than adding its whole build after it.
# Each step still calls its own install function, which finds the work done. A prefetch that failed is
# reported, and the step that needs it then installs or builds in the foreground, where its error shows.
# Logs: $HYPERMNF_PREFETCH_DIR/{packages,garage}.log.

hypermnf_prefetch_start() {
    HYPERMNF_PREFETCH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hypermnf-prefetch.XXXXXX")
    (
        set +e
        t0=$SECONDS
        hypermnf_postgres_install
        hypermnf_gdal_install
        if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
            echo "installing chromium chromium-driver (apt-get)"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
        fi
        # shellcheck source=container.sh
        source scripts/lib/container.sh
        hypermnf_container_tools
        echo "packages: $(( SECONDS - t0 )) s"
    ) >"$HYPERMNF_PREFETCH_DIR/packages.log" 2>&1 &
    HYPERMNF_PREFETCH_PACKAGES=$!
    (
        t0=$SECONDS
        hypermnf_garage_install && echo "garage: $(( SECONDS - t0 )) s"
    ) >"$HYPERMNF_PREFETCH_DIR/garage.log" 2>&1 &
    HYPERMNF_PREFETCH_GARAGE=$!
    echo "prefetch started: Debian packages (pid $HYPERMNF_PREFETCH_PACKAGES), garage (pid $HYPERMNF_PREFETCH_GARAGE); logs in $HYPERMNF_PREFETCH_DIR"
}

# Waits for both, and shows the end of their logs (a failure there is followed by the step's own install).
hypermnf_prefetch_wait() {
    [ -n "${HYPERMNF_PREFETCH_DIR:-}" ] || return 0
    local name pid rc
    for name in packages garage; do
        if [ "$name" = packages ]; then pid=$HYPERMNF_PREFETCH_PACKAGES; else pid=$HYPERMNF_PREFETCH_GARAGE; fi
        rc=0
        wait "$pid" || rc=$?
        echo "-- prefetch $name (exit $rc):"
        tail -n 20 "$HYPERMNF_PREFETCH_DIR/$name.log"
    done
    HYPERMNF_PREFETCH_DIR=
}

# Stops what is still running (test.sh's clean-up, when it ends early).
hypermnf_prefetch_stop() {
    [ -n "${HYPERMNF_PREFETCH_DIR:-}" ] || return 0
    local pid
    for pid in "$HYPERMNF_PREFETCH_PACKAGES" "$HYPERMNF_PREFETCH_GARAGE"; do
        pkill -TERM -P "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
    done
}
