/* kvselect_check.c - block selection's kernels (src/cuda/kv_select.cu) under the fiber emulation
 * (run_kvselect.sh), against the oracle tests/test_cuda_kvselect.c also uses (tests/kvselect_oracle.h,
 * written from the method). Checks every token's bitmap (one prefill ubatch of N
 * tokens), and for decode steps of up to 16 tokens, and of one, the bitmaps again and the list of
 * chosen blocks wholly inside the middle (kv.mid: count, then the blocks ascending); a decode step
 * scores in kv_score_kernel over up to 2 blocks a (token, head) pair (kv.score_blocks 64). N = 150 positions (10 blocks; a few minutes
 * on 2 cores). Shapes: head_dim 256, 128, 64 and 80 (the
 * scoring's fast path at 8, 4 and 2 channels a lane, and its fallback), groups of 6 and 12 (a
 * second chunk of the group's heads). Exits 1 on any difference. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/ops_cuda.h"
#include "kvcache.h"
#include "kvselect_oracle.h"

enum { BS = 16, N = 150, NB = (N + BS - 1) / BS, WORDS = (NB + 31) / 32, SINKS = 4, WINDOW = 32, TOPK = 3, STEP = 16 };

static uint64_t rng = 0x5eed;
static float frand(void) { rng = rng * 6364136223846793005ull + 1442695040888963407ull; return (float)((rng >> 40) / 16777216.0 * 2 - 1); }

static uint32_t oracle(const float *q, const float *k, int qp, int h, int hd, int nkv, int group) {
    return kvselect_oracle(q, k, qp, h, hd, nkv, group, N, BS, SINKS, WINDOW, TOPK);
}

static int run(int hd, int group) {
    const int nkv = 2, nh = nkv * group, kvd = nkv * hd;
    struct kv_spec spec = {.type = KV_CACHE_F16, .attn_window = WINDOW, .attn_sinks = SINKS, .topk_blocks = TOPK};
    struct kv_layout lay;
    char err[256];
    if (kv_layout_init(&lay, 1, nkv, hd, BS, &spec, err, sizeof err) != 0) { printf("layout: %s\n", err); return 1; }
    struct cuda_kv kv; /* the fields kv_select.cu reads (backend.cu's cuda_kv_from_layout is CUDA code) */
    memset(&kv, 0, sizeof kv);
    kv.n_layer_kv = lay.n_layer_kv, kv.block_size = lay.block_size, kv.n_head_kv = lay.n_head_kv;
    kv.head_dim = lay.head_dim, kv.kv_dim = lay.kv_dim;
    kv.attn_window = lay.attn_window, kv.attn_sinks = lay.attn_sinks, kv.topk_blocks = lay.topk_blocks;
    int32_t tab[NB], pos[N], seq[N];
    for (int j = 0; j < NB; j++) tab[j] = (j * 7) % NB; /* 7 and 19 coprime: a permutation */
    for (int t = 0; t < N; t++) pos[t] = t, seq[t] = 0;
    float *k = malloc((size_t)N * kvd * 4), *q = malloc((size_t)N * nh * hd * 4);
    for (size_t i = 0; i < (size_t)N * kvd; i++) k[i] = frand();
    for (size_t i = 0; i < (size_t)N * nh * hd; i++) q[i] = frand();
    kv.block_tab = tab, kv.max_blocks = NB, kv.sel_words = WORDS;
    kv.kmin = malloc((size_t)NB * kvd * 4), kv.kmax = malloc((size_t)NB * kvd * 4);
    kv.sel = malloc((size_t)N * nkv * WORDS * 4);
    kv.mid_tokens = STEP, kv.mid_cap = TOPK, kv.mid = malloc((size_t)STEP * nkv * (TOPK + 1) * 4);
    kv.score = malloc((size_t)STEP * nkv * NB * 4), kv.score_blocks = 64;
    kv_bounds_cuda(&kv, 0, k, kvd, pos, seq, N, 0);
    kv_select_cuda(&kv, 0, q, pos, seq, N, nh, 0); /* a prefill ubatch: no lists */
    int bad = 0;
    for (int t = 0; t < N; t++)
        for (int h = 0; h < nkv; h++) {
            const uint32_t want = oracle(q, k, t, h, hd, nkv, group), got = kv.sel[((size_t)t * nkv + h) * WORDS];
            if (want != got && bad++ < 3) printf("  token %d head %d: bitmap %08x, the oracle's %08x\n", t, h, got, want);
        }
    int bad_list = 0;
    for (int t0 = 0; t0 < N;) { /* decode steps of 16 tokens up to N - 20, then of one: bitmaps and lists */
        const int n = t0 >= N - 20 ? 1 : N - 20 - t0 < STEP ? N - 20 - t0 : STEP;
        kv_select_cuda(&kv, 0, q + (size_t)t0 * nh * hd, pos + t0, seq + t0, n, nh, 0);
        for (int u = 0; u < n; u++)
            for (int h = 0; h < nkv; h++) {
                const int qp = t0 + u, n_kv = qp + 1;
                const uint32_t bits = oracle(q, k, qp, h, hd, nkv, group);
                if (kv.sel[((size_t)u * nkv + h) * WORDS] != bits && bad++ < 3)
                    printf("  step at %d, token %d head %d: bitmap %08x, the oracle's %08x\n", t0, qp, h,
                           kv.sel[((size_t)u * nkv + h) * WORDS], bits);
                int want[NB], nw = 0;
                if (n_kv > SINKS + WINDOW) {
                    const int b = n_kv - WINDOW, nsb = (SINKS + BS - 1) / BS, wb0 = b / BS > nsb ? b / BS : nsb;
                    for (int j = nsb; j < wb0; j++)
                        if (bits >> j & 1u) want[nw++] = j;
                }
                const int32_t *got = kv.mid + ((size_t)u * nkv + h) * (TOPK + 1);
                int same = got[0] == nw;
                for (int i = 0; i < nw && same; i++) same = got[1 + i] == want[i];
                if (!same && bad_list++ < 3) printf("  step at %d, token %d head %d: list of %d differs\n", t0, qp, h, got[0]);
            }
        t0 += n;
    }
    printf("head_dim %d, group %d: %d of %d bitmaps (a prefill ubatch, then decode steps) equal to the oracle's, %d lists differ\n",
           hd, group, 2 * N * nkv - bad, 2 * N * nkv, bad_list);
    free(k), free(q), free(kv.kmin), free(kv.kmax), free(kv.sel), free(kv.mid), free(kv.score);
    kv_layout_free(&lay);
    return bad || bad_list;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    int fail = 0;
    const int shapes[][2] = {{256, 6}, {128, 12}, {64, 6}, {80, 6}};
    for (int i = 0; i < 4; i++) fail |= run(shapes[i][0], shapes[i][1]);
    printf(fail ? "kvselect_check: FAILED\n" : "kvselect_check: all equal\n");
    return fail;
}
