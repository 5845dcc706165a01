/* threadpool.c - see threadpool.h. Workers take chunks from an atomic counter (dynamic scheduling),
 * so uneven chunks (attention over different sequence lengths) balance themselves. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "util.h"

struct threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t generation; /* bumped for each loop */
    int n_busy;
    int quit;
    /* the current loop */
    range_fn fn;
    void *arg;
    int64_t n, chunk;
    atomic_llong next;
};

static void run_chunks(struct threadpool *p, int ith) {
    for (;;) {
        int64_t i0 = atomic_fetch_add(&p->next, p->chunk);
        if (i0 >= p->n) break;
        int64_t i1 = i0 + p->chunk < p->n ? i0 + p->chunk : p->n;
        p->fn(p->arg, i0, i1, ith);
    }
}

struct worker_arg { struct threadpool *p; int ith; };

static void *worker(void *v) {
    struct worker_arg wa = *(struct worker_arg *)v;
    free(v);
    struct threadpool *p = wa.p;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, wa.ith);
        pthread_mutex_lock(&p->mu);
        if (--p->n_busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct threadpool *threadpool_new(int n_threads) {
    struct threadpool *p = xcalloc(1, sizeof *p);
    p->n_threads = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = xcalloc((size_t)p->n_threads, sizeof *p->threads);
    for (int i = 1; i < p->n_threads; i++) {
        struct worker_arg *wa = xmalloc(sizeof *wa);
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa) != 0) die("pthread_create failed");
    }
    return p;
}

void threadpool_free(struct threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p);
}

int threadpool_size(const struct threadpool *p) { return p->n_threads; }

void parallel_for(struct threadpool *p, int64_t n, int64_t grain, range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t chunk = (n + (int64_t)p->n_threads * 4 - 1) / ((int64_t)p->n_threads * 4);
    if (chunk < grain) chunk = grain;
    if (p->n_threads == 1 || chunk >= n) {
        fn(arg, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->n_busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->n_busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
