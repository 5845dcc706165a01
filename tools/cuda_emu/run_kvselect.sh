#!/bin/sh
# tools/cuda_emu/run_kvselect.sh - block selection's kernels (src/cuda/kv_select.cu) on the CPU under
# the fiber emulation of run.sh (emu.cpp), checked by kvselect_check.c against an oracle: the
# bitmaps of a prefill ubatch and the lists of decode steps. Links a CPU-only libpxq built in
# $BUILD/cuda_emu/cpu (the KV layout). For machines without a GPU: indexing, barriers, warp
# reductions and ballots (EMU_SHUFFLE=seed: the fibers in a random order at each barrier round).
# Usage: tools/cuda_emu/run_kvselect.sh [EMU_SHUFFLE seed]
set -e
. "$(dirname "$0")/env.sh"
make -s -C "$R" BUILD="$O/cpu" NVCC= "$O/cpu/libpxq.a"
python3 "$E/xform.py" "$R/src/cuda/kv_select.cu" --shared > "$O/kv_select.emu.cpp"
g++ -std=c++17 -O1 -ffp-contract=off -w -I"$E" -I"$R/src" -I"$CUDA_INC" -c -o "$O/kv_select.emu.o" "$O/kv_select.emu.cpp"
g++ -std=c++17 -O2 -w -I"$CUDA_INC" -c -o "$O/emu.o" "$E/emu.cpp"
gcc -std=c11 -O2 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -DPXQ_CUDA -I"$R/src" -I"$R/tests" -I"$CUDA_INC" \
  -c -o "$O/kvselect_check.o" "$E/kvselect_check.c"
g++ -o "$O/kvselect_check" "$O/kvselect_check.o" "$O/kv_select.emu.o" "$O/emu.o" "$O/cpu/libpxq.a" -lm -lpthread \
  $(pkg-config --libs libpcre2-8 libcjson libutf8proc nettle 2>/dev/null) -lmicrohttpd
EMU_SHUFFLE=${1:-0} "$O/kvselect_check"
