/* emu_moe.h - what src/cuda/moe.cu and matmul.cu use beyond emu.h (tools/cuda_emu/run_moe.sh):
 * int shuffles, __ldg, __dp4a, __syncwarp (a no-op: fibers only switch at barriers and shuffles, and
 * the kernels share nothing within a warp between them), the _rn float ops, cuda_fp16's host code. */
#pragma once
#include "emu.h"
#include <cuda_fp16.h>
#include <stdint.h>
static inline int __shfl_xor_sync(unsigned, int v, int m) {
    float f;
    memcpy(&f, &v, 4);
    f = emu_shfl(f, m, 1);
    memcpy(&v, &f, 4);
    return v;
}
static inline int __shfl_sync(unsigned, int v, int s) {
    float f;
    memcpy(&f, &v, 4);
    f = emu_shfl(f, s, 0);
    memcpy(&v, &f, 4);
    return v;
}
static inline void __syncwarp() {}
template <class T> static inline T __ldg(const T *p) { return *p; }
static inline int __dp4a(int a, int b, int c) { /* signed bytes */
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
/* bytes of the 8-byte {y, x} (x the low word) picked by s's low 3 bits a nibble (no sign mode) */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)(v >> (8 * ((s >> (4 * i)) & 7)) & 0xff) << (8 * i);
    return r;
}
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
/* xform.py splits launch configurations on commas outside < >: no comparison in a grid size */
#define EMU_CAP(b) ((unsigned)((b) > 65536 ? 65536 : (b)))
