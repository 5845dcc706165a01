/* kernels_avx512.c - the CPU kernels for AVX-512 (F, BW, VL, VNNI) on top of AVX2: the Makefile adds
 * the flags to this file alone, and quant_q8.c calls them only where the CPU has them (q8_isa). The
 * code is q8_kernels.h and attn_kernels.h; q8_kernels.h has 256-bit vpdpbusd for the GGUF row layouts, 512-bit for the packed one. */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define Q8_SFX avx512
#include "q8_kernels.h"
#define ATT_SFX avx512
#include "attn_kernels.h"
#else
typedef int kernels_avx512_empty;
#endif
