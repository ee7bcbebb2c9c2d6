// Shared helpers for clnet kernels. Tensors are float32, row-major (NCHW for images); every offset and stride is in
// elements, not bytes.
#ifndef CLNET_COMMON_H
#define CLNET_COMMON_H

// Every kernel takes each __global pointer parameter p with its byte offset clnet_off_p after it, and its body opens
// by moving p there: a launch passes a tensor as the buffer that holds it and its offset in that buffer
// (kernels.cl_arguments), so blocks of one buffer need no sub-buffer (NVIDIA's driver pays at every launch for
// sub-buffers that overlap; bench/NOTES.md v34). Each kernel writes both itself: OFFSET_PARAM(p) after p in its
// signature, AT_OFFSET(T, p) opening its body, T being p's declared type (GEMM_AT_OFFSETS for gemm_common.h's
// GEMM_ARGS); tests/test_kernel_offsets.py checks every kernel for them.
#define OFFSET_PARAM(p) const ulong clnet_off_##p
#define AT_OFFSET(T, p) p = (T)((__global uchar*)(p) + clnet_off_##p);

// Round-up integer division for non-negative a and positive b.
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// Counter-based hash (a 32-bit integer mix): a reproducible random stream from (seed, index) with no state.
inline uint clnet_hash(uint x) {
    x ^= x >> 16; x *= 0x7feb352dU;
    x ^= x >> 15; x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// The sum of every work-item's s over a 1-D work-group of n items (a power of two: the kernel's LSIZE), added in
// one fixed pairwise tree in part (n floats of local memory), so it repeats bit for bit and two kernels that call it
// on the same values agree (elementwise.cl bias_grad, pool.cl maxpool2d_bwd_bias); every work-item gets it.
inline float group_sum(__local float* part, const float s, const int n) {
    const int lid = get_local_id(0);
    part[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = n / 2; w > 0; w >>= 1) {
        if (lid < w) part[lid] += part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}

// Element-wise kernels of the training loop's hot path (activations, adds, fill, the optimizers) take VW elements
// per work-item, as float4s where a whole group lies inside n. One work-item per element ran ReLU at 1.4 TB/s on the
// H200 (VGG-A's forward ReLUs 1.41 ms for 1.9 GB, bench/results/h200-v12), and on PoCL its bounds check keeps the
// work-group from being vectorised: a scalar fill of 20 MB ran at 3 GB/s there, a float4 one at 21 GB/s, SGD with
// momentum at 5 against 47 (bench/NOTES.md, v13). Buffers start 16-byte aligned (pooled allocations and sub-buffers
// at the device's base alignment), so element 4i starts a float4.
#define VW 4
#define VEC(p) (*(__global float4*)(p))
#define CVEC(p) (*(__global const float4*)(p))

// n consecutive floats from p as a vector, read lane by lane: PoCL calls vloadn rather than inline it, and the
// register-blocked kernels (conv_direct.cl, conv1x1.cl) keep their accumulators in registers only so.
#define LANES2(p) ((float2)((p)[0], (p)[1]))
#define LANES4(p) ((float4)((p)[0], (p)[1], (p)[2], (p)[3]))
#define LANES8(p) ((float8)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7]))
#define LANES16(p) ((float16)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7], (p)[8], (p)[9], \
    (p)[10], (p)[11], (p)[12], (p)[13], (p)[14], (p)[15]))

#endif
