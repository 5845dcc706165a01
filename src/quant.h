/* quant.h - GGUF block types: sizes, dequantization, quantization, dot products.
 *
 * Block layouts follow the GGUF spec / ggml `ggml-common.h` exactly (little-endian):
 *   Q8_0: { f16 d; int8 qs[32]; }                       34 B / 32 weights,  w = d*q
 *   Q4_0: { f16 d; uint8 qs[16]; }                      18 B / 32 weights,  w = d*(nibble-8);
 *         element j<16 is the low nibble of qs[j], element j+16 the high nibble of qs[j]
 *   Q4_1: { f16 d; f16 m; uint8 qs[16]; }               20 B / 32 weights,  w = d*nibble + m
 *   Q5_0: { f16 d; uint8 qh[4]; uint8 qs[16]; }         22 B / 32 weights,  w = d*(q-16), q = nibble
 *         | bit j of qh (LE u32) << 4; used by llama.cpp's Q4_K_M for rows not a multiple of 256
 *   Q5_1: { f16 d; f16 m; uint8 qh[4]; uint8 qs[16]; }  24 B / 32 weights,  w = d*q + m
 *   Q4_K: { f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]; }          144 B / 256 weights
 *   Q5_K: { f16 d; f16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; } 176 B / 256
 *   Q6_K: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; }       210 B / 256 weights
 *   F32, F16, BF16: plain arrays (block of 1).
 * Supported for compute (type_supported): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K. Every other ggml type number below PXQ_TYPE_COUNT is known by name and size only.
 *
 * Rows may be unaligned (safetensors data starts at 8 + header length, GGUF alignment may be 1):
 * every function here reads blocks byte-wise / through memcpy, so any address is fine.
 */
#ifndef PXQ_QUANT_H
#define PXQ_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "tensor.h"

/* Elements per block (32 or 256 for quantized types, 1 for float types); 0 for an unknown type. */
int64_t type_block_elems(enum pxq_type t);
/* Bytes per block; 0 for an unknown type. */
size_t type_block_bytes(enum pxq_type t);
/* "f32", "q4_0", "q4_K", ... ("?" for unknown). Names as llama.cpp prints them. */
const char *type_name(enum pxq_type t);
/* 1 if PXQ can compute with this type. */
int type_supported(enum pxq_type t);
/* Bytes of n elements of type t, or 0 if n is not a multiple of the block size or t is unknown. */
size_t type_row_bytes(enum pxq_type t, int64_t n);

/* Dequantize n elements (n a multiple of the block size) from src into dst[n] float32. Formulas are
 * ggml's dequantize_row_* (ggml-quants.c). An unsupported type or a bad n is a programmer error
 * (die): loaders reject such tensors first. */
void dequantize_row(enum pxq_type t, const void *src, float *dst, int64_t n);

/* Quantize n float32 values into dst (row of type t). Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1
 * (round to nearest, scales as llama.cpp's reference quantizers). Returns 0, or -1 for other types. */
int quantize_row(enum pxq_type t, const float *src, void *dst, int64_t n);

/* Dot product of one weight row (type t, n elements, n a multiple of the block size) with float32
 * x[n], float32 accumulation; equals dequantize_row + a float dot up to summation order (tests:
 * relative 1e-5 of sum |w*x|). Thread-safe, no allocation. Unsupported type: die, as above. */
float dot_row_f32(enum pxq_type t, const void *row, const float *x, int64_t n);

/* ---- int8 activations (src/quant_q8.c; llama.cpp's CPU technique, ggml vec_dot_*_q8_0) ----
 * An activation row of n floats (n a multiple of 32) is quantized once to blocks of 32: int8 qs[n],
 * then float d[n/32] (d = amax/127, q = round-half-even(x/d)), then float s[n/32] (s = d * sum of
 * the block's q), q8_act_row_bytes(n) bytes in all (a multiple of 64). Weight rows are then dotted
 * in integers per block of 32 with the float scales applied per block; the only error beyond
 * float rounding is the activation rounding, at most amax/254 per element of each block.
 * The K-quants use the same per-32 activation scales (not llama.cpp's per-256 Q8_K). */

/* 1 for the weight types dot_row_q8 handles: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K. */
int type_has_q8_dot(enum pxq_type t);
/* Bytes of one quantized activation row of n elements (n a multiple of 32). */
size_t q8_act_row_bytes(int64_t n);
/* Quantize x[n] (n a multiple of 32) into dst (q8_act_row_bytes(n) bytes, any alignment of 4).
 * Every kernel set and the _generic C version give bit-identical output for finite x (NaN/Inf: defined but
 * meaningless codes, as the float path would give NaN/Inf outputs). */
void quantize_row_q8_act(const float *x, void *dst, int64_t n);
void quantize_row_q8_act_generic(const float *x, void *dst, int64_t n);
/* y[c] = row . x_c for c < n_tok (1..4): one weight row (type t, n elements, n a multiple of the
 * block size) against n_tok quantized activation rows at xq + c * xq_stride, each code block decoded
 * once for all n_tok rows. The kernel set of q8_isa (below): AVX-512 VNNI or AVX2, or
 * dot_row_q8_generic (portable C, the same integer sum per block of 32; they differ in float
 * summation order only). Thread-safe,
 * no allocation. A type without type_has_q8_dot or n_tok outside 1..4: die (programmer error). */
void dot_row_q8(enum pxq_type t, const void *row, const void *xq, size_t xq_stride, int64_t n, int n_tok, float *y);
/* The same for n_rows weight rows at w + r * w_stride: y[c * y_stride + r] = row r . x_c (c < n_tok,
 * 1..4), the layout of matmul_cpu's output; up to 4 rows share each loaded activation block. */
void dot_rows_q8(enum pxq_type t, const void *w, size_t w_stride, int n_rows, const void *xq, size_t xq_stride,
                 int64_t n, int n_tok, float *y, size_t y_stride);
void dot_row_q8_generic(enum pxq_type t, const void *row, const void *xq, size_t xq_stride, int64_t n, int n_tok,
                        float *y);
/* The kernels in use: "AMX-INT8 + AVX-512 VNNI", "AVX-512 VNNI", "AVX2" or "portable C" (pxq --version, pxq bench). */
const char *q8_cpu_isa(void);

/* Kernel sets, chosen at run time (quant_q8.c): the best the CPU has (__builtin_cpu_supports: AVX2
 * needs AVX2+FMA+F16C; AVX512 needs AVX-512 F, BW, VL and VNNI; AMX needs AVX512, AMX-TILE and
 * AMX-INT8 (cpuid) and Linux's grant of the tile state (arch_prctl ARCH_REQ_XCOMP_PERM), and is
 * AVX512 but for the packed Q4_0/Q8_0 products), or PXQ_CPU_ISA=scalar|avx2|avx512|amx
 * read once at first use (a set the CPU lacks is refused with a message on stderr, and the best
 * is used). q8_isa_set switches process-wide, for tests and A/B runs: -1 if the CPU lacks it.
 * Results differ between sets in float summation order only. Switch only while no matmul runs:
 * tensors packed (q8x8_tensor_pack) under one set are not used by the scalar one, and the AMX
 * set's packed layout is not the others' (release the packs, q8x8_tensor_release, to switch). */
enum q8_isa { Q8_ISA_SCALAR = 0, Q8_ISA_AVX2 = 1, Q8_ISA_AVX512 = 2, Q8_ISA_AMX = 3 };
enum q8_isa q8_isa(void);
int q8_isa_supported(enum q8_isa isa);
int q8_isa_set(enum q8_isa isa);

/* The packed layouts (llama.cpp's q4_0_8x8 idea): a Q4_0 or Q8_0 matrix of n_rows rows of n
 * elements in groups of G = q8x8_group_rows() rows. AVX2/AVX-512 (G = 8; byte layout in
 * q8_kernels.h): each group's blocks in column order, a block of the group = 8 f16 scales then the
 * 8 rows' codes interleaved 8 bytes at a time. AMX (G = 16; kernels_amx.c): a group's codes, 16
 * rows interleaved 4 bytes at a time (the AMX B-tile layout), then its scales. The same byte count
 * as the rows (type_row_bytes(t, n) * n_rows). q8x8_group_rows: G, 0 when the set has no packed
 * kernel; q8x8_type: 1 when it has one for t and n_rows is a multiple of G. */
int q8x8_group_rows(void);
int q8x8_type(enum pxq_type t, int64_t n_rows);
/* Pack n_rows rows of n elements at w (rows contiguous) into dst, in the current set's layout. */
void q8x8_pack(enum pxq_type t, const void *w, int64_t n_rows, int64_t n, void *dst);
/* y[c * y_stride + G g + r] = row G g + r . x_c for g < n_groups, r < G, c < n_tok (1..4): the
 * packed groups at pw against n_tok quantized activation rows at xq + c * xq_stride
 * (quantize_row_q8_act). The same per-block integer sums as dot_row_q8_generic; float summation
 * order differs. Dies if the current set has no packed kernel (q8x8_type) or n_tok is outside
 * 1..4 (programmer errors). */
void dot_groups_q8x8(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                     int n_tok, float *y, size_t y_stride);
/* The same for any n_tok >= 1 (prefill): the AMX set runs 16 tokens x 16 rows at a time on the
 * int8 tiles and the rest on its dot_groups kernel, with the same float arithmetic (kernels_amx.c),
 * so each output is bit for bit what dot_groups_q8x8 gives for its token alone; the other sets
 * call dot_groups_q8x8 per group, 4 tokens at a time. Errors as dot_groups_q8x8. */
void gemm_groups_q8x8(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                      int n_tok, float *y, size_t y_stride);
/* The packed copy of a weight tensor [n, n_rows], made on the first call (thread-safe) and kept in
 * t->cpu_pack until q8x8_tensor_release; NULL when !q8x8_type(t->type, t->ne[1]). The copy takes as
 * much memory as the tensor. */
const void *q8x8_tensor_pack(const struct pxq_tensor *t);
void q8x8_tensor_release(struct pxq_tensor *t);

#endif
