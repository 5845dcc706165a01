#!/bin/sh
# Compile the Volta (CUDA_ARCH=70) build with Debian 12's CUDA 11.8 toolkit (package
# nvidia-cuda-toolkit from the non-free component; host compiler clang-14, which it pulls in), in
# build-sm70/. CUDA 13 no longer targets sm_70; this checks that every kernel, the guards of the
# sm_80-only paths and the host code compile for it (and link against CUDA 11.8's cudart and cuBLAS).
# It does not run anything: no V100 here.   usage: tools/build-sm70.sh [make targets]
set -e
NVCC=${NVCC_SM70:-/usr/bin/nvcc}
[ -x "$NVCC" ] || { echo "no $NVCC: apt-get install nvidia-cuda-toolkit (Debian non-free)" >&2; exit 1; }
# CUDA 13's ptxas and headers must not be found first
exec env -u CUDA_HOME -u LIBRARY_PATH PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    make -j"$(nproc)" BUILD=build-sm70 NVCC="$NVCC -ccbin clang-14" CUDA_HOME=/usr CUDA_ARCH=70 "${@:-all}"
