/* cmd_run.c - `pxq run`: generate from a prompt; only the generated text goes to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "generate.h"
#include "spec_opts.h"
#include "util.h"

static const char *usage =
    "usage: pxq run [-m PATH] (-p TEXT | -f FILE) [-n N] [options]\n"
    "  -p, --prompt TEXT      prompt text\n"
    "  -f, --file FILE        read the prompt from FILE\n"
    "  -n, --n-predict N      tokens to generate (default 128; -1: until the context is full)\n"
    "  --chat                 render the prompt as a user turn with the model's chat template\n"
    "  --system TEXT          system message for --chat\n"
    "  --temp T               temperature (default 0.8; 0 = greedy; alias --temperature)\n"
    "  --top-k K              (default 40; 0 = off)\n"
    "  --top-p P              (default 0.95; 1 = off)\n"
    "  --min-p P              (default 0.05; 0 = off)\n"
    "  --repeat-penalty F     (default 1.0 = off)\n"
    "  --repeat-last-n N      penalty window (default 64; 0 = whole history)\n"
    "  --presence-penalty F   (default 0)\n"
    "  --frequency-penalty F  (default 0)\n"
    "  --seed S               RNG seed (default: random, printed on stderr)\n"
    "  --stop STR             stop string (repeatable)\n"
    "  --ignore-eos           keep generating after an end-of-sequence token\n";

/* The generated text to stdout as it comes; non-zero (stop generating) once stdout has failed: main's
 * finish() then exits 1 with the error. */
static int write_out(void *ctx, const char *text, size_t len) {
    (void)ctx;
    fwrite(text, 1, len, stdout);
    return fflush(stdout) != 0 || ferror(stdout);
}

int cmd_run(int argc, char **argv) {
    struct args a = {argc, argv, 0, "run", cmd_run};
    struct common_opts co;
    common_init(&co);
    const char *prompt = NULL, *file = NULL, *system = NULL;
    const char *stops[PXQ_MAX_STOP];
    int n_stop = 0, chat = 0, seed_set = 0;
    struct gen_params gp = {0};
    struct spec_opts so;
    spec_opts_init(&so);
    gp.n_predict = 128;
    gp.sp = sampler_default_params();
    gp.sp.temperature = 0.8f;
    gp.sp.top_k = 40;
    gp.sp.top_p = 0.95f;
    gp.sp.min_p = 0.05f;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (common_parse(&a, &co) || spec_opts_parse(&a, &so)) continue;
        if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) prompt = arg_str(&a);
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) file = arg_str(&a);
        else if (!strcmp(f, "-n") || !strcmp(f, "--n-predict")) gp.n_predict = (int)arg_int(&a, -1, 1 << 22);
        else if (!strcmp(f, "--chat")) chat = 1;
        else if (!strcmp(f, "--system")) system = arg_str(&a);
        else if (!strcmp(f, "--temp") || !strcmp(f, "--temperature")) gp.sp.temperature = (float)arg_num(&a, 0, 100);
        else if (!strcmp(f, "--top-k")) gp.sp.top_k = (int)arg_int(&a, 0, 1 << 30);
        else if (!strcmp(f, "--top-p")) gp.sp.top_p = (float)arg_num(&a, 1e-9, 1);
        else if (!strcmp(f, "--min-p")) gp.sp.min_p = (float)arg_num(&a, 0, 1);
        else if (!strcmp(f, "--repeat-penalty")) gp.sp.repeat_penalty = (float)arg_num(&a, 1e-6, 100);
        else if (!strcmp(f, "--repeat-last-n")) gp.sp.repeat_last_n = (int)arg_int(&a, 0, 1 << 22);
        else if (!strcmp(f, "--presence-penalty")) gp.sp.presence_penalty = (float)arg_num(&a, -2, 2);
        else if (!strcmp(f, "--frequency-penalty")) gp.sp.frequency_penalty = (float)arg_num(&a, -2, 2);
        else if (!strcmp(f, "--seed")) gp.sp.seed = (uint64_t)arg_int(&a, 0, 0x7fffffffffffffffL), seed_set = 1;
        else if (!strcmp(f, "--stop")) {
            const char *s = arg_str(&a);
            if (n_stop == PXQ_MAX_STOP) fail(&a, 2, "at most %d --stop strings", PXQ_MAX_STOP);
            stops[n_stop++] = s;
        } else if (!strcmp(f, "--ignore-eos")) gp.ignore_eos = 1;
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("%s", usage);
            common_help(23, 1);
            spec_help(23);
            return 0;
        } else
            fail_unknown(&a);
    }
    if (prompt && file) fail(&a, 2, "give either -p or -f, not both");
    char err[512] = "";
    char *text = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (file) {
        if (is_dir(file)) fail(&a, 1, "%s: is a directory, not a prompt file", file);
        text = read_file(file, 256u << 20, &prompt_len, err, sizeof err);
        if (!text) fail(&a, 1, "%s", err);
        prompt = text; /* NUL bytes in the file are text too: prompt_len, not strlen, is its length */
    }
    if (!prompt) fail(&a, 2, "no prompt: give -p TEXT or -f FILE");
    if (!seed_set) gp.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    gp.stop = stops;
    gp.n_stop = n_stop;
    gp.skip_special = 1;
    common_warn_unused(&a, &co.ep);

    struct pxq_model *m = open_model_or_fail(&a, co.model);
    struct pxq_tokenizer *tok = model_tokenizer(m);
    if (!tok) fail(&a, 1, "%s has no tokenizer; pxq run needs one", model_path(m));
    int32_t *ids = NULL;
    int n_ids = 0;
    if (chat) {
        const char *nul = memchr(prompt, 0, prompt_len);
        if (nul) fail(&a, 1, "%s has a NUL byte at offset %zu; --chat renders text without them", file, (size_t)(nul - prompt));
        struct chat_msg msgs[2];
        int nm = 0;
        if (system) msgs[nm++] = (struct chat_msg){.role = "system", .content = system};
        msgs[nm++] = (struct chat_msg){.role = "user", .content = prompt};
        /* control tokens come from the template alone: a prompt holding "<|im_end|>" stays text */
        if (tokenizer_encode_chat(tok, msgs, nm, NULL, 1, 1, &ids, &n_ids, err, sizeof err) != 0) fail(&a, 1, "%s", err);
    } else if (tokenizer_encode(tok, prompt, prompt_len, 1, &ids, &n_ids) != 0) {
        fail(&a, 1, "could not tokenize the prompt: %s", TOKENIZER_ENCODE_FAILED);
    }
    if (n_ids == 0) fail(&a, 1, "the prompt is empty (0 tokens)");
    struct spec_params sp;
    struct pxq_model *dm;
    struct pxq_engine *de;
    spec_opts_setup(&a, &so, m, &co.ep, &sp, &dm, &de);
    gp.spec = &sp;
    struct pxq_engine *e = pxq_engine_new(m, &co.ep, err, sizeof err);
    if (!e) fail(&a, 1, "%s", err);
    const struct pxq_engine_params *ep = pxq_engine_params(e);
    warn_ctx_beyond_trained(&a, m, ep->n_ctx);
    if (n_ids >= ep->n_ctx) fail(&a, 1, "the prompt has %d tokens, more than the context allows (%d; see -c)", n_ids, ep->n_ctx - 1);
    const int n_ctx_train = model_hparams(m)->n_ctx_train;
    char beyond[64] = ""; /* allowed, as llama.cpp does, but said: quality past the trained length is not guaranteed */
    if (ep->n_ctx > n_ctx_train) snprintf(beyond, sizeof beyond, " (beyond the model's trained %d)", n_ctx_train);
    char sampling[48] = "greedy (--temp 0: no seed)"; /* a seed would draw nothing */
    if (gp.sp.temperature >= SAMPLER_TEMP_EPS) snprintf(sampling, sizeof sampling, "seed %llu", (unsigned long long)gp.sp.seed);
    fprintf(stderr, "pxq run: %s (%s), %d prompt tokens, n_ctx %d%s, %d thread%s, %s\n", model_path(m),
            model_hparams(m)->arch_name, n_ids, ep->n_ctx, beyond, ep->n_threads, ep->n_threads == 1 ? "" : "s", sampling);
    struct gen_stats st;
    int rc = generate(e, tok, ids, n_ids, &gp, write_out, NULL, &st, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "pxq run: %s\n", err);
    } else {
        fflush(stdout);
        fprintf(stderr, "\npxq run: prefill %d tokens in %.3f s (%.1f tok/s), decode %d tokens in %.3f s (%.1f tok/s), stop: %s\n",
                st.n_prompt, st.t_prefill, st.n_prompt / (st.t_prefill > 0 ? st.t_prefill : 1e-9), st.n_gen, st.t_decode,
                st.n_gen > 1 ? (st.n_gen - 1) / (st.t_decode > 0 ? st.t_decode : 1e-9) : 0.0,
                st.finish == FINISH_STOP ? "stop" : "length");
        spec_report("pxq run", &sp, &st.spec);
    }
    pxq_engine_free(e);
    pxq_engine_free(de);
    if (dm) model_free(dm);
    free(ids);
    free(text);
    model_free(m);
    return rc == 0 ? 0 : 1;
}
