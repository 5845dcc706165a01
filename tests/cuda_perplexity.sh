#!/bin/sh
# Perplexity on the CUDA backend (run by `make test-cuda`, which needs a GPU): frankenstein.txt
# (-c 256 --chunks 64), default mode (f16 KV, f16 prefill GEMMs). Bounds as the CPU scripts:
# tiny-qwen3 HF dir within 0.5% of HF's 82.253 and its GGUFs within 3%; tiny-qwen35 HF dir within
# 0.5% of HF's 91.447 and llama.cpp's Q8_0/Q4_0/Q4_K_M GGUFs within 3%.
D=tests/data
. tests/lib.sh
for spec in "$D/tiny-qwen3 82.253 0.005" "$D/gguf/tiny-qwen3-Q8_0.gguf 82.253 0.03" "$D/gguf/tiny-qwen3-Q4_0.gguf 82.253 0.03" \
    "models/tiny-qwen3-Q4_K_M.gguf 82.253 0.03" "$D/qwen35/tiny-qwen35 91.447 0.005" \
    "$D/qwen35/tiny-qwen35-Q8_0.gguf 91.447 0.03" "$D/qwen35/tiny-qwen35-Q4_0.gguf 91.447 0.03" \
    "$D/qwen35/tiny-qwen35-Q4_K_M.gguf 91.447 0.03"; do
    set -- $spec
    f=$1 ref=$2 tol=$3
    [ -e "$f" ] || { echo "skip $f (not in this tree)"; continue; }
    p=$(ppl "$f" --device cuda)
    check "cuda perplexity $f = $p within $tol of $ref" 'within "$p" $ref $tol'
done
exit $fail
