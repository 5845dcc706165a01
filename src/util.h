/* util.h - small shared helpers: errors, allocation, file mapping, half/bfloat16 conversion, timing.
 *
 * Error convention (docs/DESIGN.md, "Errors"): functions return 0 on success and -1 on failure;
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
/* Model, config and tokenizer files are regular files only: a named pipe would block the open (until
 * a writer comes, i.e. forever) and a device (/dev/zero) has no end; both are refused with
 * "PATH: not a regular file", without waiting. regular_file checks by stat and opens nothing: 0 for
 * a regular file (symbolic links followed), else -1 with "PATH: not a regular file",
 * "PATH: Is a directory" or the OS error ("PATH: No such file or directory"). open_regular opens a
 * regular file read-only (O_CLOEXEC, blocking reads) and returns the descriptor, or -1 with the
 * same messages. mmap_file and read_regular_file open through it. */
int regular_file(const char *path, char *err, size_t errlen);
int open_regular(const char *path, char *err, size_t errlen);

/* Map the regular file `path` read-only. Returns 0, or -1 with a message naming the path and the
 * OS error (or "not a regular file"). */
int  mmap_file(struct pxq_mmap *m, const char *path, char *err, size_t errlen);
void mmap_close(struct pxq_mmap *m);

/* Read a whole file into a NUL-terminated malloc'd buffer; *len gets the byte count (without NUL).
 * Returns NULL with a message on failure (including files over `max_bytes`).
 * read_file reads what a user names as text (a prompt, a text to score): a regular file, or a pipe
 * or device read to its end (`-f /dev/stdin`, `-f <(cmd)`, `-f /dev/null`); opening a named pipe
 * waits for its writer, as cat does. read_regular_file is for model, config and tokenizer files:
 * regular files only (open_regular), anything else refused unopened with "PATH: not a regular file". */
char *read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);
char *read_regular_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* Path helpers. path_join writes "dir/name" into out[cap]; returns -1 if it does not fit. */
int path_join(char *out, size_t cap, const char *dir, const char *name);
int is_dir(const char *path);
int file_exists(const char *path); /* a regular file (links followed) */
int path_exists(const char *path); /* anything: a file, directory, pipe, device (links followed) */
int is_special(const char *path);  /* something that is neither a regular file nor a directory */
/* 1 if both paths exist and are the same file (device and inode, links followed). */
int same_file(const char *a, const char *b);

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

/* Number of CPUs this process may run on (its affinity mask: taskset, cpusets; as nproc counts),
 * else of online CPUs; at least 1. The default thread count. */
/* This machine's physical memory in bytes (sysconf), or 0 where unknown. */
size_t host_memory_bytes(void);
int n_cpus(void);

#endif
