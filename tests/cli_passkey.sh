#!/bin/sh
# Passkey retrieval through the binary, on the passkey model (tests/data/passkey: a 4-layer Qwen3
# trained at up to 2048 tokens by tools/make_passkey_model.py; prompts from tools/passkey_task.py,
# about 1500 tokens, the needle at depth 0.3, 0.5 and 0.7). With full attention greedy decoding
# gives the key for all 3, and the key is in no one of the last 20 prompt tokens (it is retrieved
# from the needle, hundreds of tokens back, not copied from nearby). With --attention-window 256
# --attention-sinks 4 the needle is outside every query's window and the key is lost in all 3:
# the shape expected of window attention. With the pxq KV cache (int8 K, 2-bit V at the uniform
# levels: the model has no calibration) and every position quantized (no exact window or sinks) the
# key is retrieved in all 3.
D=tests/data/passkey
. tests/lib.sh
# The model is made on a GPU by tools/make_passkey_model.py; until it is committed the test skips.
if [ ! -f $D/config.json ]; then echo "SKIP: no $D (tools/make_passkey_model.py makes it)"; exit 0; fi
if ! command -v python3 >/dev/null 2>&1; then echo "SKIP: no python3 (tools/passkey_task.py makes the prompts)"; exit 0; fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pxq-passkey.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

first5() { sed -n '1s/^ *\([0-9][0-9][0-9][0-9][0-9]\).*/\1/p'; }
for spec in "1 0.3" "2 0.5" "3 0.7"; do
    set -- $spec
    seed=$1 depth=$2
    info=$(python3 tools/passkey_task.py --pxq "$PXQ" -m $D --len 1500 --depth "$depth" --seed "$seed" --out "$tmp/p$seed.txt")
    if [ -z "$info" ]; then echo "FAIL seed $seed: tools/passkey_task.py gave no prompt"; fail=1; continue; fi
    set -- $info
    key=$1 n=$2 nend=$4
    back=$((n - nend))
    check "seed $seed: prompt of $n tokens, the needle ends $back tokens before the end (> 256), key only in it" \
        '[ "$n" -gt 1400 ] && [ "$back" -gt 276 ] && [ "$(grep -o "$key" "$tmp/p$seed.txt" | wc -l)" -eq 2 ]'
    got=$($PXQ run -m $D --device cpu -n 8 --temp 0 -f "$tmp/p$seed.txt" 2>/dev/null | first5)
    check "full attention retrieves key $key (depth $depth): got '$got'" '[ "$got" = "$key" ]'
    got=$($PXQ run -m $D --device cpu -n 8 --temp 0 -f "$tmp/p$seed.txt" --attention-window 256 --attention-sinks 4 \
        2>/dev/null | first5)
    check "window 256 + 4 sinks loses key $key (depth $depth): got '$got'" '[ "$got" != "$key" ]'
    got=$($PXQ run -m $D --device cpu -n 8 --temp 0 -f "$tmp/p$seed.txt" --kv-cache-type pxq --kv-window 0 --kv-sink 0 \
        2>/dev/null | first5)
    check "pxq cache (2-bit V, uniform levels), every position quantized, retrieves key $key: got '$got'" '[ "$got" = "$key" ]'
done
exit $fail
