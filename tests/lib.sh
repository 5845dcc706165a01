# tests/lib.sh - sourced first by the CLI test scripts (run from the repository root): set -u,
# BUILD (default build), PXQ=$BUILD/pxq and fail=0 (the script's exit status), and helpers:
#   check NAME 'SHELL TEST'   prints "ok   NAME" or "FAIL NAME" (and sets fail=1)
#   ppl MODEL [FLAGS...]      perplexity of MODEL on tests/data/frankenstein.txt, -c 256 --chunks 64
#                             (the acceptance protocol), the number alone; FLAGS go to pxq perplexity
#   within X REF TOL          exit 0 if X > 0 and |X - REF| / REF <= TOL
set -u
BUILD=${BUILD:-build}
PXQ=$BUILD/pxq
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
ppl() {
    _ppl_model=$1
    shift
    $PXQ perplexity -m "$_ppl_model" -f tests/data/frankenstein.txt -c 256 --chunks 64 --json "$@" 2>/dev/null | tail -n 1 |
        sed 's/.*"ppl": \([0-9.]*\).*/\1/'
}
within() { awk -v x="$1" -v r="$2" -v tol="$3" 'BEGIN { d = (x - r) / r; if (d < 0) d = -d; exit !(x > 0 && d <= tol) }'; }
