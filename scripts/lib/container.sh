# Shared by scripts/ci-container.sh and scripts/ci-compose.sh (source it; `fail` and `step` must be
# defined): podman and mmdebstrap from Debian's packages, podman's settings for these machines, and
# base images made from Debian's mirror with mmdebstrap, cached as tarballs under
# ${HYPERMNF_TOOLS_DIR:-~/.cache/hypermnf-tools}/container and imported into podman's store when missing.

CONTAINER_CACHE=${HYPERMNF_TOOLS_DIR:-$HOME/.cache/hypermnf-tools}/container
mkdir -p "$CONTAINER_CACHE"

# Installs podman (+ runc, slirp4netns, mmdebstrap) when missing and writes podman's settings for these
# scripts only (CONTAINERS_CONF), not the machine's:
# - runc, not crun: these machines mount cgroup v1 with a cgroup2 hierarchy beside it ("hybrid"), which
#   Debian 12's crun refuses to run under;
# - explicit ulimits: podman's defaults raise RLIMIT_NOFILE/NPROC above what this sandbox lets a process
#   raise them to, and the container then fails to start; these are at most the host's limits;
# - events to a file: there is no journald.
hypermnf_container_tools() {
    local need=() tool
    for tool in podman runc slirp4netns mmdebstrap; do
        command -v "$tool" >/dev/null || need+=("$tool")
    done
    if [ ${#need[@]} -gt 0 ]; then
        echo "installing ${need[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    podman --version
    cat >"$CONTAINER_CACHE/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
    export CONTAINERS_CONF="$CONTAINER_CACHE/containers.conf"
}

# Debian's mirror is the only source of the bases.
CONTAINER_MIRROR=(
    "deb http://deb.debian.org/debian bookworm main"
    "deb http://deb.debian.org/debian bookworm-updates main"
    "deb http://deb.debian.org/debian-security bookworm-security main"
)
# This machine's extra CA certificates go into the bases, as into the host's own trust store: here the
# registries (crates.io, PyPI) are reached through a TLS-intercepting proxy whose CA only they know, and
# cargo and pip in the build stages fail with "self-signed certificate in certificate chain" without
# it. Where there are none (a normal host), nothing is added. Their hash is in the tarballs' names.
shopt -s nullglob
_extra_ca=(/usr/local/share/ca-certificates/*.crt)
shopt -u nullglob
CONTAINER_CA_HOOKS=()
CONTAINER_CA_TAG=none
if [ ${#_extra_ca[@]} -gt 0 ]; then
    CONTAINER_CA_TAG=$(cat "${_extra_ca[@]}" | sha256sum | cut -c1-8)
    CONTAINER_CA_HOOKS=(--customize-hook="copy-in ${_extra_ca[*]} /usr/local/share/ca-certificates/"
                        --customize-hook='chroot "$1" update-ca-certificates >/dev/null')
fi
BASE_DEBIAN=localhost/hypermnf-base/debian:bookworm-ca-$CONTAINER_CA_TAG
BASE_POSTGRES=localhost/hypermnf-base/postgres:bookworm-ca-$CONTAINER_CA_TAG

# mmdebstrap TARBALL [mmdebstrap options...]: a bookworm minbase into TARBALL unless it is there.
# --format=tar always (a name that does not end in .tar would make mmdebstrap write a directory): the
# chroot is then a temporary directory that mmdebstrap unmounts and removes itself.
hypermnf_mmdebstrap() {
    local tar=$1
    shift
    [ -s "$tar" ] && return 0
    step "mmdebstrap $tar"
    nice -n 10 mmdebstrap --quiet --format=tar --variant=minbase "${CONTAINER_CA_HOOKS[@]}" "$@" \
        bookworm "$tar.tmp" "${CONTAINER_MIRROR[@]}" && mv "$tar.tmp" "$tar"
}

# hypermnf_import TARBALL IMAGE [--change ...]: imports TARBALL as IMAGE unless podman has it (the image
# store may have been wiped while the tarballs stayed).
hypermnf_import() {
    local tar=$1 image=$2
    shift 2
    podman image exists "$image" && return 0
    step "import $image"
    podman import -q "$@" "$tar" "$image" >/dev/null
}

# The runtime base (DEBIAN_IMAGE of docker/Dockerfile, and of the Garage stand-in): minbase + CA
# certificates.
hypermnf_base_debian() {
    local tar="$CONTAINER_CACHE/debian-bookworm-minbase-ca-$CONTAINER_CA_TAG.tar"
    hypermnf_mmdebstrap "$tar" --include=ca-certificates || fail "mmdebstrap failed"
    hypermnf_import "$tar" "$BASE_DEBIAN" --change 'CMD ["/bin/bash"]'
}

# The base of the PostgreSQL stand-in (docker/stand-ins/postgres): minbase + Debian's postgresql (15).
hypermnf_base_postgres() {
    local tar="$CONTAINER_CACHE/postgres-bookworm-minbase-ca-$CONTAINER_CA_TAG.tar"
    hypermnf_mmdebstrap "$tar" --include=ca-certificates,postgresql || fail "mmdebstrap failed"
    hypermnf_import "$tar" "$BASE_POSTGRES" --change 'CMD ["/bin/bash"]'
}

# hypermnf_wait_healthy CONTAINER LABEL SECONDS: podman runs health checks from systemd timers, and there
# is no systemd here, so this runs the container's own HEALTHCHECK by hand until it passes (`podman
# healthcheck run` also records the status that `podman inspect` shows). Fails if the container exits
# first or is not healthy within SECONDS.
hypermnf_wait_healthy() {
    local id=$1 label=$2 limit=$3 started=$SECONDS
    until podman healthcheck run "$id" >/dev/null 2>&1; do
        if [ "$(podman inspect --format '{{.State.Running}}' "$id")" != true ]; then
            podman logs "$id" >&2 || true
            fail "$label exited before it was healthy"
        fi
        [ $(( SECONDS - started )) -lt "$limit" ] || { podman logs "$id" >&2; fail "$label not healthy within $limit s"; }
        sleep 0.5
    done
    [ "$(podman inspect --format '{{.State.Health.Status}}' "$id")" = healthy ] || fail "$label: health status is not healthy"
    echo "$label healthy ($(( SECONDS - started ))s)"
    # A slow start passed, but say why: on 2026-11-28 a CI run took 35 and 54 s here where others take
    # 0 s. The container's start time and its warnings (hypermnf logs each database retry at start).
    if [ $(( SECONDS - started )) -ge 10 ]; then
        echo "  slow start of $label: started at $(podman inspect --format '{{.State.StartedAt}}' "$id"), now $(date -u +%H:%M:%S); its warnings:"
        podman logs "$id" 2>&1 | grep -E 'WARN|ERROR|error' | grep -v 'upload limit' | tail -n 12 | cut -c1-300 | sed 's/^/    /' || true
    fi
}
