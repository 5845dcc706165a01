/* threadpool.h - a fixed pool of worker threads running parallel-for loops.
 *
 * parallel_for(pool, n, fn, arg) calls fn(arg, i0, i1, thread_index) over disjoint ranges covering
 * [0, n) and returns when all are done. The calling thread takes part (as thread 0). Calls are not
 * reentrant: one loop at a time per pool.
 */
#ifndef PXQ_THREADPOOL_H
#define PXQ_THREADPOOL_H

#include <stdint.h>

struct threadpool;

typedef void (*range_fn)(void *arg, int64_t i0, int64_t i1, int ith);

/* n_threads >= 1 (1: no worker threads). */
struct threadpool *threadpool_new(int n_threads);
void threadpool_free(struct threadpool *p);
int threadpool_size(const struct threadpool *p);
/* Split [0, n) into chunks of at least `grain` items, spread over the threads. */
void parallel_for(struct threadpool *p, int64_t n, int64_t grain, range_fn fn, void *arg);

#endif
