/* util.c - see util.h. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pxq: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

int set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) die("out of memory allocating %zu x %zu bytes", n, sz);
    return p;
}

void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory reallocating %zu bytes", n);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

int regular_file(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) return set_err(err, errlen, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return set_err(err, errlen, "%s: %s", path, strerror(EISDIR));
    if (!S_ISREG(st.st_mode)) return set_err(err, errlen, "%s: not a regular file", path);
    return 0;
}

int open_regular(const char *path, char *err, size_t errlen) {
    if (regular_file(path, err, errlen) != 0) return -1; /* a pipe or device is never opened */
    /* O_NONBLOCK: should the path turn into a pipe between the stat and the open, the open does
     * not wait for a writer; the fstat below then refuses it. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return set_err(err, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    int fl = fcntl(fd, F_GETFL);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        close(fd);
        return set_err(err, errlen, "%s: not a regular file", path);
    }
    return fd;
}

int mmap_file(struct pxq_mmap *m, const char *path, char *err, size_t errlen) {
    m->addr = NULL;
    m->size = 0;
    int fd = open_regular(path, err, errlen);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return set_err(err, errlen, "%s: %s", path, strerror(e));
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        m->addr = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m->addr == MAP_FAILED) {
            m->addr = NULL;
            close(fd);
            return set_err(err, errlen, "%s: mmap: %s", path, strerror(errno));
        }
    }
    close(fd);
    return 0;
}

void mmap_close(struct pxq_mmap *m) {
    if (m->addr) munmap(m->addr, m->size);
    m->addr = NULL;
    m->size = 0;
}

/* All of f (opened from path) into a NUL-terminated buffer; closes f. */
static char *read_stream(FILE *f, const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            if (cap >= max_bytes) {
                fclose(f);
                free(buf);
                set_err(err, errlen, "%s: larger than %zu bytes", path, max_bytes);
                return NULL;
            }
            cap = cap * 2 > max_bytes ? max_bytes : cap * 2;
            buf = xrealloc(buf, cap + 1);
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f), e = errno;
    fclose(f);
    if (bad) {
        free(buf);
        set_err(err, errlen, "%s: %s", path, strerror(e));
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen) {
    if (is_dir(path)) {
        set_err(err, errlen, "%s: %s", path, strerror(EISDIR));
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    return read_stream(f, path, max_bytes, len, err, errlen);
}

char *read_regular_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen) {
    int fd = open_regular(path, err, errlen);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        set_err(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    return read_stream(f, path, max_bytes, len, err, errlen);
}

int path_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int is_special(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

struct span { uint64_t off, len; int i; };

static int cmp_span(const void *x, const void *y) {
    const struct span *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off ? 1 : a->i - b->i;
}

int spans_overlap(const uint64_t *off, const uint64_t *len, int n, int *a, int *b) {
    if (n < 2) return 0;
    struct span *s = xmalloc((size_t)n * sizeof *s);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (len[i] > 0) s[k++] = (struct span){off[i], len[i], i};
    qsort(s, (size_t)k, sizeof *s, cmp_span);
    int found = 0;
    for (int j = 1; j < k && !found; j++)
        if (s[j].off - s[j - 1].off < s[j - 1].len) *a = s[j - 1].i, *b = s[j].i, found = 1;
    free(s);
    return found;
}

float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_fp16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff);
    uint32_t mant = u & 0x7fffff;
    if (exp == 255) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    exp = exp - 127 + 15;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into the exponent: correct */
    return (uint16_t)h;
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

void sbuf_put(struct sbuf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int n_cpus(void) {
    cpu_set_t set; /* the CPUs this process may run on (taskset, cpusets), as nproc counts them */
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

size_t host_memory_bytes(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}
