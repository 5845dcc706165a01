/* cmd_serve.c - `pxq serve`: an OpenAI-compatible HTTP server with continuous batching
 * (src/server/). Flags are vLLM's where vLLM has one. SIGTERM / SIGINT: stop accepting, let the
 * requests in flight finish (up to --shutdown-timeout seconds, then end them with
 * finish_reason "length"), close, say how many finished and how many were cut short, exit 0.
 * One access-log line per HTTP request goes to stderr (http.c, access_log). */
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef PXQ_CUDA
#include <cuda_runtime_api.h>

#include "cuda/backend.h"
#endif

#include "args.h"
#include "spec_opts.h"
#include "memplan.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "util.h"

static const char *usage =
    "usage: pxq serve [-m PATH] [options]\n"
    "  --host HOST                      address to bind (default 127.0.0.1)\n"
    "  --port N                         TCP port (default 8000; 0: any free port, printed at start)\n"
    "  -c, --max-model-len N            context per sequence: prompt + max_tokens (default: model's, at most 4096)\n"
    "  --max-num-seqs N                 sequences batched at once (default 16)\n"
    "  --max-num-batched-tokens N       tokens per scheduler step, decodes + prefill chunks (default 512)\n"
    "  --num-gpu-blocks-override N      KV pool size in blocks (default: max-num-seqs full contexts)\n"
    "  --enable-prefix-caching          reuse the KV blocks of earlier prompts (default: on; f16 KV cache and\n"
    "                                   all-attention models only)\n"
    "  --no-enable-prefix-caching       prefill every prompt in full\n"
    "  --gpu-memory-utilization F       CUDA: fraction of the device's memory to use (instead of --gpu-mem)\n"
    "  --api-key KEY                    require 'Authorization: Bearer KEY' on /v1 (default: $PXQ_API_KEY)\n"
    "  --served-model-name NAME         model id in the API (default: the -m argument)\n"
    "  --shutdown-timeout S             on SIGTERM, seconds in-flight requests may still run (default 30)\n"
    "  --max-body-bytes N               largest request body (default 4194304)\n"
    "  --connection-timeout S           close connections idle (or stuck mid-request) this long (default 60)\n"
    "  --chat-template PATH             use this Jinja chat template file instead of the model's\n"
    "  --reasoning-parser qwen3         split <think>...</think> out of chat output as reasoning_content\n"
    "  --tool-call-parser hermes        parse <tool_call> blocks into tool_calls (tool_choice \"auto\")\n"
    "  --enable-auto-tool-choice        accepted for vLLM's command lines (--tool-call-parser enables it)\n"
    "Tests only: PXQ_TEST_OUTPUT=TEXT makes every request generate TEXT's tokens, then end (eos).\n";

int cmd_serve(int argc, char **argv) {
    struct args a = {argc, argv, 0, "serve", cmd_serve};
    struct common_opts co;
    common_init(&co);
    struct http_config hc = {"127.0.0.1", 8000, NULL, 4u << 20, 512, 60, 0};
    struct sched_config sc = {16, 512, NULL, 0, NULL};
    struct spec_opts so;
    spec_opts_init(&so);
    const char *name = NULL, *tmpl_path = NULL;
    int reasoning_parser = 0, tool_parser = 0;
    double gpu_util = 0, grace = 30;
    int kv_blocks = 0, batched_set = 0, prefix_caching = 1, prefix_asked = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (common_parse(&a, &co) || spec_opts_parse(&a, &so)) continue;
        if (!strcmp(f, "--host")) hc.host = arg_str(&a);
        else if (!strcmp(f, "--port")) hc.port = (int)arg_int(&a, 0, 65535);
        else if (!strcmp(f, "--max-num-seqs")) sc.max_num_seqs = (int)arg_int(&a, 1, 4096);
        else if (!strcmp(f, "--max-num-batched-tokens")) sc.max_num_batched_tokens = (int)arg_int(&a, 1, 1 << 20), batched_set = 1;
        else if (!strcmp(f, "--num-gpu-blocks-override")) kv_blocks = (int)arg_int(&a, 1, 1 << 30);
        else if (!strcmp(f, "--gpu-memory-utilization")) gpu_util = arg_num(&a, 1e-3, 1);
        else if (!strcmp(f, "--api-key")) hc.api_key = arg_str(&a);
        else if (!strcmp(f, "--served-model-name")) name = arg_str(&a);
        else if (!strcmp(f, "--shutdown-timeout")) grace = arg_num(&a, 0, 86400);
        else if (!strcmp(f, "--connection-timeout")) hc.connection_timeout = (unsigned)arg_int(&a, 1, 86400);
        else if (!strcmp(f, "--max-body-bytes")) hc.max_body = (size_t)arg_int(&a, 1024, 1L << 30);
        else if (!strcmp(f, "--chat-template")) tmpl_path = arg_str(&a);
        else if (!strcmp(f, "--enable-auto-tool-choice")) continue;
        else if (!strcmp(f, "--enable-prefix-caching")) prefix_caching = 1, prefix_asked = 1;
        else if (!strcmp(f, "--no-enable-prefix-caching")) prefix_caching = 0;
        else if (!strcmp(f, "--reasoning-parser")) {
            const char *v = arg_str(&a);
            if (strcmp(v, "qwen3")) fail(&a, 2, "--reasoning-parser '%s' is not available (PXQ has: qwen3)", v);
            reasoning_parser = 1;
        } else if (!strcmp(f, "--tool-call-parser")) {
            const char *v = arg_str(&a);
            if (strcmp(v, "hermes")) fail(&a, 2, "--tool-call-parser '%s' is not available (PXQ has: hermes)", v);
            tool_parser = 1;
        }
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("%s", usage);
            common_help(33, 0); /* -c is --max-model-len, above */
            spec_help(33);
            return 0;
        } else
            fail_unknown(&a);
    }
    if (gpu_util > 0 && co.ep.gpu_mem) fail(&a, 2, "give --gpu-mem or --gpu-memory-utilization, not both");
    if (gpu_util > 0 && co.ep.device == PXQ_DEVICE_CUDA) {
#ifdef PXQ_CUDA
        /* vLLM's meaning: the fraction of the device's memory this server may use. The engine's
         * arena (--gpu-mem) holds weights + KV + activations + workspace; the CUDA context lives
         * outside it, so its estimate (memplan.h) is taken off. */
        size_t dev_free = 0, dev_total = 0;
        const cudaError_t ce = cudaMemGetInfo(&dev_free, &dev_total);
        if (ce != cudaSuccess) { /* worded as the engine's own check (cuda_backend_new) */
            char why[256];
            cuda_no_device_msg((int)ce, 0, why, sizeof why);
            fail(&a, 1, "--gpu-memory-utilization: %s", why);
        }
        double arena = gpu_util * (double)dev_total - (double)MEMPLAN_CONTEXT_DEFAULT;
        if (arena < (double)(64u << 20)) fail(&a, 2, "--gpu-memory-utilization %g leaves no room on this device", gpu_util);
        co.ep.gpu_mem = (size_t)arena;
#else
        fail(&a, 2, "--gpu-memory-utilization needs the CUDA backend (this build has none)");
#endif
    }
    if (!hc.api_key) {
        const char *k = getenv("PXQ_API_KEY");
        if (k && *k) hc.api_key = k;
    }
    if (hc.api_key && !*hc.api_key) fail(&a, 2, "--api-key must not be empty");
    if (!batched_set && sc.max_num_batched_tokens < sc.max_num_seqs) sc.max_num_batched_tokens = sc.max_num_seqs;
    if (sc.max_num_batched_tokens < sc.max_num_seqs)
        fail(&a, 2, "--max-num-batched-tokens (%d) must be at least --max-num-seqs (%d)", sc.max_num_batched_tokens,
             sc.max_num_seqs);
    common_warn_unused(&a, &co.ep);
    if (gpu_util > 0 && co.ep.device == PXQ_DEVICE_CPU)
        warn_user(&a, "--gpu-memory-utilization has no effect on the CPU backend (add --device cuda to use it)");

    struct pxq_model *m = open_model_or_fail(&a, co.model);
    struct pxq_tokenizer *tok = model_tokenizer(m);
    if (!tok) fail(&a, 1, "%s has no tokenizer; pxq serve needs one", model_path(m));
    if (tmpl_path) {
        char terr[512];
        size_t tn = 0;
        char *t = read_file(tmpl_path, 1 << 20, &tn, terr, sizeof terr);
        if (!t) fail(&a, 2, "--chat-template: %s", terr);
        if (!chat_template_caps(t)) fail(&a, 2, "--chat-template %s: not a ChatML template (no <|im_start|>); PXQ renders ChatML templates", tmpl_path);
        tokenizer_set_chat_template(tok, t);
        free(t);
    }
    int32_t *forced = NULL;
    const char *test_out = getenv("PXQ_TEST_OUTPUT");
    if (test_out && *test_out) { /* tests only: see usage */
        int32_t eos[4];
        int nf = 0;
        if (tokenizer_encode(tok, test_out, strlen(test_out), 1, &forced, &nf) != 0 || tokenizer_eos_ids(tok, eos, 4) < 1)
            fail(&a, 1, "PXQ_TEST_OUTPUT: cannot tokenize it, or the tokenizer names no eos");
        forced = xrealloc(forced, (size_t)(nf + 1) * sizeof *forced);
        forced[nf++] = eos[0];
        sc.forced = forced, sc.n_forced = nf;
        fprintf(stderr, "pxq serve: TEST MODE (PXQ_TEST_OUTPUT): every request generates the same %d tokens\n", nf);
    }
    char served[1024];
    if (name) snprintf(served, sizeof served, "%s", name);
    else if (co.model) snprintf(served, sizeof served, "%s", co.model);
    else {
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s", model_path(m));
        snprintf(served, sizeof served, "%s", basename(tmp));
    }
    co.ep.n_seq_max = sc.max_num_seqs;
    co.ep.kv_blocks = kv_blocks;
    co.ep.prefix_caching = prefix_caching;
    struct spec_params sp;
    struct pxq_model *dm;
    struct pxq_engine *de;
    spec_opts_setup(&a, &so, m, &co.ep, &sp, &dm, &de); /* the draft engine: a sequence per running request */
    sc.spec = &sp;
    /* signals: handled by sigwait below, blocked in every thread, so before the engine starts its
     * thread pool: a worker that left SIGTERM unblocked took it with the default action (the process
     * died mid-request, without the graceful drain) */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    char err[512] = "";
    struct pxq_engine *e = pxq_engine_new(m, &co.ep, err, sizeof err);
    if (!e) fail(&a, 1, "%s", err);
    const struct pxq_engine_params *ep = pxq_engine_params(e);
    warn_ctx_beyond_trained(&a, m, ep->n_ctx);

    struct srv_metrics *met = metrics_new();
    struct scheduler *sched = sched_new(e, tok, &sc, met, err, sizeof err);
    if (!sched) fail(&a, 1, "%s", err);
    struct srv_limits lim = {served, tok, model_hparams(m)->n_vocab, ep->n_ctx,
                             pxq_kv_seq_positions(e), reasoning_parser, tool_parser,
                             pxq_engine_can_share_kv(e) ? SRV_MAX_N : 1};
    const char *prefix_why = pxq_prefix_caching(e) ? "on"
                             : !prefix_caching ? "off"
                             : !pxq_engine_can_share_kv(e) ? "off (recurrent layers)"
                             : ep->attn_window && !ep->kv_topk_blocks ? "off (window attention gives back the blocks past the window)"
                             : ep->kv_offload && (ep->device != PXQ_DEVICE_CPU || ep->kv_dev_blocks)
                                 ? "off (the host KV tier: a block moved to it leaves the hash table)"
                                                           : "off (quantized KV cache)";
    if (prefix_asked && !pxq_prefix_caching(e)) /* asked for by name: say why it is off, not just on the start line */
        warn_user(&a, "--enable-prefix-caching has no effect here: prefix caching is %s", prefix_why);
    hc.max_model_len = ep->n_ctx;
    struct http_server *h = http_start(&hc, &lim, sched, met, err, sizeof err);
    if (!h) fail(&a, 1, "%s", err);
    fprintf(stderr,
            "pxq serve: %s (%s) as '%s': max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, "
            "KV %d blocks of %d, prefix caching %s, n up to %d, %d threads%s\n",
            model_path(m), model_hparams(m)->arch_name, served, ep->n_ctx, sc.max_num_seqs, sc.max_num_batched_tokens,
            pxq_kv_blocks_total(e), pxq_kv_block_size(e), prefix_why, lim.max_n, ep->n_threads, hc.api_key ? ", API key required" : "");
    int v6 = strchr(hc.host, ':') != NULL;
    fprintf(stderr, "pxq serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", hc.host, v6 ? "]" : "", http_port(h));
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "pxq serve: %s: finishing %d request(s) in flight (up to %g s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
            sched_in_flight(sched), grace);
    http_quiesce(h);
    int n_cut = 0;
    const int n_done = sched_drain(sched, grace, &n_cut);
    for (int i = 0; i < 500 && http_active(h) > 0; i++) usleep(10000); /* let the last bytes go out */
    http_stop(h);
    sched_free(sched);
    metrics_free(met);
    pxq_engine_free(e);
    pxq_engine_free(de);
    if (dm) model_free(dm);
    model_free(m);
    free(forced);
    fprintf(stderr, "pxq serve: stopped: %d request(s) finished while draining, %d cut short at the %g s grace period\n",
            n_done, n_cut, grace);
    return 0;
}
