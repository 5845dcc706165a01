/* forward.cu - forward_cuda, the twin of forward_cpu (src/forward_cpu.c, src/forward_qwen35.c):
 * the same steps in the same order, layer by layer:
 *
 *   forward_cpu.c / forward_qwen35.c          forward.cu
 *   forward_cpu (embedding, layers)           run_layers (embedding, layers; gemm_in_norm = rmsnorm_cpu)
 *   attention_layer, gated_attention_layer    attention_layer (plain and gated)
 *   attention_core                            attention
 *   deltanet_layer_cpu                        deltanet_layer
 *   ffn_dense, ffn_moe                        ffn_dense, ffn_moe
 *   final norm + lm_head                      lm_head
 *   matmul_cpu                                matmul_cuda / matmul_ld
 * The residual adds that forward_cpu does after each block are fused into the block's last matmul
 * here (accumulate). The kernels are in the other files of src/cuda/; creation is backend.cu.
 *
 * Per ubatch: the token ids, positions, compacted sequence ids, output rows and the block tables of
 * the ubatch's sequences travel in one host-to-device copy into fixed device buffers; decode steps
 * (at most CUDA_DECODE_MAX tokens) are captured once per (n_tokens, n_outputs, n_split, split_len,
 * n_runs) as a CUDA graph and replayed; the requested logits rows come back in one copy.
 *
 * Precision: float32 activations, fp32-accumulating mat-vecs; by default KV in f16 and prefill
 * matmuls (ubatches over CUDA_DECODE_MAX tokens) in f16 through cuBLAS with fp32 accumulation.
 * Exact mode (PXQ_CUDA_FP32=1) keeps KV in f32 and runs every matmul through the fp32 mat-vec (the
 * tests' mode). PXQ_CUDA_GRAPHS=0 turns graphs off (eager launches, same kernels).
 */
#include <stdio.h>
#include <string.h>

#include "cuda/backend_impl.cuh"
#include "cuda/ops_moe_cuda.h"
#include "cuda/ops_qwen35_cuda.h"

/* ---- matmul: matmul_cpu's twin ---- */

/* The first rows of w, up to b->l2_pf_bytes of codes and scales, as spans to prefetch into L2 (none
 * if w is NULL or absent, or the prefetch is off). */
static cuda_l2_prefetch l2_span(const cuda_backend *b, const cuda_weight *w) {
    cuda_l2_prefetch pf = {{NULL, NULL}, {0, 0}, 0};
    if (!w || w->fmt < 0 || !b->l2_pf_bytes || !b->l2_pf_step) return pf;
    size_t qb, sb;
    cuda_weight_sizes(w->fmt, w->n_in, w->n_out, &qb, &sb);
    if (qb + sb > b->l2_pf_bytes) {
        const int64_t rows = (int64_t)((double)w->n_out * (double)b->l2_pf_bytes / (double)(qb + sb));
        cuda_weight_sizes(w->fmt, w->n_in, rows, &qb, &sb);
    }
    pf.p[0] = w->q, pf.bytes[0] = qb;
    pf.p[1] = w->s, pf.bytes[1] = w->s ? sb : 0;
    pf.n_blocks = b->l2_pf_blocks;
    return pf;
}

/* The dp4a flags of the mat-vec at site (a bit of early_trigger / ahead2's masks). */
static int mv_flags(const cuda_backend *b, int site) {
    return (b->early_trigger & site ? MATMUL_Q8_LAUNCH_NEXT : 0) | (b->ahead2 & site ? MATMUL_Q8_AHEAD2 : 0);
}

/* Whether an n-token decode step's q8 mat-vec of format fmt runs on the int8 tensor cores (else dp4a):
 * steps past dp4a_tokens, where the device and format allow it. */
static int mma_step(const cuda_backend *b, int n, int fmt) {
    return b->mma && n > b->dp4a_tokens && matmul_q8_mma_supported(fmt);
}

/* matmul_cpu's twin, y (+)= W x, output rows of stride ldy: for decode the q8 mat-vec (b->xq holds
 * x quantized, q8 != 0) or the fp32 mat-vec (exact mode, formats without a q8 kernel); for prefill,
 * weight rows dequantized to f16 in tiles and cublasGemmEx (f16 in, fp32 accumulate and out).
 * accumulate fuses the residual. */
static void matmul_ld(cuda_backend *b, float *y, const cuda_weight *w, const float *x, int n, int q8, int accumulate,
                      int ldy, const cuda_weight *next = NULL, int flags = 0) {
    if (n <= CUDA_DECODE_MAX || b->exact) {
        if (q8 && mma_step(b, n, w->fmt)) {
            matmul_q8_mma_cuda(y, w, b->xq, b->xds, n, ldy, accumulate, b->st);
        } else if (q8 && matmul_q8_supported(w->fmt)) {
            const cuda_l2_prefetch pf = l2_span(b, next);
            matmul_q8_pf_cuda(y, w, b->xq, b->xds, n, ldy, accumulate, pf.n_blocks ? &pf : NULL, flags, b->st);
        } else {
            matmul_gemv_cuda(y, w, x, n, ldy, accumulate, b->st);
        }
        return;
    }
    const int n_in = w->n_in, n_out = w->n_out;
    if (x != b->x16_src) { /* q, k, v (or DeltaNet's qkv, z, b|a) of one x: converted once */
        f32_to_f16_cuda(b->x16, x, (int64_t)n * n_in, b->st);
        b->x16_src = x;
    }
    const size_t half = b->w16_half;
    /* tiles of equal size, rows a multiple of 128 where they can be: y + r0 and the f16 tile stay
     * 16-byte aligned, so cuBLAS picks its aligned tensor-core kernels (an odd r0 costs ~6x) */
    int64_t rows = n_out;
    if (w->fmt != WFMT_F16) {
        const int64_t cap = (int64_t)(half / (size_t)n_in);
        if (cap < 1) die("prefill tile smaller than one row");
        const int64_t n_tiles = (n_out + cap - 1) / cap;
        rows = (n_out + n_tiles - 1) / n_tiles;
        rows = (rows + 127) / 128 * 128;
        if (rows > cap) rows = cap >= 128 ? cap / 128 * 128 : cap;
    }
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    for (int64_t r0 = 0; r0 < n_out; r0 += rows) {
        const int i = b->tile_next; /* alternate across calls too: K's tile overlaps Q's GEMM */
        b->tile_next ^= 1;
        int rc = (int)(n_out - r0 < rows ? n_out - r0 : rows);
        const void *A;
        if (w->fmt == WFMT_F16) {
            A = (const uint16_t *)w->q + (size_t)r0 * n_in;
        } else { /* dequantize tile into half i once its last GEMM is over, overlapping the running GEMM */
            uint16_t *wt = (uint16_t *)b->w16 + (size_t)i * half;
            CK(cudaStreamWaitEvent(b->st_deq, b->gemm_done[i], 0));
            if (b->deq_after) CK(cudaStreamWaitEvent(b->st_deq, b->gemm_ready, 0));
            b->deq_after = 0;
            dequant_rows_cuda(wt, 1, w, NULL, r0, rc, b->st_deq);
            CK(cudaEventRecord(b->deq_done[i], b->st_deq));
            CK(cudaStreamWaitEvent(b->st, b->deq_done[i], 0));
            A = wt;
            if (b->deq_defer) { /* the next tile's dequantization starts with this GEMM */
                CK(cudaEventRecord(b->gemm_ready, b->st));
                b->deq_after = 1;
            }
        }
        b->deq_defer = 0;
        /* column-major view: y^T[n_out x n] = W[n_in x n_out]^T x^T[n_in x n] */
        cublasStatus_t s = cublasGemmEx(b->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rc, n, n_in, &one, A, CUDA_R_16F, n_in,
                                        b->x16, CUDA_R_16F, n_in, &beta, y + r0, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) die("cublasGemmEx failed (%d)", (int)s);
        if (w->fmt != WFMT_F16) CK(cudaEventRecord(b->gemm_done[i], b->st));
    }
}

/* matmul_ld with rows of n_out; next: the weight the step's next mat-vec reads (L2 prefetch), or NULL;
 * flags: the dp4a kernel's MATMUL_Q8_* (ops_cuda.h): MATMUL_Q8_LAUNCH_NEXT lets the next kernel launch
 * at its start (b->early_trigger), MATMUL_Q8_STAGE stages the weight (b->stage_o) */
static void matmul_cuda(cuda_backend *b, float *y, const cuda_weight *w, const float *x, int n, int q8, int accumulate,
                        const cuda_weight *next = NULL, int flags = 0) {
    matmul_ld(b, y, w, x, n, q8, accumulate, w->n_out, next, flags);
}

/* q8 form of x for the next mat-vec when it has a q8 kernel (xq NULL otherwise) */
static int8_t *q8_for(cuda_backend *b, int q8, const cuda_weight *w) {
    return q8 && matmul_q8_supported(w->fmt) ? b->xq : NULL;
}

/* ---- the token mixers: attention, Gated DeltaNet ---- */

/* One forward step: its tokens, logits rows, decode attention split-K, DeltaNet runs, prefill
 * attention tiles, and whether the mat-vecs take int8 activations. */
struct step {
    int n, n_out, n_split, split_len, n_runs, n_tiles, q8;
    int snap; /* a DeltaNet snapshot due inside a run (step_inputs run_snap): not the chunked rule */
};

/* Causal attention of q over KV layer l into b->att: the tensor-core flash attention for prefill
 * steps where the device and shapes allow it, else split-K flash-decoding. to_gemm: the output feeds
 * the o projection's prefill GEMM as it is (no gate, not exact mode), so the prefill kernel writes
 * its half operand (b->x16) instead of b->att. Returns 1 if it also wrote xq (b->xds), the q8 form
 * of b->att (xq != NULL and the tensor-core decode kernel ran). */
static int attention(const struct pxq_engine *e, cuda_backend *b, const float *q, int l, int n_head, const step &s, int8_t *xq, int to_gemm) {
    kv_select_cuda(&b->kv, l, q, b->di.pos, b->di.seq, s.n, n_head, b->st); /* block selection, if on */
    if (s.n_tiles > 0) {
        const int half = to_gemm && !b->exact && s.n > CUDA_DECODE_MAX;
        void *out = half ? (void *)b->x16 : (void *)b->att;
        if (b->n_slab) { /* host-tier blocks: staged, slab by slab */
            const struct kv_layout *lay = &e->kv.lay;
            pf_stage sg = {b->di.stab, b->di.dtab, b->di.hlist, b->slabs, b->n_slab,
                           {b->stage, b->stage + CUDA_KV_STAGE_BYTES / 2}, b->stage_cap,
                           {b->stage_stride[0], b->stage_stride[1]}, {}, {}, b->att, b->pf_ml, b->st_stage,
                           b->stage_ev[0], {b->stage_ev[1], b->stage_ev[2]}, {b->stage_ev[3], b->stage_ev[4]},
                           b->hi.hlist, b->tune.stage_dma};
            for (int pool = 0; pool < 2; pool++)
                sg.off[pool] = lay->layer[pool][l].layer_off,
                sg.len[pool] = (size_t)lay->block_size * lay->layer[pool][l].slot_bytes;
            CK(attention_prefill_staged_cuda(out, half, q, &b->kv, l, b->di.pos, b->di.seq, b->di.tiles, s.n_tiles,
                                             n_head, &sg, b->st));
            b->stage_bytes += (uint64_t)(sg.len[0] + sg.len[1]) * (uint64_t)(b->slabs[b->n_slab - 1].g_hi);
        } else {
            attention_prefill_cuda(out, half, q, &b->kv, l, b->di.pos, b->di.seq, b->di.tiles, s.n_tiles, n_head, b->st);
        }
        if (half) b->x16_src = b->att; /* matmul_ld: x16 holds att's half form */
    } else if (b->decode_attn && s.n <= CUDA_DECODE_MAX) { /* the q8 form too: no quantize launch */
        kv_selcache_cuda(&b->kv, l, b->di.seq, s.n, b->st); /* the chosen host blocks' slots, if on */
        attention_decode_cuda(b->att, xq, b->xds, q, &b->kv, l, b->di.pos, b->di.seq, s.n, n_head, s.n_split,
                              s.split_len, b->part_o, b->part_ml, b->st);
        return xq != NULL;
    } else {
        attention_cuda(b->att, q, &b->kv, l, b->di.pos, b->di.seq, s.n, n_head, s.n_split, s.split_len, b->part_o,
                       b->part_ml, b->st);
    }
    return 0;
}

/* The weight of layer il's first mat-vec in an n-token step (the output head past the last layer),
 * and of its feed-forward's first (NULL for MoE): what the mat-vec before each prefetches. The
 * layers pick their stacked one-launch path by it, so the choice is made here alone. */
static const cuda_weight *first_weight(const struct pxq_engine *e, const cuda_backend *b, int il, int n) {
    if (il >= e->hp->n_layer) return &b->output;
    const cuda_layer *L = &b->L[il];
    if (e->hp->layer_kind[il] == LAYER_DELTANET)
        return n == 1 && L->dn_in.fmt >= 0 ? &L->dn_in : &L->w[CM_SSM_QKV];
    if (L->qkv.fmt >= 0) return &L->qkv;
    return e->hp->attn_output_gate && n == 1 && L->qgkv.fmt >= 0 ? &L->qgkv : &L->w[CM_Q];
}
static const cuda_weight *ffn_weight(const struct pxq_engine *e, const cuda_layer *L) {
    if (e->hp->n_expert) return NULL;
    return L->gu.fmt >= 0 ? &L->gu : &L->w[CM_GATE];
}

/* Llama / Qwen2 / Qwen3 attention, and Qwen3.5's gated attention (q_proj gives [query | gate] per
 * head; partial NeoX RoPE; output times sigmoid(gate); forward_qwen35.c), x += o_proj(...). */
static void attention_layer(struct pxq_engine *e, cuda_backend *b, const cuda_layer *L, int il, const step &s) {
    const struct pxq_hparams *hp = e->hp;
    const int n = s.n, hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const int l = e->kv_layer[il], gated = hp->attn_output_gate;
    const int neox = gated || hp->rope_style == ROPE_NEOX;
    cudaStream_t st = b->st;
    int8_t *xq = q8_for(b, s.q8, &L->w[CM_O]);
    int8_t *xq_att = gated ? NULL : xq; /* gated: the q8 form is of att times the gate */
    int att_q8;
    /* o_proj's weights into L2 during the attention, unless its KV stream would evict them */
    const size_t kv_bytes = (size_t)s.n_split * s.split_len * kv_dim * 2 * (b->kv.kv_f32 ? 4 : 2);
    const cuda_weight *o_next = kv_bytes <= b->l2_size / 4 ? &L->w[CM_O] : NULL;
    /* the q/k norm and the attention launch under the projection */
    const int early = mv_flags(b, 1);
    if (L->qkv.fmt >= 0) { /* one launch: token row = [q | k | v]; normed, roped q goes to xb2 */
        const int ld = q_dim + 2 * kv_dim;
        float *qkv = b->q, *q_out = b->xb2;
        matmul_cuda(b, qkv, &L->qkv, b->xb, n, s.q8, 0, o_next, early);
        if (L->bqkv) add_bias_cuda(qkv, L->bqkv, n, ld, st);
        qk_norm_rope_store_cuda(q_out, qkv, qkv + q_dim, qkv + q_dim + kv_dim, ld, ld, L->v[CV_Q_NORM],
                                L->v[CV_K_NORM], hp->rms_eps, hp->n_head, hp->n_rot, b->di.pos, b->inv_freq, neox,
                                &b->kv, l, b->di.seq, n, st);
        if (b->kv.quantized) /* the roped k and v quantized into the cache (kv_store_ubatch's twin) */
            kv_store_q_cuda(&b->kv, l, qkv + q_dim, qkv + q_dim + kv_dim, ld, b->di.pos, b->di.seq, n, st);
        kv_bounds_cuda(&b->kv, l, qkv + q_dim, ld, b->di.pos, b->di.seq, n, st); /* block selection's bounds */
        att_q8 = attention(e, b, q_out, l, hp->n_head, s, xq_att, !gated);
    } else {
        float *k = b->k, *v = b->v;
        if (first_weight(e, b, il, n) == &L->qgkv) { /* one launch: the token's [q_proj | k | v] (qg has room) */
            matmul_cuda(b, b->qg, &L->qgkv, b->xb, 1, s.q8, 0, o_next, early);
            k = b->qg + 2 * (size_t)q_dim, v = k + kv_dim;
        } else {
            matmul_cuda(b, gated ? b->qg : b->q, &L->w[CM_Q], b->xb, n, s.q8, 0);
            matmul_cuda(b, k, &L->w[CM_K], b->xb, n, s.q8, 0);
            matmul_cuda(b, v, &L->w[CM_V], b->xb, n, s.q8, 0, o_next, early);
        }
        if (gated) split_q_gate_cuda(b->q, b->xb2, b->qg, n, hp->n_head, hd, st);
        if (L->v[CV_BQ]) add_bias_cuda(b->q, L->v[CV_BQ], n, q_dim, st);
        if (L->v[CV_BK]) add_bias_cuda(k, L->v[CV_BK], n, kv_dim, st);
        if (L->v[CV_BV]) add_bias_cuda(v, L->v[CV_BV], n, kv_dim, st);
        /* q/k norm (before RoPE), RoPE, and the KV store: one kernel */
        qk_norm_rope_store_cuda(b->q, b->q, k, v, q_dim, kv_dim, L->v[CV_Q_NORM], L->v[CV_K_NORM], hp->rms_eps,
                                hp->n_head, hp->n_rot, b->di.pos, b->inv_freq, neox, &b->kv, l, b->di.seq, n, st);
        if (b->kv.quantized) kv_store_q_cuda(&b->kv, l, k, v, kv_dim, b->di.pos, b->di.seq, n, st);
        kv_bounds_cuda(&b->kv, l, k, kv_dim, b->di.pos, b->di.seq, n, st);
        att_q8 = attention(e, b, b->q, l, hp->n_head, s, xq_att, !gated);
    }
    if (gated) sigmoid_gate_cuda(b->att, xq, b->xds, b->xb2, (int64_t)n * q_dim, st);
    else if (xq && !att_q8) quantize_q8_cuda(b->xq, b->xds, b->att, (int64_t)n * q_dim, st);
    /* x += o_proj(att); its weight staged in shared memory while the attention runs (the decode
     * attention lets it launch after its own wait, attention_decode.cu) */
    matmul_cuda(b, b->x, &L->w[CM_O], b->att, n, s.q8, 1, ffn_weight(e, L), b->stage_o ? MATMUL_Q8_STAGE : 0);
}

/* Qwen3.5 Gated DeltaNet (forward_qwen35.c's deltanet_layer_cpu, step for step), x += out_proj(...).
 * The runs (tokens grouped by sequence) and the state slots are in b->di. */
static void deltanet_layer(struct pxq_engine *e, cuda_backend *b, const cuda_layer *L, int il, const step &s) {
    const struct pxq_hparams *hp = e->hp;
    const int n = s.n, nk = hp->ssm_n_k_head, nv = hp->ssm_n_v_head, dk = hp->ssm_head_k_dim, dv = hp->ssm_head_v_dim;
    const int K = hp->ssm_conv_kernel, conv_dim = 2 * nk * dk + nv * dv;
    cudaStream_t st = b->st;
    float *state = b->rstate + (size_t)e->dn_layer[il] * ((size_t)(K - 1) * conv_dim + (size_t)nv * dk * dv);
    /* the checkpoint slots in the arena (spec_checkpoint): snapshots inside a run land there */
    float *snap = e->p.spec_checkpoint && b->rstate_ck ? b->rstate_ck + (state - b->rstate) : NULL;
    const step_inputs &di = b->di;
    float *z = b->ssm_z, *ba = b->ssm_ba;
    int8_t *xq = q8_for(b, s.q8, &L->w[CM_SSM_OUT]);
    /* decode, a token per sequence: the conv, prep, the delta rule and the gated norm in one launch */
    const int fused = b->fuse_dn && n <= CUDA_DECODE_MAX && s.n_runs == n && (!xq || dv % 32 == 0) &&
                      deltanet_decode_cuda_supported(dk, dv, K);
    /* the conv (or the fused step) launches under the in-projection */
    const int early = mv_flags(b, 2);
    if (first_weight(e, b, il, n) == &L->dn_in) { /* one launch: the token's [qkv | z | b | a] (ssm_qkv has room) */
        matmul_cuda(b, b->ssm_qkv, &L->dn_in, b->xb, 1, s.q8, 0, &L->w[CM_SSM_OUT], early);
        z = b->ssm_qkv + conv_dim, ba = z + (size_t)nv * dv;
    } else {
        matmul_cuda(b, b->ssm_qkv, &L->w[CM_SSM_QKV], b->xb, n, s.q8, 0);
        matmul_cuda(b, b->ssm_z, &L->w[CM_SSM_Z], b->xb, n, s.q8, 0);
        if (L->ba.fmt >= 0) { /* one launch: token row = [b | a] */
            matmul_cuda(b, b->ssm_ba, &L->ba, b->xb, n, s.q8, 0, &L->w[CM_SSM_OUT], early);
        } else {
            matmul_ld(b, b->ssm_ba, &L->w[CM_SSM_BETA], b->xb, n, s.q8, 0, 2 * nv);
            matmul_ld(b, b->ssm_ba + nv, &L->w[CM_SSM_ALPHA], b->xb, n, s.q8, 0, 2 * nv, &L->w[CM_SSM_OUT], early);
        }
    }
    /* the conv inside the fused launch where the dp4a in-projection launches it early (under PDL, with
     * int8 activations: its taps, weights and counting before the wait, under the in-projection);
     * else the conv kernel before it: at 16 sequences the fused conv's loads (each tap read by 12
     * blocks on Qwen3.5-27B) and its atomics, in the open after the tensor-core in-projection, cost
     * 2.3% (1139.69 against 1166.09 t/s, H200) */
    const int conv_in = fused && n <= b->dp4a_tokens && (b->early_trigger & 2) && cuda_pdl && s.q8;
    auto conv = [&] {
        ssm_conv_cuda(b->ssm_conv, state, b->rstate_floats, b->ssm_qkv, L->v[CV_SSM_CONV], conv_dim, K, di.run_seq,
                      di.run_off, di.run_tok, s.n_runs, n, snap, di.run_snap, st);
    };
    if (!conv_in) conv();
    int *count = b->ssm_count + (size_t)e->dn_layer[il] * CUDA_DECODE_MAX * nk; /* this layer's */
    if (fused && deltanet_decode_cuda(b->ssm_o, xq, b->xds, state, b->rstate_floats, conv_in ? b->ssm_qkv : b->ssm_conv,
                                      conv_in ? L->v[CV_SSM_CONV] : NULL, count, ba, z, L->v[CV_SSM_A], L->v[CV_SSM_DT],
                                      L->v[CV_SSM_NORM], nk, nv, dk, dv, K, conv_dim, hp->ssm_v_tiled, hp->rms_eps,
                                      di.run_seq, di.run_off, di.run_tok, s.n_runs, st) == 0) {
        matmul_cuda(b, b->x, &L->w[CM_SSM_OUT], b->ssm_o, n, s.q8, 1, ffn_weight(e, L)); /* x += out_proj(o) */
        return;
    }
    if (conv_in) conv(); /* the fused launch was refused */
    deltanet_prep_cuda(b->ssm_conv, ba, L->v[CV_SSM_A], L->v[CV_SSM_DT], nk, nv, dk, conv_dim, n, st);
    if (n > CUDA_DECODE_MAX && !s.snap) { /* prefill: the chunked (UT transform) form; its scratch is the FFN's
                                           * buffer, free while the token mixer runs (recurrent if too small) */
        const int dense = b->hb_floats > 0;
        gated_delta_rule_chunked_cuda(b->ssm_o, state, b->rstate_floats, b->ssm_conv, ba, nk, nv, dk, dv, K,
                                      conv_dim, hp->ssm_v_tiled, di.run_seq, di.run_off, di.run_tok, s.n_runs, n,
                                      dense ? b->hb : b->moe_hb, dense ? b->hb_floats : b->moe_hb_floats, st);
    } else
        gated_delta_rule_cuda(b->ssm_o, state, b->rstate_floats, b->ssm_conv, ba, nk, nv, dk, dv, K, conv_dim,
                              hp->ssm_v_tiled, di.run_seq, di.run_off, di.run_tok, s.n_runs, snap, di.run_snap, st);
    if (xq && dv % 32 == 0) {
        gated_rmsnorm_silu_cuda(b->ssm_o, xq, b->xds, z, L->v[CV_SSM_NORM], n * nv, dv, hp->rms_eps, st);
    } else {
        gated_rmsnorm_silu_cuda(b->ssm_o, NULL, NULL, z, L->v[CV_SSM_NORM], n * nv, dv, hp->rms_eps, st);
        if (xq) quantize_q8_cuda(b->xq, b->xds, b->ssm_o, (int64_t)n * nv * dv, st);
    }
    matmul_cuda(b, b->x, &L->w[CM_SSM_OUT], b->ssm_o, n, s.q8, 1, ffn_weight(e, L)); /* x += out_proj(o) */
}

/* ---- feed-forward ---- */

/* forward_cpu.c's ffn_dense, x += down(silu(gate(xb)) * up(xb)); gemm: a prefill step through the
 * f16 GEMM (the SwiGLU then writes the down GEMM's half operand). */
static void ffn_dense(struct pxq_engine *e, cuda_backend *b, const cuda_layer *L, int il, const step &s, int gemm) {
    const int n = s.n, q8 = s.q8, ff = e->hp->n_ff;
    cudaStream_t st = b->st;
    int8_t *xq_down = q8_for(b, q8, &L->w[CM_DOWN]);
    /* the SwiGLU launches under the gate|up mat-vec */
    const int early = mv_flags(b, 8);
    if (L->gu.fmt >= 0) { /* one launch: token row = [gate | up], into hb; silu(gate) * up into hb2 */
        matmul_cuda(b, b->hb, &L->gu, b->xb, n, q8, 0, &L->w[CM_DOWN], early);
        if (gemm) { /* straight to the down GEMM's half operand */
            swiglu_f16_cuda(b->x16, b->hb, b->hb + ff, n, ff, 2 * ff, st);
            b->x16_src = b->hb2; /* hb2 itself is not written */
            b->deq_defer = 1;
        } else {
            swiglu_q8_cuda(b->hb2, xq_down, b->xds, b->hb, b->hb + ff, n, ff, 2 * ff, st);
        }
        matmul_cuda(b, b->x, &L->w[CM_DOWN], b->hb2, n, q8, 1, first_weight(e, b, il + 1, n)); /* x += down(...) */
        return;
    }
    matmul_cuda(b, b->hb, &L->w[CM_GATE], b->xb, n, q8, 0);
    matmul_cuda(b, b->hb2, &L->w[CM_UP], b->xb, n, q8, 0, &L->w[CM_DOWN], early);
    swiglu_q8_cuda(b->hb, xq_down, b->xds, b->hb, b->hb2, n, ff, ff, st);
    matmul_cuda(b, b->x, &L->w[CM_DOWN], b->hb, n, q8, 1, first_weight(e, b, il + 1, n)); /* x += down(...) */
}

/* An expert mat-vec over the step's n_pairs (token, slot) pairs (cuda/ops_moe_cuda.h): for prefill
 * steps the expert-sorted tiles (b->moe_order.., from moe_sort_cuda), on the int8 tensor cores when
 * q8 (the activations in b->xq), else in fp32 from x; decode steps one block per pair with int8
 * activations (b->xq) where the step has them and the format a q8 kernel, else fp32 x. */
static void expert_mv(cuda_backend *b, float *y, int ldy, const cuda_weight *w, int rows_per_expert, const float *x,
                      int x_per_pair, int n_pairs, int k, int q8, int max_tiles) {
    if (max_tiles && q8)
        moe_q8_mma_cuda(y, ldy, w, rows_per_expert, b->moe_order, b->moe_tiles, b->moe_ntiles, max_tiles, b->xq, b->xds,
                        x_per_pair, k, b->st);
    else if (max_tiles)
        moe_gemv_tiles_cuda(y, ldy, w, rows_per_expert, b->moe_order, b->moe_tiles, b->moe_ntiles, max_tiles, x,
                            x_per_pair, k, b->st);
    else if (q8 && matmul_q8_supported(w->fmt))
        moe_q8_cuda(y, ldy, w, rows_per_expert, b->moe_ids, b->xq, b->xds, x_per_pair, n_pairs, k, b->st);
    else
        moe_gemv_cuda(y, ldy, w, rows_per_expert, b->moe_ids, x, x_per_pair, n_pairs, k, b->st);
}

/* 1 if every expert weight of L takes moe_q8_mma_cuda (rows per expert: 2 ff for a stacked gate|up,
 * ff for gate and up apart, d for down) */
static int moe_mma_ok(const cuda_layer *L, int ff, int d) {
    const int gu = L->moe_gu.fmt >= 0 ? moe_q8_mma_supported(&L->moe_gu, 2 * ff)
                                      : moe_q8_mma_supported(&L->moe_gate, ff) && moe_q8_mma_supported(&L->moe_up, ff);
    return gu && moe_q8_mma_supported(&L->moe_down, d);
}

/* Qwen3-MoE's sparse FFN (forward_cpu.c's ffn_moe, HF Qwen3MoeSparseMoeBlock), x += sum_j w_j
 * down_j(silu(gate_j(xb)) * up_j(xb)) over the top-k experts j. Routing stays on the device. The
 * router runs on fp32 xb in every mode (a discrete choice: int8 activations could flip near ties).
 * Prefill steps sort the pairs by expert (on the device) and read each expert's rows once per
 * CUDA_MOE_TILE of its pairs. */
static void ffn_moe(struct pxq_engine *e, cuda_backend *b, const cuda_layer *L, const step &s) {
    const struct pxq_hparams *hp = e->hp;
    const int n = s.n, k = hp->n_expert_used, ff = hp->n_ff_exp, d = hp->n_embd, np = n * k;
    cudaStream_t st = b->st;
    matmul_gemv_cuda(b->moe_logits, &L->router, b->xb, n, hp->n_expert, 0, st);
    moe_route_cuda(b->moe_ids, b->moe_w, b->moe_logits, n, hp->n_expert, k, hp->norm_topk_prob, st);
    const int tiles = n > CUDA_DECODE_MAX ? moe_max_tiles(np, hp->n_expert) : 0; /* prefill: sorted by expert */
    if (tiles) moe_sort_cuda(b->moe_order, b->moe_tiles, b->moe_ntiles, b->moe_ids, np, hp->n_expert, st);
    /* prefill on the tensor cores: xb and silu(gate) * up quantized to int8 like a decode step's */
    const int q8 = tiles ? b->moe_mma && moe_mma_ok(L, ff, d) : s.q8;
    if (tiles && q8) quantize_q8_cuda(b->xq, b->xds, b->xb, (int64_t)n * d, st);
    if (tiles) b->moe_tiles_mma &= q8;
    float *gu = b->moe_hb, *h = b->moe_hb + (size_t)np * 2 * ff; /* [np][gate | up], [np][ff] */
    if (L->moe_gu.fmt >= 0) {
        expert_mv(b, gu, 2 * ff, &L->moe_gu, 2 * ff, b->xb, 0, np, k, q8, tiles);
    } else {
        expert_mv(b, gu, 2 * ff, &L->moe_gate, ff, b->xb, 0, np, k, q8, tiles);
        expert_mv(b, gu + ff, 2 * ff, &L->moe_up, ff, b->xb, 0, np, k, q8, tiles);
    }
    swiglu_q8_cuda(tiles && q8 ? NULL : h, q8_for(b, q8, &L->moe_down), b->xds, gu, gu + ff, np, ff, 2 * ff, st);
    expert_mv(b, b->moe_y, d, &L->moe_down, d, h, 1, np, k, q8, tiles);
    moe_combine_cuda(b->x, b->moe_y, b->moe_w, n, k, d, st); /* x += sum_j w_j y_j */
}

/* ---- the step ---- */

/* The pre-norm of a block: xb = rmsnorm(x) * w, with its q8 form for decode mat-vecs (q8) or its
 * half form in x16 for prefill GEMMs (gemm), which makes x16 the form of xb. */
static void gemm_in_norm(cuda_backend *b, const float *w, int d, int n, float eps, int q8, int gemm) {
    if (gemm) {
        rmsnorm_f16_cuda(b->xb, b->x16, b->x, w, d, n, eps, b->st);
        b->x16_src = b->xb;
        b->deq_defer = 1;
    } else {
        rmsnorm_q8_cuda(b->xb, q8 ? b->xq : NULL, b->xds, b->x, w, d, n, eps, NULL, b->st);
        b->x16_src = NULL;
    }
}

/* Split-K of a decode step's attention (cuda_decode_splits, backend.h). The tensor-core decode
 * attention's splits fill one wave of b->split_blocks blocks per SM, so every block runs at once and
 * they end together: Qwen3-32B at 32K on an H200 (33 splits of 1024 positions, 264 blocks)
 * 104.9-105.2 t/s, against 101.9 for the earlier rule (split_len 256 x 2^k, at most 4 blocks per
 * SM: 64 of 512, 512 blocks, a second wave of the 396 slots). (n_split, split_len) keys the step's
 * graph: a growing context changes it at each power of two, then eight times an octave (under window
 * attention or block selection it stops growing at the visible blocks' bound). */
static void decode_splits(const cuda_backend *b, const struct pxq_hparams *hp, int n_tok, int n_kv, step *s) {
    if (b->decode_attn) n_kv = attention_sparse_len(&b->kv, n_kv); /* window or selection: the visible blocks */
    cuda_decode_splits(n_kv, n_tok, hp->n_head_kv, b->decode_attn, b->split_blocks, b->n_sm, b->max_splits,
                       b->decode_attn ? cuda_exact_chunks(b->kv.quantized, b->kv.n_sink, b->kv.n_window) : 0, &s->n_split,
                       &s->split_len);
}

/* forward_cpu, step for step; inputs already in b->in_d. The residual adds are the accumulating
 * last matmul of each block (x += o_proj / out_proj / down / the experts' sum). */
static void run_layers(struct pxq_engine *e, cuda_backend *b, const step &s) {
    const struct pxq_hparams *hp = e->hp;
    const int n = s.n, d = hp->n_embd, q8 = s.q8;
    const int gemm = n > CUDA_DECODE_MAX && !b->exact; /* prefill through the f16 GEMM */
    b->x16_src = NULL;
    dequant_rows_cuda(b->x, 0, &b->embd, b->di.tok, 0, n, b->st);
    for (int il = 0; il < hp->n_layer; il++) {
        const cuda_layer *L = &b->L[il];
        gemm_in_norm(b, L->v[CV_ATTN_NORM], d, n, hp->rms_eps, q8, gemm);
        if (hp->layer_kind[il] == LAYER_DELTANET) deltanet_layer(e, b, L, il, s);
        else attention_layer(e, b, L, il, s);
        gemm_in_norm(b, L->v[CV_FFN_NORM], d, n, hp->rms_eps, q8, gemm);
        if (hp->n_expert) ffn_moe(e, b, L, s);
        else ffn_dense(e, b, L, il, s, gemm);
    }
}

/* Final norm (norm: the output norm, or the MTP head's) of output rows r0.. (gathered through
 * b->di.rows), then lm_head into b->logits. */
static void lm_head(struct pxq_engine *e, cuda_backend *b, const step &s, int r0, int rc, const float *norm) {
    const struct pxq_hparams *hp = e->hp;
    /* a prefill step's few output rows take the decode mat-vec too (int8 where it has a kernel) */
    const int q8 = s.q8 || (!b->exact && rc <= CUDA_DECODE_MAX && hp->n_embd % 32 == 0);
    rmsnorm_q8_cuda(b->xb, q8 ? b->xq : NULL, b->xds, b->x, norm, hp->n_embd, rc, hp->rms_eps,
                    b->di.rows + r0, b->st);
    b->x16_src = NULL;
    matmul_cuda(b, b->logits, &b->output, b->xb, rc, q8, 0, first_weight(e, b, 0, s.n), /* layer 0: the next step's */
                mv_flags(b, 16));
}

static cudaGraphExec_t graph_get(struct pxq_engine *e, cuda_backend *b, const step &s) {
    for (int i = 0; i < b->n_graphs; i++)
        if (b->g[i].n == s.n && b->g[i].n_out == s.n_out && b->g[i].n_split == s.n_split &&
            b->g[i].split_len == s.split_len && b->g[i].n_runs == s.n_runs)
            return b->g[i].exec;
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal));
    run_layers(e, b, s);
    if (s.n_out) lm_head(e, b, s, 0, s.n_out, b->output_norm);
    CK(cudaStreamEndCapture(b->st, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiateWithFlags(&exec, graph, 0)); /* CUDA 11.4+ and 12+: one signature */
    CK(cudaGraphDestroy(graph));
    int slot;
    if (b->n_graphs < MAX_GRAPHS) {
        slot = b->n_graphs++;
    } else { /* full: replace in turn */
        slot = b->next_evict;
        b->next_evict = (b->next_evict + 1) % MAX_GRAPHS;
        CK(cudaGraphExecDestroy(b->g[slot].exec));
    }
    b->g[slot] = graph_entry{s.n, s.n_out, s.n_split, s.split_len, s.n_runs, exec};
    return exec;
}

/* The snapshot due in run r of the staged step (pxq_seq_checkpoint_at's ck_at): the tokens of the
 * run before it (1 .. the run's length; 0: none in this run). */
static int run_snapshot(const struct pxq_engine *e, const cuda_backend *b, int r) {
    const step_inputs &h = b->hi;
    const struct pxq_seq *sq = &e->seqs[h.run_seq[r]];
    const int p0 = h.pos[h.run_tok[h.run_off[r]]], m = h.run_off[r + 1] - h.run_off[r], j = sq->ck_at - p0;
    return e->p.spec_checkpoint && sq->ck_at >= 0 && j >= 1 && j <= m ? j : 0;
}

/* 1 if the prefill kernel should stage compact sequence r's n_host host blocks rather than read them
 * in place. In place, each thread block of the kernel over r's tiles (ATTENTION_PREFILL_ROWS rows:
 * tokens x the GQA group) reads the host blocks its rows see: all of them under full attention, at
 * most its tokens' top-k each under block selection (a bitmap is a (token, KV head)'s; a block's
 * rows span at most (rows - 1) / group + 2 tokens); staged, each crosses the bus once. A lone decode
 * token reads less in place; a 512-token chunk far more. */
static int stage_seq(const struct pxq_engine *e, const cuda_backend *b, int n_tiles, int r, int n_host) {
    const step_inputs &h = b->hi;
    const int group = e->hp->n_head / e->hp->n_head_kv, rows = ATTENTION_PREFILL_ROWS;
    int64_t blocks = 0, tok_max = 0;
    for (int i = 0; i < n_tiles; i++)
        if (h.seq[h.tiles[2 * i]] == r) {
            const int n_tok = h.tiles[2 * i + 1];
            blocks += ((int64_t)n_tok * group + rows - 1) / rows;
            if (n_tok > tok_max) tok_max = n_tok;
        }
    int64_t tok_per = (rows - 1) / group + 2;
    if (tok_per > tok_max) tok_per = tok_max;
    const int64_t k = e->kv.lay.topk_blocks, seen = k && k * tok_per < n_host ? k * tok_per : n_host;
    return blocks * seen > n_host;
}

/* A prefill step over the host tier (attention_staged.cu): for each of the step's n_tab sequences
 * that stage_seq stages, number its host-tier blocks in order (stab; -1 elsewhere), list their pool
 * ids (hlist) and cut them into slabs of at most stage_cap blocks of one sequence (b->slabs,
 * b->n_slab); dtab is the block table less the staged blocks. Returns the staged blocks. */
static int stage_slabs(const struct pxq_engine *e, cuda_backend *b, int n_tiles, int n_tab) {
    const step_inputs &h = b->hi;
    const int bs = e->kv.lay.block_size;
    int g = 0; /* b->n_slab is 0: stage_inputs */
    for (int r = 0; r < n_tab; r++) {
        const struct kv_seq *ks = &e->seqs[h.run_seq[r]].kv;
        int32_t *st = h.stab + (size_t)r * b->max_blocks, *dt = h.dtab + (size_t)r * b->max_blocks;
        const int stage = stage_seq(e, b, n_tiles, r, kv_seq_host_blocks(&e->kv, ks));
        pf_slab *cur = NULL;
        for (int j = 0; j < ks->n_blocks; j++) {
            const int id = ks->blocks[j];
            st[j] = -1, dt[j] = id;
            if (id < e->kv.n_dev || !stage) continue;
            dt[j] = -1;
            if (!cur || cur->g_hi - cur->g_lo == b->stage_cap) {
                cur = &b->slabs[b->n_slab++];
                *cur = pf_slab{r, g, g, j * bs, j * bs};
            }
            st[j] = g;
            h.hlist[g++] = id;
            cur->g_hi = g, cur->p_hi = (j + 1) * bs;
        }
    }
    return g;
}

/* Host side of the per-step inputs: tokens, positions, compacted sequence ids with their block
 * tables, the output rows, and the runs (tokens grouped by sequence, in batch order); with snaps,
 * the DeltaNet snapshots due inside runs (run_snap; forward_cuda copies those due at a run's end).
 * Returns the bytes to copy; fills s's counts. A sequence's DeltaNet state is cleared on its first
 * step. */
static size_t stage_inputs(struct pxq_engine *e, cuda_backend *b, const struct ubatch *ub, step *s, int *first_out,
                           int *max_pos, int snaps) {
    const step_inputs &h = b->hi;
    const int n = ub->n;
    for (int i = 0; i < e->p.n_seq_max; i++) b->seq_map[i] = -1;
    int n_tab = 0, n_out = 0, first = -1, mp = 0;
    for (int t = 0; t < n; t++) {
        const int sq = ub->seq_id[t];
        if (b->seq_map[sq] < 0) {
            const struct kv_seq *ks = &e->seqs[sq].kv;
            b->seq_map[sq] = n_tab;
            memcpy(h.tab + (size_t)n_tab * b->max_blocks, ks->blocks, (size_t)ks->n_blocks * sizeof(int32_t));
            h.run_seq[n_tab] = sq; /* run i is compact sequence i; the state slot is the sequence id */
            n_tab++;
        }
        h.tok[t] = ub->token[t];
        h.pos[t] = ub->pos[t];
        h.seq[t] = b->seq_map[sq];
        if (ub->pos[t] > mp) mp = ub->pos[t];
        if (ub->out_idx[t] >= 0) {
            if (first < 0) first = ub->out_idx[t];
            h.rows[n_out++] = t;
        }
    }
    if (b->rstate) { /* runs: counting sort of the tokens by compact sequence, batch order kept */
        for (int r = 0; r <= n_tab; r++) h.run_off[r] = 0;
        for (int t = 0; t < n; t++) h.run_off[h.seq[t] + 1]++;
        for (int r = 0; r < n_tab; r++) h.run_off[r + 1] += h.run_off[r];
        for (int r = 0; r < n_tab; r++) h.tiles[r] = h.run_off[r]; /* scratch cursor */
        for (int t = 0; t < n; t++) h.run_tok[h.tiles[h.seq[t]]++] = t;
        for (int r = 0; r < n_tab; r++) {
            struct pxq_seq *sq = &e->seqs[h.run_seq[r]];
            if (!sq->rstate_live) {
                CK(cudaMemsetAsync(b->rstate + (size_t)h.run_seq[r] * b->rstate_floats, 0,
                                   b->rstate_floats * sizeof(float), b->st));
                sq->rstate_live = 1;
            }
            const int j = snaps ? run_snapshot(e, b, r) : 0;
            h.run_snap[r] = j < h.run_off[r + 1] - h.run_off[r] ? j : 0; /* inside the run: the kernels' */
            s->snap |= h.run_snap[r] > 0;
        }
    }
    s->n_tiles = n > CUDA_DECODE_MAX && b->prefill_attn ? attention_prefill_tiles(h.tiles, b->nb, h.pos, h.seq, n) : 0;
    b->n_slab = 0;
    const int n_staged = s->n_tiles > 0 && b->stage ? stage_slabs(e, b, s->n_tiles, n_tab) : 0;
    s->n = n;
    s->n_out = n_out;
    s->n_runs = b->rstate ? n_tab : 0;
    *first_out = first;
    *max_pos = mp;
    if (n_staged) { /* the step's rows of stab and dtab, and hlist (the tables' capacity is n_seq_max rows) */
        CK(cudaMemcpyAsync(b->di.stab, h.stab, (size_t)n_tab * b->max_blocks * sizeof(int32_t), cudaMemcpyHostToDevice, b->st));
        CK(cudaMemcpyAsync(b->di.dtab, h.dtab, (size_t)n_tab * b->max_blocks * sizeof(int32_t), cudaMemcpyHostToDevice, b->st));
        CK(cudaMemcpyAsync(b->di.hlist, h.hlist, (size_t)n_staged * sizeof(int32_t), cudaMemcpyHostToDevice, b->st));
    }
    return (size_t)(h.tab - b->in_h) * sizeof(int32_t) + (size_t)n_tab * b->max_blocks * sizeof(int32_t);
}

/* Every row's final hidden state, x normed by norm, into ub->hidden (the MTP head's input, spec_mtp).
 * Queued after the logits' copy: xb is free then. */
static void hidden_out(struct pxq_engine *e, cuda_backend *b, const struct ubatch *ub, int n, const float *norm) {
    const int d = e->hp->n_embd;
    rmsnorm_q8_cuda(b->xb, NULL, b->xds, b->x, norm, d, n, e->hp->rms_eps, NULL, b->st);
    CK(cudaMemcpyAsync(ub->hidden, b->xb, (size_t)n * d * sizeof(float), cudaMemcpyDeviceToHost, b->st));
}

extern "C" void forward_cuda(struct pxq_engine *e, const struct ubatch *ub) {
    cuda_backend *b = B(e);
    step s = {};
    int first = -1, max_pos = 0;
    const size_t in_bytes = stage_inputs(e, b, ub, &s, &first, &max_pos, 1);
    CK(cudaMemcpyAsync(b->in_d, b->in_h, in_bytes, cudaMemcpyHostToDevice, b->st));
    const cuda_layer &L0 = b->L[0];
    const int f0 = L0.gu.fmt >= 0         ? L0.gu.fmt
                   : L0.w[CM_GATE].fmt >= 0 ? L0.w[CM_GATE].fmt
                   : L0.moe_gu.fmt >= 0     ? L0.moe_gu.fmt
                                            : L0.moe_gate.fmt;
    const char *fmt = cuda_wfmt_name(f0);
    const char *mv = b->exact || !matmul_q8_supported(f0)                                       ? "gemv"
                     : mma_step(b, s.n, f0)                                             ? "q8-mma"
                                                                                            : "q8-dp4a";
    const struct pxq_hparams *hp = e->hp;
    /* int8 activations for the q8 mat-vec: decode, default mode, rows in whole groups of 32 */
    s.q8 = !b->exact && s.n <= CUDA_DECODE_MAX && hp->n_embd % 32 == 0 && hp->n_head * hp->head_dim % 32 == 0 &&
           (hp->n_expert ? hp->n_ff_exp : hp->n_ff) % 32 == 0 && (hp->arch != ARCH_QWEN35 || hp->ssm_n_v_head * hp->ssm_head_v_dim % 32 == 0);
    const size_t row_bytes = (size_t)hp->n_vocab * sizeof(float);
    if (s.n <= CUDA_DECODE_MAX) { /* decode: layers and lm_head in one graph (n_out <= CUDA_LOGITS_ROWS) */
        decode_splits(b, hp, s.n, max_pos + 1, &s);
        cuda_pdl = b->pdl && s.n <= b->pdl_tokens; /* each kernel's launch and first loads overlap the one before */
        b->l2_pf_step = s.n <= b->dp4a_tokens; /* the steps of the dp4a mat-vec */
        if (b->graphs) {
            CK(cudaGraphLaunch(graph_get(e, b, s), b->st));
            snprintf(b->path, sizeof b->path, "cuda %s %s graph%s", mv, fmt, cuda_pdl ? " pdl" : "");
        } else {
            run_layers(e, b, s);
            if (s.n_out) lm_head(e, b, s, 0, s.n_out, b->output_norm);
            snprintf(b->path, sizeof b->path, "cuda %s %s%s", mv, fmt, cuda_pdl ? " pdl" : "");
        }
        cuda_pdl = 0;
        b->l2_pf_step = 0;
        if (s.n_out)
            CK(cudaMemcpyAsync(e->logits + (size_t)first * hp->n_vocab, b->logits, (size_t)s.n_out * row_bytes,
                               cudaMemcpyDeviceToHost, b->st));
    } else {
        s.n_split = 1;
        s.split_len = e->p.n_ctx;
        b->moe_tiles_mma = 1; /* ffn_moe clears it for a layer whose experts ran in fp32 */
        run_layers(e, b, s);
        for (int r0 = 0; r0 < s.n_out; r0 += CUDA_LOGITS_ROWS) { /* lm_head in chunks of the logits buffer */
            const int rc = s.n_out - r0 < CUDA_LOGITS_ROWS ? s.n_out - r0 : CUDA_LOGITS_ROWS;
            lm_head(e, b, s, r0, rc, b->output_norm);
            CK(cudaMemcpyAsync(e->logits + ((size_t)first + r0) * hp->n_vocab, b->logits, (size_t)rc * row_bytes,
                               cudaMemcpyDeviceToHost, b->st));
        }
        snprintf(b->path, sizeof b->path, b->exact ? "cuda gemv-fp32 %s%s" : "cuda cublas-f16 %s%s", fmt,
                 !hp->n_expert || s.n <= CUDA_DECODE_MAX ? "" /* no expert tiles */
                 : b->moe_tiles_mma                      ? " experts q8-mma"
                                                         : " experts fp32");
    }
    for (int r = 0; r < s.n_runs; r++) /* snapshots due at a run's end: the state the step left */
        if (run_snapshot(e, b, r) == b->hi.run_off[r + 1] - b->hi.run_off[r]) rstate_ck_copy(b, b->hi.run_seq[r], 0);
    if (ub->hidden) hidden_out(e, b, ub, s.n, b->output_norm);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(b->st));
}

/* MTP head (mtp.c's CPU steps): x = eh_proj([enorm(embd(token)) | hnorm(h)]), the MTP decoder layer,
 * then logits of the requested rows and every row's m = shared_head_norm(x) (ub->hidden). Eager
 * launches, float32 activations into the mat-vecs (no int8 step), as exact as the main layers. */
extern "C" void forward_mtp_cuda(struct pxq_engine *e, const struct ubatch *ub) {
    cuda_backend *b = B(e);
    const struct pxq_hparams *hp = e->hp;
    step s = {};
    int first = -1, max_pos = 0;
    const size_t in_bytes = stage_inputs(e, b, ub, &s, &first, &max_pos, 0); /* no DeltaNet: no snapshots */
    CK(cudaMemcpyAsync(b->in_d, b->in_h, in_bytes, cudaMemcpyHostToDevice, b->st));
    const int n = s.n, d = hp->n_embd, gemm = n > CUDA_DECODE_MAX && !b->exact;
    cudaStream_t st = b->st;
    if (n <= CUDA_DECODE_MAX) decode_splits(b, hp, n, max_pos + 1, &s);
    else s.n_split = 1, s.split_len = e->p.n_ctx;
    s.q8 = 0;
    float *cat = b->hb; /* [n][2 d]: hb holds [nb][2 ff] */
    CK(cudaMemcpyAsync(b->xb2, ub->hidden_in, (size_t)n * d * sizeof(float), cudaMemcpyHostToDevice, st));
    dequant_rows_cuda(b->x, 0, &b->embd, b->di.tok, 0, n, st);
    rmsnorm_q8_cuda(b->xb, NULL, b->xds, b->x, b->mtp_norm[0], d, n, hp->rms_eps, NULL, st);
    rmsnorm_q8_cuda(b->att, NULL, b->xds, b->xb2, b->mtp_norm[1], d, n, hp->rms_eps, NULL, st);
    CK(cudaMemcpy2DAsync(cat, 2 * d * sizeof(float), b->xb, d * sizeof(float), d * sizeof(float), n,
                         cudaMemcpyDeviceToDevice, st));
    CK(cudaMemcpy2DAsync(cat + d, 2 * d * sizeof(float), b->att, d * sizeof(float), d * sizeof(float), n,
                         cudaMemcpyDeviceToDevice, st));
    b->x16_src = NULL;
    matmul_cuda(b, b->x, &b->mtp_fc, cat, n, 0, 0);
    const int il = hp->n_layer;
    const cuda_layer *L = &b->L[il];
    b->x16_src = NULL;
    gemm_in_norm(b, L->v[CV_ATTN_NORM], d, n, hp->rms_eps, 0, gemm);
    attention_layer(e, b, L, il, s);
    gemm_in_norm(b, L->v[CV_FFN_NORM], d, n, hp->rms_eps, 0, gemm);
    ffn_dense(e, b, L, il, s, gemm);
    const size_t row_bytes = (size_t)hp->n_vocab * sizeof(float);
    for (int r0 = 0; r0 < s.n_out; r0 += CUDA_LOGITS_ROWS) {
        const int rc = s.n_out - r0 < CUDA_LOGITS_ROWS ? s.n_out - r0 : CUDA_LOGITS_ROWS;
        lm_head(e, b, s, r0, rc, b->mtp_norm[2]);
        CK(cudaMemcpyAsync(e->logits + ((size_t)first + r0) * hp->n_vocab, b->logits, (size_t)rc * row_bytes,
                           cudaMemcpyDeviceToHost, st));
    }
    hidden_out(e, b, ub, n, b->mtp_norm[2]);
    snprintf(b->path, sizeof b->path, "cuda mtp gemv %s", cuda_wfmt_name(b->mtp_fc.fmt));
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));
}
