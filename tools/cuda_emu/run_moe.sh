#!/bin/sh
# tools/cuda_emu/run_moe.sh - run tests/test_cuda_moe on the CPU with the kernels of src/cuda/moe.cu
# and matmul.cu (the q8 reference) executed by the fiber emulation of run.sh (emu.cpp, emu_moe.h).
# Statically declared __shared__ variables become static (one copy: blocks run one at a time), the
# dynamic ones emu_dshared's block memory. Links a
# CPU-only libpxq built in $BUILD/cuda_emu/cpu; the tensor-core kernels are stubs (mma_stub.cpp:
# unsupported, so skipped). It checks indexing, warp reductions and arithmetic
# (no fma contraction here: the device's results differ in the last bits, within the test's bounds).
# Usage: tools/cuda_emu/run_moe.sh [EMU_SHUFFLE seed]
set -e
. "$(dirname "$0")/env.sh"
make -s -C "$R" BUILD="$O/cpu" NVCC= "$O/cpu/libpxq.a"
for n in moe matmul; do
  sed -e 's/(unsigned)(blocks < 65536 ? blocks : 65536)/EMU_CAP(blocks)/' "$R/src/cuda/$n.cu" > "$O/$n.pre.cu"
  python3 "$E/xform.py" "$O/$n.pre.cu" | sed -e 's/#include "emu.h"/#include "emu_moe.h"/' \
    -e 's/extern __shared__ \(\w*\) \(\w*\)\[\];/\1 *\2 = (\1 *)emu_dshared();/' -e 's/__shared__ /static /g' \
    > "$O/$n.emu.cpp"
  g++ -std=c++17 -O1 -ffp-contract=off -w -I"$E" -I"$R/src" -I"$CUDA_INC" -c -o "$O/$n.emu.o" "$O/$n.emu.cpp"
done
cp "$R/src/cuda/repack.cu" "$O/repack.emu.cpp" # host code only
g++ -std=c++17 -O1 -w -I"$R/src" -I"$CUDA_INC" -c -o "$O/repack.emu.o" "$O/repack.emu.cpp"
g++ -std=c++17 -O2 -w -I"$CUDA_INC" -c -o "$O/emu.o" "$E/emu.cpp"
g++ -std=c++17 -O2 -w -c -o "$O/mma_stub.o" "$E/mma_stub.cpp"
gcc -std=c11 -O2 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -DPXQ_CUDA -I"$R/src" -I"$R/tests" -I"$CUDA_INC" \
  $(pkg-config --cflags libcjson 2>/dev/null) -c -o "$O/test_moe.o" "$R/tests/test_cuda_moe.c"
g++ -o "$O/test_cuda_moe" "$O/test_moe.o" "$O/emu.o" "$O/mma_stub.o" "$O/moe.emu.o" "$O/matmul.emu.o" "$O/repack.emu.o" "$O/cpu/libpxq.a" \
  $(pkg-config --libs libpcre2-8 libcjson libutf8proc nettle 2>/dev/null || echo -lpcre2-8 -lcjson -lutf8proc -lnettle) \
  -lmicrohttpd -lm -pthread
cd "$R" && EMU_SHUFFLE=${1:-0} "$O/test_cuda_moe"
