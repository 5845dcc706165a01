#!/bin/sh
# Runs every unit/model test binary in $BUILD/tests, then the CLI and bad-input scripts.
# Usage: tests/run_tests.sh [cuda]   (cuda: only the tests that exercise the CUDA backend)
BUILD=${BUILD:-build}
fail=0
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d) continue ;; esac
    name=$(basename "$t")
    if [ "$1" = cuda ]; then case "$name" in *cuda*) ;; *) continue ;; esac; fi
    echo "== $name"
    if ! "$t"; then echo "FAILED: $name"; fail=1; fi
done
if [ "$1" = cuda ]; then
    for s in tests/cuda_*.sh; do
        [ -f "$s" ] || continue
        echo "== $s"
        if ! BUILD="$BUILD" sh "$s"; then echo "FAILED: $s"; fail=1; fi
    done
else
    for s in tests/cli_*.sh tests/bad_input.sh; do
        [ -f "$s" ] || continue
        echo "== $s"
        if ! BUILD="$BUILD" sh "$s"; then echo "FAILED: $s"; fail=1; fi
    done
fi
[ $fail = 0 ] && echo "ALL TESTS PASSED" || echo "SOME TESTS FAILED"
exit $fail
