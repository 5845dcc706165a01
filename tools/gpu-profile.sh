#!/bin/sh
# Per-kernel time of the CUDA forward on a GPU machine: Nsight Compute (ncu) over `pxq bench` on the
# Qwen3-32B preset cut to a few layers (same matrix shapes, a fraction of the kernels to replay),
# one run per test: pp512 b1, tg b1, tg b16. Prints, per test, the kernels by total time with their
# DRAM GB/s; the raw CSVs go to $OUT.  usage: tools/gpu-profile.sh [CONFIG] [N_LAYERS]
set -u
OUT=${OUT:-/tmp/pxq-prof}
if [ -d .devlibs ]; then export LD_LIBRARY_PATH=$(pwd)/.devlibs/lib; fi
mkdir -p "$OUT"
CFG=${1:-presets/qwen3-32b.json}
NL=${2:-4}
python3 - "$CFG" "$NL" "$OUT/cfg.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
t = c.get("text_config", c)
t["num_hidden_layers"] = int(sys.argv[2])
if "layer_types" in t: t["layer_types"] = t["layer_types"][:int(sys.argv[2])]
json.dump(c, open(sys.argv[3], "w"))
PY
run() { # name, bench args
    name=$1; shift
    timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        --csv --page raw --print-units base build/pxq bench --load-format dummy --config "$OUT/cfg.json" --dtype q4_0 \
        --device cuda --no-warmup -r 1 "$@" >"$OUT/$name.csv" 2>"$OUT/$name.err"
    python3 tools/ncu_summary.py "$OUT/$name.csv" "$name"
}
run pp512 -p 512 -n 0 -b 1
run tg_b1 -p 0 -n 4 -b 1
[ "${PROFILE_B16:-1}" = 1 ] && run tg_b16 -p 0 -n 4 -b 16
