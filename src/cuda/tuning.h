/* tuning.h - the CUDA backend's knobs in one place: the PXQ_CUDA_* environment variables, read once
 * by cuda_tuning_from_env when an engine is created (backend.cu), into one struct that creation
 * consults. The defaults are the measured best (docs/CUDA.md has the table of knobs, docs/PERF.md
 * the measurements); the knobs are for diagnosis (exact mode, a feature off) and for benchmarks
 * that re-tune a path on another GPU. No CPU twin: the CPU engine has no knobs but PXQ_CPU_EXACT.
 */
#ifndef PXQ_CUDA_TUNING_H
#define PXQ_CUDA_TUNING_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which prefill stream gets the higher priority (PXQ_CUDA_DEQ_PRIO=gemm|deq|same). */
enum cuda_deq_prio { CUDA_PRIO_GEMM, CUDA_PRIO_DEQ, CUDA_PRIO_SAME };

/* Each field: its variable, its default. Features that need the device (PDL, the tensor cores,
 * the attention kernels) are used where the knob leaves them on and the device has them. */
struct cuda_tuning {
    /* diagnosis: exact mode and features off (0 turns each off) */
    int exact;            /* PXQ_CUDA_FP32=1: f32 KV, every matmul through the fp32 mat-vec; 0 */
    int graphs;           /* PXQ_CUDA_GRAPHS: decode steps as CUDA graphs; 1 */
    int pdl;              /* PXQ_CUDA_PDL: programmatic dependent launch (sm_90); 1 */
    int mma;              /* PXQ_CUDA_MMA: 3-16-token steps on the int8 tensor cores; 1 */
    int moe_mma;          /* PXQ_CUDA_MOE_MMA: MoE prefill tiles on the int8 tensor cores; 1 */
    int stack;            /* PXQ_CUDA_STACK: stacked weights (one launch for q|k|v, gate|up, ...); 1 */
    int flash;            /* PXQ_CUDA_FLASH: the flash kernel for prefill attention; 1 */
    int decode_mma;       /* PXQ_CUDA_DECODE_MMA: decode attention on the tensor cores; 1 */
    int stage_o;          /* PXQ_CUDA_STAGE_O: the one-token o projection stages its weight (PDL); 1 */
    int fuse_dn;          /* PXQ_CUDA_FUSE_DN: a decode DeltaNet step in one launch; 1 */
    /* decode tuning */
    int pdl_tokens;       /* PXQ_CUDA_PDL_TOKENS=N: steps of up to N tokens use PDL; -1: every decode step */
    int mv_rows, mv_warps;      /* PXQ_CUDA_MV=R,W: the dp4a mat-vec's block; 0, 0: by shape */
    int mma_mr, mma_kp;         /* PXQ_CUDA_MMA_TUNE=MR,KP: the int8 mma mat-vec's tiling; 0, 0: by shape */
    int moe_mma_mr, moe_mma_kp; /* PXQ_CUDA_MOE_MMA_TUNE=MR,KP: the MoE prefill tiles'; 0, 0: built-in */
    int moe_q8_rows;      /* PXQ_CUDA_MOE_Q8_R=R: expert rows a block of the MoE decode mat-vec; 0: built-in */
    int moe_group;        /* PXQ_CUDA_MOE_GROUP=1: MoE decode steps of several tokens by expert; 0 */
    int early_trigger;    /* PXQ_CUDA_EARLY_TRIGGER: mask of the dp4a mat-vecs that launch the next kernel at
                           * their start (1 q|k|v, 2 DeltaNet in-projection, 8 gate|up, 16 lm_head); 11 */
    int mv_ahead;         /* PXQ_CUDA_MV_AHEAD: mask (the same bits) of those that keep two steps of
                           * weights in flight; 1 */
    double l2_pf_mib;     /* PXQ_CUDA_L2_PREFETCH=MiB[,blocks]: L2 prefetch of the next weight (0: off); 4 */
    int l2_pf_blocks;     /* ... by this many of the mat-vec's last blocks; 0: 4 x SMs */
    int decode_cfg;       /* PXQ_CUDA_DECODE_CFG=k: the decode attention's k-th configuration; -1: first that fits */
    int split_blocks;     /* PXQ_CUDA_SPLIT_BLOCKS=N: decode attention splits for a wave of N blocks per SM; 0: the
                           * kernel's own (2; the quantized cache's kernel: the blocks an SM it runs, 3 on sm_90) */
    int stage_blocks;     /* PXQ_CUDA_KV_STAGE_BLOCKS=N: host-tier blocks a staging slab of prefill holds, at most
                           * CUDA_KV_STAGE_BYTES' share; 0: that share (N < 0: no staging, host blocks read in
                           * place) */
    int stage_dma;        /* PXQ_CUDA_KV_STAGE_DMA=1: staged slabs copied by the copy engines where they come in
                           * few runs of pool ids; 0: the gather kernel (kernels read the tier's mapped host
                           * memory as the attention kernels and cuda_kv_move do; the 2D copies have not run
                           * on a GPU yet) */
    /* prefill tuning */
    size_t tile;          /* PXQ_CUDA_TILE=N: weight tile elements (at most the plan's); 0: the plan's */
    int sm_target;        /* PXQ_CUDA_SM_TARGET=N: SMs the GEMMs are sized for (0: all); -1: 7/8 of them */
    int deq_prio;         /* PXQ_CUDA_DEQ_PRIO: enum cuda_deq_prio; CUDA_PRIO_GEMM */
};

/* The knobs from the environment, each unset one at its default. */
void cuda_tuning_from_env(struct cuda_tuning *t);

#ifdef __cplusplus
}
#endif

#endif
