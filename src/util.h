/* util.h - small shared helpers: errors, allocation, file mapping, half/bfloat16 conversion, timing.
 *
 * Error convention (see docs/STYLE in README): functions return 0 on success and -1 on failure;
 * constructors return NULL on failure. Functions that face untrusted bytes write a one-line message
 * into a caller-supplied buffer `err` of `errlen` bytes (may be NULL/0). die() is for programmer
 * errors and start-up only.
 */
#ifndef PXQ_UTIL_H
#define PXQ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define PXQ_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define PXQ_PRINTF(a, b)
#endif

/* Print "pxq: <msg>" to stderr and exit(1). Start-up and programmer errors only. */
void die(const char *fmt, ...) PXQ_PRINTF(1, 2);

/* Write a formatted message into err[errlen] (no-op when err is NULL or errlen 0). Returns -1 so
 * callers can `return set_err(err, errlen, "...")`. */
int set_err(char *err, size_t errlen, const char *fmt, ...) PXQ_PRINTF(3, 4);

/* malloc/calloc/realloc that die on exhaustion (sizes here are program-controlled, not request-controlled). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t sz);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* A read-only memory map of a whole file. */
struct pxq_mmap {
    void  *addr;  /* NULL for an empty file */
    size_t size;  /* bytes */
};
/* Map `path` read-only. Returns 0, or -1 with a message naming the path and the OS error. */
int  mmap_file(struct pxq_mmap *m, const char *path, char *err, size_t errlen);
void mmap_close(struct pxq_mmap *m);

/* Read a whole file into a NUL-terminated malloc'd buffer; *len gets the byte count (without NUL).
 * Returns NULL with a message on failure (including files over `max_bytes`). */
char *read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* Path helpers. path_join writes "dir/name" into out[cap]; returns -1 if it does not fit. */
int path_join(char *out, size_t cap, const char *dir, const char *name);
int is_dir(const char *path);
int file_exists(const char *path);

/* Byte spans [off[i], off[i] + len[i]) of n items (a file's tensors): 1 if two of them overlap, with
 * their indices in *a and *b (a's span starts first); 0 if none do. Empty spans overlap nothing. */
int spans_overlap(const uint64_t *off, const uint64_t *len, int n, int *a, int *b);

/* IEEE half and bfloat16 <-> float32 (round-to-nearest-even on the way down). */
float    fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t f32_to_bf16(float f);

/* A growable byte string, always NUL-terminated after the first append. Start with {0}; free(b.p). */
struct sbuf { char *p; size_t n, cap; };
void sbuf_put(struct sbuf *b, const void *s, size_t n);

/* Monotonic wall clock in seconds. */
double now_sec(void);

/* Number of online CPUs (at least 1). */
int n_cpus(void);

#endif
