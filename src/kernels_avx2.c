/* kernels_avx2.c - the CPU kernels for AVX2 + FMA + F16C: the Makefile adds those flags to this file
 * alone, and quant_q8.c calls them only where the CPU has them (q8_isa). The code is q8_kernels.h and attn_kernels.h. */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q8_SFX avx2
#include "q8_kernels.h"
#define ATT_SFX avx2
#include "attn_kernels.h"
#else
typedef int kernels_avx2_empty; /* not x86-64, or built without the flags: quant_q8.c uses C */
#endif
