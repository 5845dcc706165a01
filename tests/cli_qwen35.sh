#!/bin/sh
# Qwen3.5 hybrid through the binary: info reports the hybrid, a greedy run of the HF checkpoint
# continues the prompt as HF's generate did (reference greedy_text), and perplexity on
# frankenstein.txt (-c 256 --chunks 64) is within 0.5% of HF's 91.447 for the HF dir (BF16 weights,
# float32 compute) and within 3% of it for llama.cpp's Q8_0, Q4_0 and Q4_K_M GGUFs.
# Fixtures: tests/data/qwen35/.
D=tests/data/qwen35
. tests/lib.sh
if [ ! -f $D/tiny-qwen35/config.json ]; then echo "FAIL: no $D/tiny-qwen35"; exit 1; fi

info=$($PXQ info $D/tiny-qwen35-Q4_0.gguf)
check "info names the hybrid" 'printf "%s" "$info" | grep -q "architecture: qwen35" && printf "%s" "$info" | grep -q "6 Gated DeltaNet + 2 attention"'
# HF generate's first greedy tokens for this prompt decode to " She was\nsick, and was a little more a little, and she"
g=$($PXQ run -m $D/tiny-qwen35 -p "Once upon a time, there was a little girl named Lily." -n 16 --temp 0 -t 2 2>/dev/null)
want=$(printf ' She was\nsick, and was a little more a little, and she')
check "greedy run continues as HF generate" '[ "$g" = "$want" ]'

for spec in "$D/tiny-qwen35 0.005" "$D/tiny-qwen35-Q8_0.gguf 0.03" "$D/tiny-qwen35-Q4_0.gguf 0.03" "$D/tiny-qwen35-Q4_K_M.gguf 0.03"; do
    set -- $spec
    p=$(ppl "$1" -t 2)
    check "perplexity $1 = $p within $2 of 91.447" 'within "$p" 91.447 $2'
done
exit $fail
