/* kvselect_oracle.h - block selection's choice written from the method (Quest, Tang et al. 2024,
 * arXiv 2406.10774), for the tests of src/cuda/kv_select.cu: tests/test_cuda_kvselect.c on a GPU
 * and tools/cuda_emu/kvselect_check.c under the CPU emulation. Per block and key channel the min
 * and max of its keys; a block's bound the max over the GQA group's query heads of sum_d
 * max(q_d min_d, q_d max_d), in double; the topk largest, ties to the earlier block, among the
 * blocks touching the middle between the first `sinks` positions and the last `window`.
 * k [n][n_kv_head * hd] (every position's key stored before the choice), q [.][n_kv_head * group *
 * hd]; one sequence of n positions in blocks of bs, at most 32 blocks (one bitmap word). Returns
 * the bitmap of query position qp, KV head h: bit j for block j (0 without a middle). */
#ifndef PXQ_TESTS_KVSELECT_ORACLE_H
#define PXQ_TESTS_KVSELECT_ORACLE_H

#include <math.h>
#include <stdint.h>

static inline uint32_t kvselect_oracle(const float *q, const float *k, int qp, int h, int hd, int n_kv_head, int group, int n,
                                int bs, int sinks, int window, int topk) {
    const int n_kv = qp + 1, kvd = n_kv_head * hd;
    if (n_kv <= sinks + window) return 0;
    const int a = sinks, b = n_kv - window, b0 = a / bs, b1 = (b - 1) / bs, nb = b1 - b0 + 1;
    double score[32];
    for (int i = 0; i < nb && i < 32; i++) {
        const int j = b0 + i, lo = j * bs, hi = j * bs + bs < n ? j * bs + bs : n;
        double best = -INFINITY;
        for (int g = 0; g < group; g++) {
            double u = 0;
            for (int d = 0; d < hd; d++) {
                float mn = INFINITY, mx = -INFINITY;
                for (int p = lo; p < hi; p++) mn = fminf(mn, k[(size_t)p * kvd + h * hd + d]), mx = fmaxf(mx, k[(size_t)p * kvd + h * hd + d]);
                const double qd = q[((size_t)qp * n_kv_head * group + (size_t)h * group + g) * hd + d];
                u += fmax(qd * mn, qd * mx);
            }
            best = fmax(best, u);
        }
        score[i] = best;
    }
    if (nb <= topk) return nb >= 32 ? ~0u : ((1u << nb) - 1u) << b0;
    uint32_t bits = 0;
    for (int r = 0; r < topk; r++) { /* repeated argmax, the earlier block on ties */
        int best = -1;
        for (int i = 0; i < nb; i++)
            if (!(bits >> (b0 + i) & 1u) && (best < 0 || score[i] > score[best])) best = i;
        bits |= 1u << (b0 + best);
    }
    return bits;
}

#endif
