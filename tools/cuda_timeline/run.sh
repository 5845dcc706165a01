#!/bin/sh
# tools/cuda_timeline/run.sh - where a decode step's time goes on the GPU, kernel by kernel, with
# programmatic dependent launch's overlap: runs `pxq bench` unchanged under timeline.c (a CUPTI
# injection library: every kernel's start and end) and prints summary.py's table for the last 16
# decode steps. Needs nvcc's CUDA (CUPTI headers and libcupti) and a build in build/.
#   usage: tools/cuda_timeline/run.sh [pxq bench arguments]
#   (default: the Qwen3-32B preset, dummy Q4_0, --gpu-mem 24GiB -p 0 -n 32 -b 1 -r 1)
# The CSV, the library and the bench's output go to $OUT (default /tmp/pxq-timeline).
set -eu
R=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/pxq-timeline}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$OUT"
L=
for d in "$CUDA_HOME/extras/CUPTI/lib64" "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do
    if [ -e "$d/libcupti.so" ]; then L=$d; break; fi
done
[ -n "$L" ] || { echo "run.sh: no libcupti.so under $CUDA_HOME" >&2; exit 1; }
I=$CUDA_HOME/include
[ -e "$CUDA_HOME/extras/CUPTI/include/cupti.h" ] && I=$CUDA_HOME/extras/CUPTI/include
gcc -std=c11 -O2 -Wall -Wextra -fPIC -shared -pthread -I"$I" -I"$CUDA_HOME/include" -o "$OUT/libtimeline.so" \
    "$R/tools/cuda_timeline/timeline.c" -L"$L" -lcupti -Wl,-rpath,"$L"
[ $# -gt 0 ] || set -- --load-format dummy --config "$R/presets/qwen3-32b.json" --dtype q4_0 --device cuda \
    --gpu-mem 24GiB -p 0 -n 32 -b 1 -r 1
CUDA_INJECTION64_PATH="$OUT/libtimeline.so" PXQ_TIMELINE_OUT="$OUT/timeline.csv" "$R/build/pxq" bench "$@" \
    >"$OUT/bench.log" 2>&1 || { tail -n 5 "$OUT/bench.log" >&2; exit 1; }
grep "tg\|pp" "$OUT/bench.log" | tail -n 2
python3 "$R/tools/cuda_timeline/summary.py" "$OUT/timeline.csv" --steps 16
