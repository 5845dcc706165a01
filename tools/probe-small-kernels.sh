#!/bin/sh
# tools/probe-small-kernels.sh - the PXQ_PROBE build (src/cuda/probe.cuh) and a b1 decode bench of each preset; prints each
# probed kernel's phases in us after its PDL wait, block 0, mean over the last 128 launches.
# Run on the GPU machine from the repo root (with .devlibs carried, as tools/gpu-check.sh).
set -u
if [ -d .devlibs ]; then
    D=$(pwd)/.devlibs
    export CFLAGS="-I$D/include -I$D/include/cjson" LDLIBS="-L$D/lib -Wl,-rpath,$D/lib" LD_LIBRARY_PATH=$D/lib
fi
make -j"$(nproc)" CUDA_ARCH=90 BUILD=build-probe PROBE=1 all >/tmp/probe-build.log 2>&1 || { tail -20 /tmp/probe-build.log; exit 1; }
for c in qwen3-32b:24GiB qwen3.5-27b:16GiB; do
    echo "== ${c%%:*}"
    build-probe/pxq bench --load-format dummy --dtype q4_0 --device cuda --config presets/${c%%:*}.json \
        --gpu-mem ${c##*:} -p 0 -n 128 -b 1 -r 1 | grep "probe\|tg128"
done
