/* test_llama.c - the llama architecture as llama.cpp's converter writes it: q/k rows permuted
 * per head for interleaved-pair RoPE (convert_hf_to_gguf.py, LlamaModel.permute).
 *
 * random-qwen2 (HF, float32) is Llama plus q/k/v biases, so its weights written as a GGUF with
 * arch "llama", q and k (weights and biases) permuted, must reproduce the HF Qwen2 reference:
 * the same logits (bound 1e-4, as test_model) and the same greedy tokens. Without the permutation
 * handled (or with the wrong RoPE pairing) the logits differ at O(1). */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine.h"
#include "gguf_write.h"
#include "safetensors.h"
#include "sampler.h"
#include "refcase.h"
#include "testutil.h"
#include "util.h"

/* new row h*hd + 2j + s <- old row h*hd + s*hd/2 + j  (reshape(n_head, 2, hd/2, ...).swapaxes(1, 2)) */
static void permute_rows(float *dst, const float *src, int n_head, int hd, int64_t row_len) {
    for (int h = 0; h < n_head; h++)
        for (int j = 0; j < hd / 2; j++)
            for (int s = 0; s < 2; s++)
                memcpy(dst + ((size_t)h * hd + 2 * j + s) * row_len, src + ((size_t)h * hd + s * hd / 2 + j) * row_len,
                       (size_t)row_len * sizeof(float));
}

static const struct { const char *hf, *gguf; int permute; } names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},     {"self_attn.q_proj.weight", "attn_q.weight", 1},
    {"self_attn.k_proj.weight", "attn_k.weight", 2},       {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},  {"self_attn.q_proj.bias", "attn_q.bias", 1},
    {"self_attn.k_proj.bias", "attn_k.bias", 2},           {"self_attn.v_proj.bias", "attn_v.bias", 0},
    {"post_attention_layernorm.weight", "ffn_norm.weight", 0}, {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
    {"mlp.up_proj.weight", "ffn_up.weight", 0},            {"mlp.down_proj.weight", "ffn_down.weight", 0},
};

int main(void) {
    char dir[512], err[512] = "", out[] = "/tmp/pxq-llama-XXXXXX";
    snprintf(dir, sizeof dir, "%s/random-qwen2", test_data_dir());
    struct st_model *st = st_open_dir(dir, err, sizeof err);
    CHECK(st != NULL, "open %s: %s", dir, err);
    if (!st) return test_summary("test_llama");
    const int n_layer = 3, n_head = 4, n_head_kv = 2, hd = 32;
    struct gguf_writer *w = gguf_w_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "llama.context_length", 1024);
    gguf_w_u32(w, "llama.embedding_length", 128);
    gguf_w_u32(w, "llama.block_count", n_layer);
    gguf_w_u32(w, "llama.feed_forward_length", 320);
    gguf_w_u32(w, "llama.attention.head_count", n_head);
    gguf_w_u32(w, "llama.attention.head_count_kv", n_head_kv);
    gguf_w_u32(w, "llama.rope.dimension_count", hd);
    gguf_w_f32(w, "llama.rope.freq_base", 1e6f);
    gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    /* tensor list: (hf name, gguf name, permute heads) */
    const struct pxq_tensor *src[64];
    int perm[64], n = 0;
    char gname[64][96];
    const char *top[][2] = {{"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
                            {"lm_head.weight", "output.weight"}};
    for (int i = 0; i < 3; i++) {
        src[n] = st_find_tensor(st, top[i][0]);
        snprintf(gname[n], 96, "%s", top[i][1]);
        perm[n++] = 0;
    }
    for (int il = 0; il < n_layer; il++)
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
            char hf[128];
            snprintf(hf, sizeof hf, "model.layers.%d.%s", il, names[k].hf);
            src[n] = st_find_tensor(st, hf);
            snprintf(gname[n], 96, "blk.%d.%s", il, names[k].gguf);
            perm[n++] = names[k].permute == 1 ? n_head : names[k].permute == 2 ? n_head_kv : 0;
        }
    int ok = 1;
    for (int i = 0; i < n; i++) {
        ok &= src[i] != NULL && src[i]->type == PXQ_TYPE_F32;
        if (ok && gguf_w_add_tensor(w, gname[i], PXQ_TYPE_F32, src[i]->n_dims, src[i]->ne, err, sizeof err) != i) ok = 0;
    }
    CHECK(ok, "tensors of random-qwen2: %s", err);
    int fd = mkstemp(out);
    ok = ok && fd >= 0 && gguf_w_write_header(w, fd, out, err, sizeof err) == 0;
    for (int i = 0; ok && i < n; i++) {
        size_t bytes = src[i]->nbytes;
        float *buf = xmalloc(bytes);
        int64_t row_len = src[i]->n_dims == 1 ? 1 : src[i]->ne[0];
        if (perm[i]) permute_rows(buf, src[i]->data, perm[i], hd, row_len);
        else memcpy(buf, src[i]->data, bytes);
        ok = gguf_w_write_tensor(w, i, buf, bytes, err, sizeof err) == 0;
        free(buf);
    }
    ok = ok && gguf_w_finish(w, err, sizeof err) == 0;
    CHECK(ok, "write %s: %s", out, err);
    if (fd >= 0) close(fd);
    gguf_w_free(w);
    st_close(st);

    struct pxq_model *m = model_open(out, err, sizeof err);
    CHECK(m != NULL, "open the llama GGUF: %s", err);
    if (m) {
        CHECK(model_hparams(m)->arch == ARCH_LLAMA && model_hparams(m)->rope_style == ROPE_NORM, "llama, interleaved RoPE");
        char ref_dir[512];
        snprintf(ref_dir, sizeof ref_dir, "%s/ref/random-qwen2", test_data_dir());
        model_free(m);
        ref_check_model(out, ref_dir, 1e-4); /* logits, top-1 and 16 greedy tokens against HF */
    }
    unlink(out);
    return test_summary("test_llama");
}
