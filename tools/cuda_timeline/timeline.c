/* timeline.c - every kernel's start and end on the GPU, from CUPTI's activity API, for a program run
 * unchanged (tools/cuda_timeline/run.sh): a CUDA injection library. The driver loads it from
 * CUDA_INJECTION64_PATH at cuInit and calls InitializeInjection, which turns on
 * CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL (kernels stay concurrent, and those of a CUDA graph are
 * recorded one by one, with programmatic dependent launch's overlap visible: a kernel's start is
 * when its first block starts). Each record becomes one CSV line in $PXQ_TIMELINE_OUT (default
 * timeline.csv): start_ns,end_ns,correlation,graph_id,stream,blocks,threads,dyn_smem,smem_executed,name
 * (correlation: the launch API call's id, shared by every kernel of one cudaGraphLaunch). Buffers
 * are flushed every 200 ms, when a context is destroyed and at exit. Errors go to stderr; the
 * program runs on. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cupti.h>

#define TL_BUF (8u << 20)

static FILE *tl_out; /* under tl_lock: CUPTI completes buffers on its own thread */
static pthread_mutex_t tl_lock = PTHREAD_MUTEX_INITIALIZER;
static CUpti_SubscriberHandle tl_sub;

static void tl_check(CUptiResult r, const char *what) {
    if (r != CUPTI_SUCCESS) {
        const char *msg = NULL;
        cuptiGetResultString(r, &msg);
        fprintf(stderr, "cuda_timeline: %s: %s\n", what, msg ? msg : "unknown CUPTI error");
    }
}

static void CUPTIAPI tl_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, TL_BUF);
    *size = *buf ? TL_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI tl_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&tl_lock);
    while (tl_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(tl_out, "%llu,%llu,%u,%u,%u,%lld,%d,%d,%u,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->correlationId, k->graphId, k->streamId,
                (long long)k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ, k->dynamicSharedMemory,
                k->sharedMemoryExecuted, k->name ? k->name : "?");
    }
    pthread_mutex_unlock(&tl_lock);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "cuda_timeline: %zu records dropped\n", dropped);
    free(buf);
}

static void CUPTIAPI tl_callback(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data) {
    (void)user, (void)data;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

static void tl_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&tl_lock);
    if (tl_out) fclose(tl_out);
    tl_out = NULL;
    pthread_mutex_unlock(&tl_lock);
}

int InitializeInjection(void) {
    const char *path = getenv("PXQ_TIMELINE_OUT");
    tl_out = fopen(path ? path : "timeline.csv", "w");
    if (!tl_out) {
        perror("cuda_timeline: output");
        return 0;
    }
    fprintf(tl_out, "start_ns,end_ns,correlation,graph_id,stream,blocks,threads,dyn_smem,smem_executed,name\n");
    tl_check(cuptiActivityRegisterCallbacks(tl_buffer_requested, tl_buffer_completed), "register buffers");
    tl_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
    tl_check(cuptiActivityFlushPeriod(200), "flush period"); /* full buffers also reach the file during the run */
    tl_check(cuptiSubscribe(&tl_sub, tl_callback, NULL), "subscribe");
    tl_check(cuptiEnableCallback(1, tl_sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING),
             "context destroy callback");
    atexit(tl_exit);
    return 1;
}
