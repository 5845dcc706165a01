/* cmd_quantize.c - `pxq quantize`: HF checkpoint -> GGUF with Q4_0 / Q4_1 / Q8_0 weights, by
 * round-to-nearest or calibrated (AWQ scaling, GPTQ error compensation). See src/quantize.h and
 * docs/QUANT.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "args.h"
#include "kv_calib.h"
#include "quant.h"
#include "quantize.h"
#include "util.h"

static const char *usage_text =
    "usage: pxq quantize --model HF_DIR --output OUT.gguf [options]\n"
    "  --dtype T                int4 (default) or int8; or the GGUF type: q4_0, q4_1 (int4 --asym), q8_0\n"
    "  --group-size N           weights per scale (32: the GGUF types' block; others are rejected)\n"
    "  --sym | --asym           int4: Q4_0 (symmetric, default) or Q4_1 (with a minimum); int8: Q8_0\n"
    "  --method M               rtn (default), awq, gptq, or awq+gptq (both)\n"
    "  --calib-file FILE        calibration text: a JSON list of strings, or plain text\n"
    "  --calib-size N           calibration sequences (default 128)\n"
    "  --calib-seq-len L        tokens per sequence (default 512)\n"
    "  --act-order              GPTQ: quantize columns by descending activation energy (default off)\n"
    "  --keep-f16 PATTERN       store tensors whose GGUF name matches the glob in F16 (repeatable)\n"
    "  --embd-type T            token_embd type: f32 f16 bf16 q8_0 q4_0 q4_1 (default: the weight type)\n"
    "  --output-type T          lm_head type, also token_embd when tied (default q8_0)\n"
    "  --kv-quant int2          also calibrate the pxq KV cache (V 2-bit) on --calib-file and write the\n"
    "                           pxq.kv.* keys (as pxq kv-calibrate; docs/KVCACHE.md)\n"
    "  --kv-sensitive-ratio R   with --kv-quant: share of KV heads whose V keeps 8 bits (default 0.15)\n"
    "  --kv-chunks N            with --kv-quant: chunks of 256 tokens of calibration text (default 16)\n"
    "  -t, --threads N          CPU threads (default: all)\n"
    "  --no-progress            no progress bar (it is drawn only when stderr is a terminal)\n";

static enum pxq_type parse_type(struct args *a) {
    const char *flag = a->argv[a->i], *s = arg_str(a);
    static const enum pxq_type ok[] = {PXQ_TYPE_F32, PXQ_TYPE_F16, PXQ_TYPE_BF16, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_0, PXQ_TYPE_Q4_1};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcasecmp(s, type_name(ok[i]))) return ok[i];
    fail(a, 2, "%s: unsupported type '%s' (f32, f16, bf16, q8_0, q4_0, q4_1)", flag, s);
    return PXQ_TYPE_F32;
}

int cmd_quantize(int argc, char **argv) {
    struct args a = {argc, argv, 0, "quantize", cmd_quantize};
    struct quantize_params p = quantize_default_params();
    const char *dtype = "int4", *method = "rtn";
    int sym = 1, sym_given = 0, progress = isatty(2), kv_quant = 0, kv_ratio_given = 0, kv_chunks_given = 0;
    struct kv_calib_params kp = kv_calib_default_params();
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (!strcmp(f, "--model") || !strcmp(f, "-m")) p.model_dir = arg_str(&a);
        else if (!strcmp(f, "--output") || !strcmp(f, "-o")) p.output = arg_str(&a);
        else if (!strcmp(f, "--dtype")) dtype = arg_str(&a);
        else if (!strcmp(f, "--group-size")) p.group_size = (int)arg_int(&a, 1, 1 << 20);
        else if (!strcmp(f, "--sym")) sym = 1, sym_given = 1;
        else if (!strcmp(f, "--asym")) sym = 0, sym_given = 1;
        else if (!strcmp(f, "--method")) {
            const char *m = method = arg_str(&a);
            if (!strcmp(m, "rtn")) p.method = QUANT_RTN;
            else if (!strcmp(m, "awq")) p.method = QUANT_AWQ;
            else if (!strcmp(m, "gptq")) p.method = QUANT_GPTQ;
            else if (!strcmp(m, "awq+gptq")) p.method = QUANT_AWQ_GPTQ;
            else fail(&a, 2, "--method: unknown method '%s' (rtn, awq, gptq, awq+gptq)", m);
        } else if (!strcmp(f, "--calib-file")) p.calib_file = arg_str(&a);
        else if (!strcmp(f, "--calib-size")) p.calib_size = (int)arg_int(&a, 1, 1 << 20);
        else if (!strcmp(f, "--calib-seq-len")) p.calib_seq_len = (int)arg_int(&a, 2, 1 << 16);
        else if (!strcmp(f, "--keep-f16")) {
            if (p.n_keep_f16 == QUANTIZE_MAX_KEEP) fail(&a, 2, "--keep-f16: at most %d patterns", QUANTIZE_MAX_KEEP);
            p.keep_f16[p.n_keep_f16++] = arg_str(&a);
        } else if (!strcmp(f, "--embd-type")) p.embd_type = parse_type(&a);
        else if (!strcmp(f, "--output-type")) p.output_type = parse_type(&a);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) p.n_threads = (int)arg_int(&a, 1, 1024);
        else if (!strcmp(f, "--no-progress")) progress = 0;
        else if (!strcmp(f, "--act-order")) p.act_order = 1;
        else if (!strcmp(f, "--kv-quant")) {
            const char *v = arg_str(&a);
            if (!strcmp(v, "int2")) kv_quant = 1;
            else if (!strcmp(v, "none")) kv_quant = 0;
            else fail(&a, 2, "--kv-quant: unknown KV quantization '%s' (int2: the pxq cache's 2-bit V; none)", v);
        } else if (!strcmp(f, "--kv-sensitive-ratio")) kp.ratio = (float)arg_num(&a, 0, 1), kv_ratio_given = 1;
        else if (!strcmp(f, "--kv-chunks")) kp.chunks = (int)arg_int(&a, 1, 1 << 20), kv_chunks_given = 1;
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else
            fail_unknown(&a);
    }
    /* the GGUF type names that bench and plan take: the integer type and the symmetry in one word */
    static const struct { const char *name, *dtype; int sym; } gguf[] = {{"q4_0", "int4", 1}, {"q4_1", "int4", 0},
                                                                         {"q8_0", "int8", 1}};
    for (size_t i = 0; i < sizeof gguf / sizeof *gguf; i++)
        if (!strcasecmp(dtype, gguf[i].name)) {
            if (sym_given && sym != gguf[i].sym)
                fail(&a, 2, "--dtype %s is %s: drop --%s", dtype, gguf[i].sym ? "symmetric" : "asymmetric", sym ? "sym" : "asym");
            dtype = gguf[i].dtype, sym = gguf[i].sym;
        }
    if (!p.model_dir) fail(&a, 2, "no model: give --model HF_DIR");
    if (!p.output) fail(&a, 2, "no output: give --output OUT.gguf");
    char err[1024] = "";
    if (quantize_pick_type(dtype, p.group_size, sym, &p.wtype, err, sizeof err) != 0) fail(&a, 2, "%s", err);
    if (p.method != QUANT_RTN && !p.calib_file) fail(&a, 2, "--method %s needs --calib-file FILE", method);
    if (kv_quant && !p.calib_file) fail(&a, 2, "--kv-quant int2 needs --calib-file FILE");
    if (kv_ratio_given && !kv_quant) fail(&a, 2, "--kv-sensitive-ratio is for --kv-quant int2");
    if (kv_chunks_given && !kv_quant) fail(&a, 2, "--kv-chunks is for --kv-quant int2");
    p.progress = progress;
    /* with --kv-quant the weights go to a temporary file first, and OUT is written once, with the
     * keys, only when the calibration succeeded: a failure leaves an existing OUT as it was */
    const char *final_out = p.output;
    char tmp_out[4096];
    if (kv_quant) {
        if (snprintf(tmp_out, sizeof tmp_out, "%s.kvq-tmp.gguf", final_out) >= (int)sizeof tmp_out) fail(&a, 2, "--output: path too long");
        if (path_exists(tmp_out)) fail(&a, 1, "%s exists (a run that stopped?): remove it first", tmp_out);
        p.output = tmp_out;
    }
    if (quantize_model(&p, err, sizeof err) != 0) fail(&a, 1, "%s", err);
    if (kv_quant) { /* the freshly written model, calibrated as pxq kv-calibrate does, rewritten with the keys */
        kp.calib_file = p.calib_file;
        kp.n_threads = p.n_threads;
        struct pxq_model *m = open_model_or_fail(&a, p.output);
        struct kv_calib c;
        if (kv_calibrate(&c, m, &kp, err, sizeof err) != 0 || kv_calib_write_gguf(tmp_out, final_out, &c, err, sizeof err) != 0) {
            unlink(tmp_out);
            fail(&a, 1, "KV calibration of %s: %s (%s was not written)", final_out, err, final_out);
        }
        unlink(tmp_out);
        p.output = final_out;
        int n8 = 0;
        for (int i = 0; i < c.n_layer_kv * c.n_head_kv; i++) n8 += c.v_bits[i] == 8;
        fprintf(stderr, "pxq quantize: KV cache calibrated: %d of %d KV heads keep V at 8 bits\n", n8, c.n_layer_kv * c.n_head_kv);
        kv_calib_free(&c);
        model_free(m);
    }
    return 0;
}
