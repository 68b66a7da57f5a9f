#!/usr/bin/env bash
# The container, built and run for real with podman, where no container registry can be reached:
#   1. installs podman (+ runc, slirp4netns, mmdebstrap) from Debian's packages if they are missing;
#   2. makes the two base images docker/Dockerfile needs from Debian's mirror with mmdebstrap (a bookworm
#      minbase for DEBIAN_IMAGE; the same with gcc and this machine's Rust toolchain for RUST_IMAGE),
#      once: the tarballs are cached under $HYPERMNF_TOOLS_DIR/container and reused by later runs;
#   3. builds the image from docker/Dockerfile with those bases (cargo's registry and target dir are
#      cache mounts and the layers are kept, so a warm re-run compiles the crate only if it changed);
#   4. runs it (own network namespace, port published on 127.0.0.1 only, named volume on /data, API
#      keys from a mounted file), waits for the image's own HEALTHCHECK to pass, submits a real ENVI
#      cube as multipart, polls, downloads the result and compares it byte for byte with `hypermnf run`
#      of the host's build; checks that the server process runs as uid 10001, not root;
#   5. replaces the container by a new one on the same volume and checks the job and its result are
#      still there;
#   6. removes the containers and the volume it made (the bases and the image stay, as caches);
#   7. brings up docker/compose.cluster.yaml with that image (scripts/ci-compose.sh).
# Environment: HYPERMNF_TOOLS_DIR (default ~/.cache/hypermnf-tools), HYPERMNF_BIN (the host's build to
# compare with; default target/debug/hypermnf, built if missing), HYPERMNF_CI_PORT (default 18080).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "ci-container: FAIL: $*" >&2; exit 1; }
step() { echo "== ci-container: $* ($(( SECONDS - t0 ))s)"; }
t0=$SECONDS

IMAGE=localhost/hypermnf:ci
NAME=hypermnf-ci
VOLUME=hypermnf-ci-data
PORT=${HYPERMNF_CI_PORT:-18080}
CUBE=tests/data/salinasA_224_bip_be

# ---- 1. tools -------------------------------------------------------------------------------------------
step "tools"
# shellcheck source=lib/container.sh
source scripts/lib/container.sh
hypermnf_container_tools

cleanup() {
    podman rm -f -t 5 "$NAME" >/dev/null 2>&1 || true
    podman volume rm -f "$VOLUME" >/dev/null 2>&1 || true
    rm -rf "$work"
}
work=$(mktemp -d)
trap cleanup EXIT
# Containers and volume of an earlier run that was killed before its own clean-up.
podman rm -f -t 5 "$NAME" >/dev/null 2>&1 || true
podman volume rm -f "$VOLUME" >/dev/null 2>&1 || true

# ---- 2. base images -------------------------------------------------------------------------------------
# Debian's mirror is the only source (scripts/lib/container.sh). The Rust toolchain is this machine's own
# (rustup's, the one CI builds the crate with), copied into the builder base without its docs: Debian
# 12's rustc (1.63) is far too old for the crate, and no other toolchain can be fetched here. The
# tarball's name carries the toolchain's version, so a toolchain update makes a new base.
sysroot=$(rustc --print sysroot)
rust_version=$(rustc --version | awk '{print $2}')
rust_tar="$CONTAINER_CACHE/rust-$rust_version-bookworm-ca-$CONTAINER_CA_TAG.tar"
BASE_RUST=localhost/hypermnf-base/rust:$rust_version-bookworm-ca-$CONTAINER_CA_TAG
# The two bases are made side by side (downloads and unpacking, on a cold machine).
hypermnf_mmdebstrap "$rust_tar" --include=gcc,libc6-dev,pkg-config,ca-certificates \
    --customize-hook="mkdir -p \"\$1/usr/local/rust\" \"\$1/usr/local/cargo/bin\"" \
    --customize-hook="tar -C '$sysroot' --exclude=./share -cf - . | tar -C \"\$1/usr/local/rust\" -xf -" \
    --customize-hook="for b in cargo rustc rustdoc; do ln -s /usr/local/rust/bin/\$b \"\$1/usr/local/cargo/bin/\$b\"; done" \
    &
rust_base=$!
hypermnf_base_debian
wait "$rust_base" || fail "mmdebstrap failed"
# The same environment as the rust:1-bookworm image, so the Dockerfile's cache mount on
# /usr/local/cargo/registry is cargo's registry here too.
hypermnf_import "$rust_tar" "$BASE_RUST" \
    --change 'ENV CARGO_HOME=/usr/local/cargo' \
    --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]'

# ---- 3. the image -----------------------------------------------------------------------------------------
# --format docker: the OCI image format has no HEALTHCHECK, podman would drop it. --network host for the
# build only: cargo, apt and pip reach their registries from the build containers. --jobs 2: the CUDA
# libraries' stage (downloads) runs beside the cargo build (CPU). The cache mounts live in
# /var/tmp/buildah-cache, the layers in podman's store: both outlive the run.
step "podman build"
build_start=$SECONDS
nice -n 10 podman build --quiet --format docker --pull=never --network host --jobs 2 \
    --build-arg RUST_IMAGE="$BASE_RUST" --build-arg DEBIAN_IMAGE="$BASE_DEBIAN" \
    -f docker/Dockerfile -t "$IMAGE" . >/dev/null || fail "podman build failed"
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "image $IMAGE: $(( size / 1000000 )) MB, built in $(( SECONDS - build_start ))s"
podman image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE" | grep -q healthz \
    || fail "the image lost its HEALTHCHECK"

# ---- 4. run, submit, compare ----------------------------------------------------------------------------
key="ci-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
printf 'ci:%s\n' "$key" >"$work/api-keys.txt"
chmod 644 "$work/api-keys.txt"
podman volume create "$VOLUME" >/dev/null

# Own network namespace (slirp4netns: user-mode networking, nothing on the host's interfaces); the port
# is published on the host's loopback only.
start_container() {
    podman run -d --name "$NAME" \
        --network slirp4netns -p "127.0.0.1:$PORT:8080" \
        -v "$VOLUME:/data" \
        -v "$work/api-keys.txt:/run/secrets/hypermnf_api_keys:ro" \
        -e HYPERMNF_API_KEYS_FILE=/run/secrets/hypermnf_api_keys \
        "$IMAGE" >/dev/null
}
wait_healthy() { hypermnf_wait_healthy "$NAME" "$NAME" 60; }
api() { curl -fsS --max-time 60 -H "Authorization: Bearer $key" "$@"; }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

step "podman run"
start_container
wait_healthy
podman inspect --format '{{.State.Health.Status}}' "$NAME"

uid=$(awk '/^Uid:/ {print $2}' "/proc/$(podman inspect --format '{{.State.Pid}}' "$NAME")/status")
[ "$uid" = 10001 ] || fail "the server runs as uid $uid, not 10001"
echo "server process uid: $uid (not root)"

step "submit $CUBE (ENVI multipart)"
job=$(api -X POST "http://127.0.0.1:$PORT/v1/jobs" \
    -F "header=@$CUBE.hdr" -F "data=@$CUBE.img" -F 'params={"components": 10}' | json "['id']")
echo "job $job"
deadline=$(( SECONDS + 300 ))
while :; do
    status=$(api "http://127.0.0.1:$PORT/v1/jobs/$job" | json "['status']")
    case "$status" in
        succeeded) break ;;
        failed|canceled) api "http://127.0.0.1:$PORT/v1/jobs/$job" >&2; fail "job $status" ;;
    esac
    [ $SECONDS -lt $deadline ] || fail "job still $status after 300 s"
    sleep 1
done
api "http://127.0.0.1:$PORT/v1/jobs/$job/result" -o "$work/container.npy"

step "compare with the host's hypermnf run"
bin=${HYPERMNF_BIN:-target/debug/hypermnf}
[ -x "$bin" ] || nice -n 10 cargo build --locked --quiet --bin hypermnf
"$bin" run "$CUBE.hdr" --components 10 --out "$work/host.npy" 2>/dev/null
cmp "$work/host.npy" "$work/container.npy" || fail "the container's result differs from the host's"
echo "identical: $(stat -c %s "$work/container.npy") bytes"

# ---- 5. a new container on the same volume ---------------------------------------------------------------
step "replace the container, keep the volume"
podman rm -f -t 10 "$NAME" >/dev/null
start_container
wait_healthy
status=$(api "http://127.0.0.1:$PORT/v1/jobs/$job" | json "['status']")
[ "$status" = succeeded ] || fail "after the restart the job is '$status'"
api "http://127.0.0.1:$PORT/v1/jobs/$job/result" -o "$work/after-restart.npy"
cmp "$work/host.npy" "$work/after-restart.npy" || fail "the result changed across the restart"
echo "job $job and its result survived the restart"

# ---- 7. the cluster's compose file ------------------------------------------------------------------------
step "docker/compose.cluster.yaml (scripts/ci-compose.sh)"
podman rm -f -t 5 "$NAME" >/dev/null
HYPERMNF_IMAGE=$IMAGE bash scripts/ci-compose.sh

step "done"
echo "ci-container: all checks passed"
