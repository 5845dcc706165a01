/* test_topk.c - topk_indices (topk.h) against a reference: a stable sort of the indices by score,
 * descending (NaN last), its first k, in ascending index order. Scores from a few values (many ties),
 * from many (few), with NaNs and infinities; n 0..300, every k in [0, n + 1]. */
#include <math.h>
#include <string.h>

#include "testutil.h"
#include "topk.h"

static const float *g_s;

static int rank_cmp(const void *a, const void *b) { /* score desc, NaN last, then index asc */
    const int i = *(const int *)a, j = *(const int *)b;
    const float x = g_s[i], y = g_s[j];
    const int xn = x != x, yn = y != y;
    if (xn != yn) return xn - yn;
    if (!xn && x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

static int idx_cmp(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static unsigned rng = 12345u;
static unsigned next(void) { return rng = rng * 1103515245u + 12345u, rng >> 8; }

int main(void) {
    float s[300];
    int id[300], ref[300];
    long cases = 0;
    for (int round = 0; round < 40; round++) {
        const int n = round < 4 ? round : (int)(next() % 300) + 1, kind = round % 4;
        for (int i = 0; i < n; i++) {
            const unsigned r = next();
            s[i] = kind == 0 ? (float)(r % 5) : kind == 1 ? (float)(r % 100000) / 7.0f : (float)(r % 9) - 4.0f;
            if (kind == 2 && r % 11 == 0) s[i] = NAN;
            if (kind == 3 && r % 13 == 0) s[i] = r % 2 ? INFINITY : -INFINITY;
        }
        g_s = s;
        for (int i = 0; i < n; i++) ref[i] = i;
        qsort(ref, (size_t)n, sizeof *ref, rank_cmp);
        for (int k = 0; k <= n + 1; k++) {
            int want[300];
            const int kk = k < n ? k : n;
            memcpy(want, ref, (size_t)kk * sizeof *want);
            qsort(want, (size_t)kk, sizeof *want, idx_cmp);
            const int got = topk_indices(s, n, k, id);
            CHECK(got == kk && !memcmp(id, want, (size_t)kk * sizeof *id), "n %d k %d (scores of kind %d): wrong set", n, k,
                  kind);
            cases++;
        }
    }
    fprintf(stderr, "topk_indices: %ld (n, k) cases\n", cases);
    return test_summary("test_topk");
}
