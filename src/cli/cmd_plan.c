/* cmd_plan.c - `pxq plan`: the device memory account of a model, context and budget, without a GPU
 * (memplan.h). For --load-format dummy only the hyperparameters are read: no weight is allocated, so
 * a 32B plan runs on any machine. Exit 0 if it fits (or no budget is given), 1 if not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "spec.h"
#include "engine.h"
#include "load_opts.h"
#include "memplan.h"
#include "model_dummy.h"
#include "quant.h"
#include "util.h"

static const char *usage =
    "usage: pxq plan [-m PATH | --load-format dummy --config FILE.json [--dtype T]] [-c CTX] [--gpu-mem SIZE] [options]\n"
    "  -m, --model PATH        GGUF file or HF directory, its tensors' own types (default: the bundled\n"
    "                          tiny model)\n"
    "  -c, --ctx-size N        context per sequence (default: the model's trained context, at most 4096,\n"
    "                          as pxq run and serve; alias --max-model-len)\n"
    "  --gpu-mem SIZE          the CUDA arena's budget, e.g. 16GiB: everything the engine allocates on\n"
    "                          the device (as pxq run/bench --gpu-mem); the CUDA context comes on top\n"
    "                          (--cuda-context, the 'device total' line). None: just print the account\n"
    "  --max-num-seqs N        concurrent sequences (default 1)\n"
    "  -b, --batch-size N      max tokens per forward step, sizes the activations (default 512)\n"
    "  --kv-cache-type T       " KV_CACHE_TYPES " (default f16), or f32 (the CUDA exact mode)\n"
    "  --kv-sink N             quantized caches: first N positions kept exact (default 4)\n"
    "  --kv-window W           quantized caches: last W positions kept exact (default 128)\n"
    "  --block-size N          positions per KV block (default 16; alias --kv-block-size)\n"
    "  --attention-window W    window + sink attention (as pxq run): a sequence holds its sinks and the\n"
    "                          last W positions' blocks (those past the window are given back)\n"
    "  --attention-sinks N     the first N positions every query sees (with a window)\n"
    "  --kv-topk-blocks K      block selection (with a window): every block kept, with its key bounds\n"
    "  --kv-offload            the host KV tier: the blocks past what --gpu-mem leaves room for live in\n"
    "                          pinned host memory (as pxq run --kv-offload)\n"
    "  --swap-space GIB        the host tier's budget (implies --kv-offload)\n"
    "  --kv-device-blocks N    with --kv-offload: the device tier's blocks (default: what the budget leaves)\n"
    "  --kv-select-cache N     with --kv-offload and --kv-topk-blocks: N of the device tier's blocks cache\n"
    "                          the chosen host blocks (as pxq run; a multiple of 4)\n"
    "  --workspace SIZE        cuBLAS workspace (default 32MiB)\n"
    "  --cuda-context SIZE     CUDA context estimate (default 500MiB)\n"
    "  --spec D                speculative decoding (ngram, draft, mtp): count the recurrent state's checkpoint\n";


int cmd_plan(int argc, char **argv) {
    struct args a = {argc, argv, 0, "plan", cmd_plan};
    const char *model = NULL;
    struct load_opts lo;
    load_opts_init(&lo);
    struct memplan_params p = memplan_default_params();
    int kv_exact_given = 0; /* --kv-sink or --kv-window was given (they act on quantized caches only) */
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (load_opts_parse(&a, &lo)) continue;
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) model = arg_str(&a);
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size") || !strcmp(f, "--max-model-len")) p.n_ctx = (int)arg_int(&a, 1, 1 << 30);
        else if (!strcmp(f, "--gpu-mem")) {
            p.budget = arg_size(&a, 0);
            if (p.budget == 0) fail(&a, 2, "--gpu-mem must be more than 0 (leave it out to print the account alone)");
        }
        else if (!strcmp(f, "--max-num-seqs")) p.n_seq = (int)arg_int(&a, 1, 1 << 16);
        else if (!strcmp(f, "-b") || !strcmp(f, "--batch-size")) p.n_batch = (int)arg_int(&a, 1, 1 << 20);
        else if (!strcmp(f, "--kv-cache-type") || !strcmp(f, "--kv-cache-dtype")) {
            const char *t = arg_str(&a);
            p.kv_f32 = !strcmp(t, "f32");
            p.kv_type = p.kv_f32 ? KV_CACHE_F16 : arg_kv_cache_type(&a, f, t);
        }
        else if (!strcmp(f, "--kv-sink")) p.kv_sink = (int)arg_int(&a, 0, 1 << 20), kv_exact_given = 1;
        else if (!strcmp(f, "--kv-window")) p.kv_window = (int)arg_int(&a, 0, 1 << 20), kv_exact_given = 1;
        else if (!strcmp(f, "--block-size") || !strcmp(f, "--kv-block-size")) p.kv_block_size = (int)arg_int(&a, 1, 4096);
        else if (!strcmp(f, "--attention-window")) p.attn_window = (int)arg_int(&a, 0, 1 << 30);
        else if (!strcmp(f, "--attention-sinks")) p.attn_sinks = (int)arg_int(&a, 0, 1 << 30);
        else if (!strcmp(f, "--kv-topk-blocks")) p.topk_blocks = (int)arg_int(&a, 0, 1 << 30);
        else if (!strcmp(f, "--kv-offload")) p.kv_offload = 1;
        else if (!strcmp(f, "--swap-space")) p.swap_space = (size_t)(arg_num(&a, 1.0 / 1024, 1 << 20) * 1073741824.0), p.kv_offload = 1;
        else if (!strcmp(f, "--kv-device-blocks")) p.kv_dev_blocks = (int)arg_int(&a, 1, 1 << 30);
        else if (!strcmp(f, "--kv-select-cache")) p.kv_select_cache = (int)arg_int(&a, 0, PXQ_KV_SELECT_CACHE_MAX);
        else if (!strcmp(f, "--workspace")) p.workspace = arg_size(&a, 0);
        else if (!strcmp(f, "--cuda-context")) p.cuda_context = arg_size(&a, 0);
        else if (!strcmp(f, "--spec")) { /* counts the checkpoint of speculation's rollback (docs/SPEC.md) */
            const char *v = arg_str(&a);
            if (spec_kind_parse(v) < 0) fail(&a, 2, "--spec: unknown drafter '%s'; the drafters are ngram, draft, mtp", v);
            p.spec = 1;
        }
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("%s", usage);
            load_opts_help(24);
            return 0;
        } else
            fail_unknown(&a);
    }
    load_opts_check(&a, &lo, model);
    char err[512] = "", title[1400];
    struct memplan mp;
    memset(&mp, 0, sizeof mp);
    struct pxq_hparams hp;
    struct pxq_model *m = NULL;
    if (lo.dummy) {
        if (model_hparams_from_config(&hp, lo.config, err, sizeof err) != 0) fail(&a, 1, "%s", err);
        if (memplan_weights_from_hparams(&mp, &hp, lo.dtype, err, sizeof err) != 0) fail(&a, 1, "%s", err);
        snprintf(title, sizeof title, "%s, dummy %s weights", lo.config, type_name(lo.dtype));
    } else {
        m = open_model_or_fail(&a, model);
        hp = *model_hparams(m);
        memplan_weights_from_model(&mp, m);
        snprintf(title, sizeof title, "%s", model_path(m));
    }
    if (p.n_ctx <= 0) p.n_ctx = pxq_default_n_ctx(&hp);
    if (kv_attention_check(p.n_ctx, p.attn_window, p.attn_sinks, p.topk_blocks, err, sizeof err) != 0) fail(&a, 2, "%s", err);
    if (kv_select_cache_check(p.kv_select_cache, p.kv_offload, p.topk_blocks, 0, err, sizeof err) != 0)
        fail(&a, 2, "%s", err);
    if (p.kv_dev_blocks && !p.kv_offload) /* as run's common_warn_unused */
        warn_user(&a, "--kv-device-blocks has no effect without --kv-offload (it sizes the device tier of the KV cache)");
    if (kv_exact_given && p.kv_type == KV_CACHE_F16)
        warn_user(&a, "--kv-sink and --kv-window have no effect with the f16 KV cache (they keep positions exact in a "
                      "quantized one: --kv-cache-type q8_0 or pxq)");
    if (p.kv_offload && !p.budget && !p.kv_dev_blocks)
        fail(&a, 2, "--kv-offload: give --gpu-mem (the device tier is what it leaves room for) or --kv-device-blocks");
    if (memplan_compute(&mp, &hp, &p, err, sizeof err) != 0) fail(&a, 1, "%s", err);
    memplan_print(stdout, &mp, &hp, &p, title);
    model_free(m);
    return mp.fits ? 0 : 1;
}
