/* threadpool.c - see threadpool.h.
 *
 * A forward pass issues dozens of short parallel loops per token, so waking workers through a
 * condition variable each time costs more than the work. Workers spin on an atomic generation
 * counter for a while after each loop (yielding the CPU between polls) and only then sleep on the
 * condition variable; the caller spins until the workers are done. Chunks are taken from an atomic
 * counter (dynamic scheduling), so uneven chunks (attention over different lengths) balance. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "util.h"

#define SPIN_SECONDS 0.002 /* how long an idle worker polls before it sleeps */

struct threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    atomic_ullong generation; /* bumped for each loop */
    atomic_int n_busy;        /* workers still in the current loop */
    atomic_int n_sleeping;
    atomic_int quit;
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
    unsigned long long seen = 0;
    for (;;) {
        /* poll, then sleep */
        double t0 = now_sec();
        int polls = 0;
        while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) {
            if (++polls % 64 == 0) {
                if (now_sec() - t0 > SPIN_SECONDS) {
                    pthread_mutex_lock(&p->mu);
                    atomic_fetch_add(&p->n_sleeping, 1);
                    while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv_work, &p->mu);
                    atomic_fetch_sub(&p->n_sleeping, 1);
                    pthread_mutex_unlock(&p->mu);
                    break;
                }
                sched_yield();
            }
        }
        if (atomic_load(&p->quit)) break;
        seen = atomic_load(&p->generation);
        run_chunks(p, wa.ith);
        atomic_fetch_sub(&p->n_busy, 1);
    }
    return NULL;
}

struct threadpool *threadpool_new(int n_threads) {
    struct threadpool *p = xcalloc(1, sizeof *p);
    p->n_threads = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
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
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
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
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_store(&p->n_busy, p->n_threads - 1);
    atomic_fetch_add(&p->generation, 1); /* publishes the loop (seq_cst) */
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, 0);
    for (int polls = 0; atomic_load(&p->n_busy) > 0;)
        if (++polls % 64 == 0) sched_yield();
}
