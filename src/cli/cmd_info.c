/* cmd_info.c - `pxq info PATH`: architecture, hyperparameters, tensor types and their memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "gguf.h"
#include "quant.h"
#include "util.h"

int cmd_info(int argc, char **argv) {
    struct args a = {argc, argv, 0, "info", cmd_info};
    const char *path = NULL;
    int verbose = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) path = arg_str(&a);
        else if (!strcmp(f, "-v") || !strcmp(f, "--verbose")) verbose = 1;
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: pxq info [-v] [PATH]   (GGUF file or HF model directory, default the bundled model;\n"
                   "                               -v lists metadata and tensors)\n");
            return 0;
        } else if (f[0] == '-') fail_unknown(&a);
        else if (path) fail(&a, 2, "one model at a time: got '%s' and '%s'", path, f);
        else path = f;
    }
    struct pxq_model *m = open_model_or_fail(&a, path); /* NULL: the default model */
    const struct pxq_hparams *hp = model_hparams(m);
    printf("model:        %s (%s)\n", model_path(m), model_is_gguf(m) ? "GGUF" : "HF safetensors");
    printf("architecture: %s\n", hp->arch_name);
    printf("n_vocab %d, n_embd %d, n_layer %d, n_head %d, n_head_kv %d, head_dim %d, n_ff %d\n", hp->n_vocab, hp->n_embd,
           hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff);
    printf("n_ctx_train %d, rope_theta %g, n_rot %d (%s), rms_eps %g, tied embeddings %s, qkv bias %s, q/k norm %s\n",
           hp->n_ctx_train, hp->rope_theta, hp->n_rot, hp->rope_style == ROPE_NEOX ? "neox" : "interleaved", hp->rms_eps,
           hp->tie_embd ? "yes" : "no", hp->has_qkv_bias ? "yes" : "no", hp->has_qk_norm ? "yes" : "no");
    const struct rope_scaling *rs = &hp->rope_scaling;
    if (rs->type != ROPE_SCALING_NONE)
        printf("rope scaling: %s, factor %g, original context %d%s\n", rope_scaling_name(rs->type), rs->factor,
               rs->orig_ctx ? rs->orig_ctx : hp->n_ctx_train, rs->orig_ctx ? "" : " (n_ctx_train)");
    if (hp->n_expert) printf("experts %d, used %d, n_ff_exp %d, norm_topk_prob %d\n", hp->n_expert, hp->n_expert_used, hp->n_ff_exp, hp->norm_topk_prob);
    if (hp->arch == ARCH_QWEN35) { /* hybrid: KV only for attention layers, a fixed float32 state for the others */
        int n_dn = 0;
        for (int il = 0; il < hp->n_layer; il++) n_dn += hp->layer_kind[il] == LAYER_DELTANET;
        const double conv_dim = 2.0 * hp->ssm_n_k_head * hp->ssm_head_k_dim + (double)hp->ssm_n_v_head * hp->ssm_head_v_dim;
        const double state = n_dn * 4.0 * ((hp->ssm_conv_kernel - 1) * conv_dim + (double)hp->ssm_n_v_head * hp->ssm_head_k_dim * hp->ssm_head_v_dim);
        printf("hybrid: %d Gated DeltaNet + %d attention layers; DeltaNet k heads %d x %d, v heads %d x %d, conv %d; "
               "attention output gate %s, MTP layers %d\n", n_dn, hp->n_layer - n_dn, hp->ssm_n_k_head, hp->ssm_head_k_dim,
               hp->ssm_n_v_head, hp->ssm_head_v_dim, hp->ssm_conv_kernel, hp->attn_output_gate ? "yes" : "no", hp->n_mtp_layer);
        printf("per sequence: recurrent state %.3f MiB (float32), KV %.1f KiB per position at f16 (attention layers only)\n",
               state / 1048576.0, (hp->n_layer - n_dn) * 2.0 * hp->n_head_kv * hp->head_dim * 2 / 1024.0);
    }
    printf("eos ids:");
    for (int i = 0; i < hp->n_eos; i++) printf(" %d", hp->eos_ids[i]);
    printf("\n");
    /* tensor types: count, elements, bytes */
    long count[PXQ_TYPE_COUNT] = {0};
    double elems[PXQ_TYPE_COUNT] = {0}, bytes[PXQ_TYPE_COUNT] = {0}, tot_b = 0, tot_e = 0;
    int n = model_n_tensors(m);
    for (int i = 0; i < n; i++) {
        const struct pxq_tensor *t = model_tensor(m, i);
        if ((int)t->type < 0 || t->type >= PXQ_TYPE_COUNT) continue;
        count[t->type]++;
        elems[t->type] += (double)tensor_nelements(t);
        bytes[t->type] += (double)t->nbytes;
        tot_b += (double)t->nbytes;
        tot_e += (double)tensor_nelements(t);
    }
    printf("tensors: %d, %.3f M parameters, %.2f MiB, %.3f bits/weight\n", n, tot_e / 1e6, tot_b / 1048576.0, tot_b * 8 / tot_e);
    printf("  %-6s %7s %14s %12s\n", "type", "tensors", "parameters", "MiB");
    for (int t = 0; t < PXQ_TYPE_COUNT; t++)
        if (count[t]) printf("  %-6s %7ld %14.0f %12.3f\n", type_name((enum pxq_type)t), count[t], elems[t], bytes[t] / 1048576.0);
    if (verbose) {
        struct gguf_file *g = model_gguf(m);
        if (g) {
            char buf[512];
            printf("metadata:\n");
            for (int i = 0; i < gguf_n_kv(g); i++) {
                gguf_kv_to_string(g, i, buf, sizeof buf);
                printf("  %-40s %s\n", gguf_kv_key(g, i), buf);
            }
        }
        printf("tensors:\n");
        for (int i = 0; i < n; i++) {
            const struct pxq_tensor *t = model_tensor(m, i);
            printf("  %-48s %-5s [%lld, %lld, %lld]\n", t->name, type_name(t->type), (long long)t->ne[0], (long long)t->ne[1],
                   (long long)t->ne[2]);
        }
    }
    model_free(m);
    return 0;
}
