#!/usr/bin/env bash
# The container image's CUDA libraries with the packed binary on the GPU host, which has no podman and
# receives at most 64 MiB of the tree: does the GPU backend work with exactly the libraries the image
# ships (NVIDIA's CUDA 13.0 wheels), not the host's CUDA install?
#
#   scripts/dev/gpu-container-libs.sh pack [IMAGE]   # here: copy the libraries out of the image (default
#                                                    # localhost/hypermnf:ci, built by scripts/ci-container.sh)
#                                                    # into .gpu/container-libs.tar.xz, as many as fit
#   scripts/dev/gpu-container-libs.sh run            # GPU host: LD_LIBRARY_PATH=those libraries,
#                                                    # `hypermnf info`, then one cube on --backend cuda
#
# Sizes (measured): the image's libraries are 1112 MB (libcublasLt alone 542 MB): they do not fit in
# 64 MiB, compressed or not, and neither does the image. NVRTC (libnvrtc.so.13 + libnvrtc-builtins.so.13.0,
# 114 MB) is the library every GPU job needs, and the one `pack` keeps: 29.4 MiB with xz -9e. `run` then
# pins --backend cuda (the NVRTC kernels, no cuBLAS) and HYPERMNF_EIGEN=host (no cuSOLVER), so that the
# only CUDA libraries the run opens are the archive's NVRTC and the host's driver; LD_DEBUG shows which
# files were loaded. cuBLAS and cuSOLVER from the image cannot be checked this way.
set -euo pipefail
cd "$(dirname "$0")/../.."

archive=.gpu/container-libs.tar.xz
limit=$((64 * 1024 * 1024))

case "${1:-run}" in
pack)
    image=${2:-localhost/hypermnf:ci}
    # The podman settings scripts/ci-container.sh wrote for these machines, if it has run here.
    conf=${HYPERMNF_TOOLS_DIR:-$HOME/.cache/hypermnf-tools}/container/containers.conf
    [ -n "${CONTAINERS_CONF:-}" ] || [ ! -f "$conf" ] || export CONTAINERS_CONF="$conf"
    tmp=$(mktemp -d)
    trap 'podman rm -f -v hypermnf-libs-pack >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
    podman create --name hypermnf-libs-pack "$image" >/dev/null
    podman cp hypermnf-libs-pack:/usr/local/lib/hypermnf-cuda "$tmp/lib"
    echo "the image's CUDA libraries:"
    (cd "$tmp/lib" && ls -l --block-size=1 -- *.so* | awk '{printf "  %-28s %6.1f MB\n", $9, $5 / 1e6}')
    echo "  total: $(du -sb "$tmp/lib" | awk '{printf "%.0f MB", $1 / 1e6}') (the limit is 64 MiB)"
    mkdir -p .gpu
    # NVRTC only: the rest cannot fit (see the header).
    nice -n 10 tar -C "$tmp/lib" -cf - libnvrtc.so.13 libnvrtc-builtins.so.13.0 | nice -n 10 xz -9e -T1 >"$archive"
    size=$(stat -c %s "$archive")
    echo "$archive (NVRTC only): $(( size / 1024 / 1024 )) MiB"
    [ "$size" -le "$limit" ] || { echo "over 64 MiB: it cannot be carried to the GPU host" >&2; exit 1; }
    ;;
run)
    bin=${HYPERMNF:-.gpu/bin/hypermnf}
    [ -x "$bin" ] || { echo "no packed binary at $bin" >&2; exit 1; }
    [ -s "$archive" ] || { echo "no $archive: run 'pack' where the image is" >&2; exit 1; }
    libs=$(mktemp -d)
    data=$(mktemp -d)
    trap 'rm -rf "$libs" "$data"' EXIT
    # tar's own xz support needs the xz program; Python's lzma module does the same where it is missing.
    if command -v xz >/dev/null; then
        xz -dc "$archive" | tar -C "$libs" -xf -
    else
        python3 -c 'import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])' "$archive" "$libs"
    fi
    # cudarc asks the loader for `libnvrtc.so` before `libnvrtc.so.13`; a GPU host with its own CUDA
    # install answers the first name from the linker cache, which would test the host's NVRTC, not the
    # image's (seen on the H100: the run passed on /usr/local/cuda's). The unversioned name here comes
    # first on LD_LIBRARY_PATH. (Inside the image there is no other NVRTC to find.)
    ln -sf libnvrtc.so.13 "$libs/libnvrtc.so"
    ls -l "$libs"
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # A fresh kernel cache, so NVRTC really compiles (a cached PTX would not load the library at all).
    export HYPERMNF_CACHE_DIR="$data/kernel-cache" HYPERMNF_EIGEN=host
    "$bin" info
    # Which libnvrtc the process maps: it must be the archive's.
    LD_DEBUG=libs "$bin" run tests/data/salinasA_224_bip_be.hdr --components 10 --backend cuda \
        --out "$data/mnf.npy" 2>"$data/ld.log"
    grep -E 'calling init: .*(nvrtc|cublas|cusolver|libcuda)' "$data/ld.log" | sed 's/^ *[0-9]*: *//' | sort -u
    if grep -E 'calling init: .*libnvrtc\.so' "$data/ld.log" | grep -qv "$libs"; then
        echo "FAIL: libnvrtc was not the container's" >&2; exit 1
    fi
    grep -qE "calling init: $libs/libnvrtc\.so(\.13)?$" "$data/ld.log" || { echo "FAIL: the container's libnvrtc was not loaded" >&2; exit 1; }
    echo "ok: kernels compiled by the container's NVRTC 13.0 on this GPU; result $(stat -c %s "$data/mnf.npy") bytes"
    ;;
*)
    echo "usage: $0 pack [IMAGE] | run" >&2; exit 2 ;;
esac
