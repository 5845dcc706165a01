#!/bin/sh
# The llama2.c model (tests/data/stories260K.gguf, tools/make_llama2c_gguf.py) from the command line,
# as the README shows it: pxq run's greedy text for "Once upon a time" is llama2.c's byte for byte
# (tests/data/llama2c/once-upon-a-time.txt, from tools/llama2c_ref.py; test_llama2c checks the ids),
# pxq tokenize gives llama2.c's prompt ids (BOS first), and info names the SentencePiece vocab.
D=tests/data
. tests/lib.sh
tmp=$(mktemp -d /tmp/pxq-cli-llama2c.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
M=$D/stories260K.gguf

$PXQ run -m $M -p "Once upon a time" -n 64 --temp 0 -t 1 > "$tmp/out" 2> "$tmp/err"; rc=$?
check "run: exit 0" '[ $rc = 0 ]'
check "run: greedy text equals llama2.c's" 'cmp -s "$tmp/out" $D/llama2c/once-upon-a-time.txt'
check "run: 5 prompt tokens (BOS + 4)" 'grep -q "5 prompt tokens" "$tmp/err"'
check "tokenize: llama2.c's prompt ids" '[ "$($PXQ tokenize -m $M "Once upon a time")" = "[1, 403, 407, 261, 378]" ]'
check "tokenize: byte fallback for characters without a token" \
    '[ "$($PXQ tokenize -m $M "你")" = "[1, 410, 231, 192, 163]" ]'
exit $fail
