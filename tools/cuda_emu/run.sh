#!/bin/sh
# tools/cuda_emu/run.sh - run tests/test_cuda_qwen35_ops on the CPU, with the kernels of
# src/cuda/deltanet*.cu executed by a fiber emulation of CUDA threads (emu.cpp): one fiber per
# thread, blocks one after another (the blocks of a thread block cluster together, with the cluster
# barrier and distributed shared memory: EMU_CLUSTERS=1 reports an sm_90 device, so the fused
# decode launch runs), __syncthreads and warp shuffles as barriers, each block's shared memory
# poisoned with NaN. For machines without a GPU: it checks indexing, barriers (with
# EMU_SHUFFLE=seed the fibers run in a random order at each barrier round) and the arithmetic (same
# fp32 operations and fma as the device; expf etc. from libm). It does not model timing, memory
# ordering between blocks, or any intrinsic not in emu.h. Slow: tens of minutes on 2 cores.
# Usage: tools/cuda_emu/run.sh [EMU_SHUFFLE seed]     (PXQ_TEST_NO_BENCH=1 is set: no timings)
set -e
. "$(dirname "$0")/env.sh"
for f in "$R"/src/cuda/deltanet*.cu; do
  n=$(basename "$f" .cu)
  python3 "$E/xform.py" "$f" --shared > "$O/$n.emu.cpp"
  g++ -std=c++17 -O2 -w -I"$E" -I"$R/src" -I"$CUDA_INC" -c -o "$O/$n.emu.o" "$O/$n.emu.cpp"
done
g++ -std=c++17 -O2 -w -I"$CUDA_INC" -c -o "$O/emu.o" "$E/emu.cpp"
gcc -std=c11 -O2 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -DPXQ_CUDA -I"$R/src" -I"$R/tests" -I"$CUDA_INC" \
  -c -o "$O/test.o" "$R/tests/test_cuda_qwen35_ops.c"
g++ -o "$O/test_cuda_qwen35_ops" "$O/test.o" "$O/emu.o" "$O"/deltanet*.emu.o -lm
PXQ_TEST_NO_BENCH=1 EMU_CLUSTERS=1 EMU_SHUFFLE=${1:-0} "$O/test_cuda_qwen35_ops"
