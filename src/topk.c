/* topk.c - the k largest of n scores (topk.h). */
#include "topk.h"

#include <stdlib.h>

/* 1 if i ranks before j: a larger score, or the same score and a lower index (NaN last). */
static int before(const float *s, int i, int j) {
    const float a = s[i], b = s[j];
    const int an = a != a, bn = b != b;
    if (an || bn) return an == bn ? i < j : bn; /* a NaN ranks after any number */
    return a == b ? i < j : a > b;
}

static void swap(int *a, int *b) {
    const int t = *a;
    *a = *b;
    *b = t;
}

static int cmp_int(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int topk_indices(const float *score, int n, int k, int *id) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    for (int i = 0; i < n; i++) id[i] = i;
    int lo = 0, hi = n - 1; /* id[0..lo) rank before the rest; the k-th is in [lo, hi] */
    while (lo < hi) {
        /* median of three as the pivot, moved to hi */
        const int mid = lo + (hi - lo) / 2;
        if (before(score, id[mid], id[lo])) swap(&id[mid], &id[lo]);
        if (before(score, id[hi], id[lo])) swap(&id[hi], &id[lo]);
        if (before(score, id[mid], id[hi])) swap(&id[mid], &id[hi]);
        const int pv = id[hi];
        int st = lo; /* Lomuto: those ranking before the pivot to the front */
        for (int i = lo; i < hi; i++)
            if (before(score, id[i], pv)) swap(&id[i], &id[st++]);
        swap(&id[st], &id[hi]); /* the pivot at its rank st */
        if (st == k - 1 || st == k) break;
        if (st < k) lo = st + 1;
        else hi = st - 1;
    }
    qsort(id, (size_t)k, sizeof *id, cmp_int);
    return k;
}
