/* kv_tier.cu - the host KV tier's memory and moves (--kv-offload; kvcache.h kv_cache_tier).
 *
 * Each of the pool arrays that are indexed by block (K, V, and block selection's key minima and
 * maxima) is one range of device virtual addresses: its first bytes are backed by device memory,
 * the rest by pinned host memory mapped into the same range (CUDA's virtual memory management:
 * cuMemCreate with a host location, cuMemMap, cuMemSetAccess for the device). Block b's address is
 * the same arithmetic whatever its tier, so every kernel reads and writes host-tier blocks in place,
 * over the bus, with no change: a kernel's read of a host block is the tier's host-to-device traffic.
 * The boundary falls on the allocation granularity (2 MiB), so the device part is that rounding
 * larger than the device tier's blocks (CUDA_TIER_SLACK counts it in the plan).
 *
 * Moves: engine.c's offload_for moves a sequence's cold blocks to the host tier before a step;
 * cuda_kv_move copies their bytes on the step stream, so the step that follows sees them.
 *
 * The driver's functions come through cudaGetDriverEntryPoint(ByVersion): no link to libcuda. Host
 * locations for cuMemCreate came with CUDA 12.2; an older toolkit (the sm_70 build's 11.8) builds a
 * backend whose --kv-offload is refused with a message.
 */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#include "cuda/backend_impl.cuh"
#include "kvcache.h"

#if CUDART_VERSION >= 12020 /* host locations for cuMemCreate */
typedef CUresult (*fn_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*fn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*fn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*fn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*fn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*fn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*fn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*fn_free)(CUdeviceptr, size_t);

static struct {
    int loaded;
    fn_granularity granularity;
    fn_reserve reserve;
    fn_create create;
    fn_map map;
    fn_access access;
    fn_unmap unmap;
    fn_release release;
    fn_free addr_free;
} drv;

static int drv_load(void) {
    if (drv.loaded) return drv.loaded > 0 ? 0 : -1;
    drv.loaded = -1;
    struct { const char *name; void **fn; } s[] = {
        {"cuMemGetAllocationGranularity", (void **)&drv.granularity}, {"cuMemAddressReserve", (void **)&drv.reserve},
        {"cuMemCreate", (void **)&drv.create},   {"cuMemMap", (void **)&drv.map},
        {"cuMemSetAccess", (void **)&drv.access}, {"cuMemUnmap", (void **)&drv.unmap},
        {"cuMemRelease", (void **)&drv.release}, {"cuMemAddressFree", (void **)&drv.addr_free},
    };
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
        cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
        if (cudaGetDriverEntryPointByVersion(s[i].name, s[i].fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
#else
        if (cudaGetDriverEntryPoint(s[i].name, s[i].fn, cudaEnableDefault, &q) != cudaSuccess ||
#endif
            q != cudaDriverEntryPointSuccess || !*s[i].fn)
            return -1;
    }
    drv.loaded = 1;
    return 0;
}

/* host: 0 the device, 1 host memory of no particular NUMA node, 2 host NUMA node 0 (older drivers) */
static void prop_of(CUmemAllocationProp *p, int host, int dev) {
    memset(p, 0, sizeof *p);
    p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->location.type = host == 1 ? CU_MEM_LOCATION_TYPE_HOST : host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = host ? 0 : dev;
}

extern "C" void cuda_tier_free(struct cuda_tier *t) {
    if (!t->va) return;
    if (t->mapped) drv.unmap((CUdeviceptr)t->va, t->va_bytes);
    if (t->h_dev) drv.release(t->h_dev);
    if (t->h_host) drv.release(t->h_host);
    drv.addr_free((CUdeviceptr)t->va, t->va_bytes);
    memset(t, 0, sizeof *t);
}

extern "C" int cuda_tier_alloc(struct cuda_tier *t, size_t dev_bytes, size_t bytes, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    if (drv_load() != 0)
        return snprintf(err, errlen, "--kv-offload: the CUDA driver has no virtual memory management entry points"), -1;
    int dev = 0;
    cudaGetDevice(&dev);
    CUmemAllocationProp pd, ph;
    prop_of(&pd, 0, dev), prop_of(&ph, 1, dev);
    size_t gd = 0, gh = 0;
    if (drv.granularity(&gh, &ph, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) prop_of(&ph, 2, dev);
    if (drv.granularity(&gd, &pd, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        drv.granularity(&gh, &ph, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
        return snprintf(err, errlen, "--kv-offload: this driver cannot map host memory into the device's address space"), -1;
    const size_t g = gd > gh ? gd : gh; /* powers of two: the larger is a multiple of the smaller */
    t->va_bytes = (bytes + g - 1) / g * g;
    t->dev_bytes = (dev_bytes + g - 1) / g * g;
    if (t->dev_bytes > t->va_bytes) t->dev_bytes = t->va_bytes;
    t->host_bytes = t->va_bytes - t->dev_bytes;
    CUdeviceptr va = 0;
    if (drv.reserve(&va, t->va_bytes, g, 0, 0) != CUDA_SUCCESS)
        return snprintf(err, errlen, "--kv-offload: cannot reserve %.2f GiB of device addresses", t->va_bytes / 1073741824.0), -1;
    t->va = (void *)va;
    if (t->dev_bytes && drv.create(&t->h_dev, t->dev_bytes, &pd, 0) != CUDA_SUCCESS) {
        t->h_dev = 0;
        cuda_tier_free(t);
        return snprintf(err, errlen, "--kv-offload: cannot allocate the device tier's %.2f GiB", dev_bytes / 1073741824.0), -1;
    }
    if (t->host_bytes && drv.create(&t->h_host, t->host_bytes, &ph, 0) != CUDA_SUCCESS) {
        t->h_host = 0;
        const double gib = t->host_bytes / 1073741824.0;
        cuda_tier_free(t);
        return snprintf(err, errlen, "--kv-offload: cannot pin %.2f GiB of host memory for the host tier (lower -c, "
                                     "--max-num-seqs or --swap-space)", gib), -1;
    }
    if ((t->dev_bytes && drv.map(va, t->dev_bytes, 0, t->h_dev, 0) != CUDA_SUCCESS) ||
        (t->host_bytes && drv.map(va + t->dev_bytes, t->host_bytes, 0, t->h_host, 0) != CUDA_SUCCESS)) {
        cuda_tier_free(t);
        return snprintf(err, errlen, "--kv-offload: cannot map the tiers into one address range"), -1;
    }
    t->mapped = 1;
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE, a.location.id = dev, a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (drv.access(va, t->va_bytes, &a, 1) != CUDA_SUCCESS) {
        cuda_tier_free(t);
        return snprintf(err, errlen, "--kv-offload: the device cannot be given access to the host tier"), -1;
    }
    return 0;
}
#else
extern "C" void cuda_tier_free(struct cuda_tier *t) { (void)t; }
extern "C" int cuda_tier_alloc(struct cuda_tier *t, size_t dev_bytes, size_t bytes, char *err, size_t errlen) {
    (void)dev_bytes, (void)bytes;
    memset(t, 0, sizeof *t);
    snprintf(err, errlen, "--kv-offload: this build's CUDA %d.%d maps no host memory into device addresses (12.2 or "
             "later does)", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    return -1;
}
#endif

#define MOVES_PER_LAUNCH 32

struct move_args {
    uint8_t *base[4];       /* k, v, kmin, kmax (NULL: none) */
    size_t bytes[4];        /* per block, multiples of 16 */
    int src[MOVES_PER_LAUNCH], dst[MOVES_PER_LAUNCH];
    uint32_t *gen;          /* the selection cache's generations (kv.sc_gen), or NULL */
};

/* grid (moves, 4 arrays): block x copies move x's bytes of array y. */
__global__ void kv_move_kernel(const move_args a) {
    const int y = blockIdx.y;
    if (a.gen && y == 0 && threadIdx.x == 0) atomicAdd(&a.gen[a.dst[blockIdx.x]], 1u); /* new bytes: no slot holds them */
    if (!a.base[y]) return;
    const size_t n = a.bytes[y] / 16;
    const uint4 *s = (const uint4 *)(a.base[y] + (size_t)a.src[blockIdx.x] * a.bytes[y]);
    uint4 *d = (uint4 *)(a.base[y] + (size_t)a.dst[blockIdx.x] * a.bytes[y]);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

extern "C" void cuda_kv_move(struct pxq_engine *e, const struct kv_move *mv, int n) {
    cuda_backend *b = B(e);
    const cuda_kv &kv = b->kv;
    move_args a;
    memset(&a, 0, sizeof a);
    a.base[0] = (uint8_t *)kv.k, a.base[1] = (uint8_t *)kv.v;
    a.base[2] = (uint8_t *)kv.kmin, a.base[3] = (uint8_t *)kv.kmax;
    a.bytes[0] = kv.block_bytes_k, a.bytes[1] = kv.block_bytes_v;
    a.bytes[2] = a.bytes[3] = (size_t)kv.n_layer_kv * kv.kv_dim * sizeof(float);
    a.gen = kv.sc_slots ? kv.sc_gen : NULL;
    for (int i0 = 0; i0 < n; i0 += MOVES_PER_LAUNCH) {
        const int m = n - i0 < MOVES_PER_LAUNCH ? n - i0 : MOVES_PER_LAUNCH;
        for (int i = 0; i < m; i++) a.src[i] = mv[i0 + i].src, a.dst[i] = mv[i0 + i].dst;
        kv_move_kernel<<<dim3(m, 4), 256, 0, b->st>>>(a);
    }
    b->tier_moved += (uint64_t)n;
}
