# shellcheck shell=bash
# NVRTC without a GPU, for the tests that compile every kernel program (CI has no GPU, so they are where
# a kernel that does not compile shows before a GPU host runs it): source this file, then
#
#     hypermnf_nvrtc_install     # exports HYPERMNF_NVRTC_LIB, the directory holding libnvrtc.so.13
#
# The library is NVIDIA's PyPI wheel nvidia-cuda-nvrtc 13.0.88, pinned by hash: the very NVRTC the
# container image ships (docker/Dockerfile), of the CUDA version the binary asks for (cudarc
# `cuda-13000`: libnvrtc.so.13). Downloaded once per machine (~90 MB) and unpacked into
# ${HYPERMNF_TOOLS_DIR:-~/.cache/hypermnf-tools}/nvrtc-13.0.88; nothing is installed system-wide.

HYPERMNF_NVRTC_VERSION=13.0.88
HYPERMNF_NVRTC_SHA256=ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575

hypermnf_nvrtc_install() {
    local root lib
    root=${HYPERMNF_TOOLS_DIR:-$HOME/.cache/hypermnf-tools}/nvrtc-$HYPERMNF_NVRTC_VERSION
    lib=$root/nvidia/cu13/lib
    if [ ! -e "$lib/libnvrtc.so.13" ]; then
        local tmp
        tmp=$(mktemp -d)
        printf 'nvidia-cuda-nvrtc==%s --hash=sha256:%s\n' "$HYPERMNF_NVRTC_VERSION" "$HYPERMNF_NVRTC_SHA256" >"$tmp/requirements.txt"
        python3 -m pip download --quiet --no-deps --require-hashes --disable-pip-version-check \
            -r "$tmp/requirements.txt" -d "$tmp" || { rm -rf "$tmp"; return 1; }
        rm -rf "$root" && mkdir -p "$root"
        python3 -m zipfile -e "$tmp"/nvidia_cuda_nvrtc-*.whl "$root" || { rm -rf "$tmp"; return 1; }
        rm -rf "$tmp"
    fi
    [ -e "$lib/libnvrtc.so.13" ] || { echo "nvrtc.sh: no libnvrtc.so.13 under $lib" >&2; return 1; }
    export HYPERMNF_NVRTC_LIB=$lib
}
