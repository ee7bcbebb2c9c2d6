// Batch normalisation over NCHW float32 tensors viewed as x (N, C, P), P = H*W (P = 1 for (N, C) inputs): per
// channel c, statistics over the N*P values x[n, c, p]. Per-channel arrays are (C,); "partial" buffers hold one
// record per (run, channel) at r*C + c.
//   batchnorm_stats  GPU-shaped first pass: work-group (c, r) reduces the r-th run of `chunk` consecutive (n, p)
//             pairs of channel c to (count, mean, M2) (M2 = sum of squared deviations from the mean) in partial;
//             each work-item loads UNROLL values (LSIZE apart) before it adds them, to keep loads in flight
//   batchnorm_stats_planes  the same, plane-shaped: work-item (r, c) takes the planes of channel c in images
//             r*nb .. r*nb + nb - 1, eight lanes at a time; no local memory. The CPU shape (nb*P about SPAN values),
//             and the GPU shape's for planes under 8 values, where the kernel above would read scattered words
//             (consecutive work-items here read consecutive channels)
//   batchnorm_stats_finish  merges each channel's runs in order, writes mean and invstd = 1/sqrt(M2/n + eps) and
//             updates running_mean and running_var (with the variance M2 / var_count: n - 1, PyTorch's unbiased one,
//             or n, ONNX's) when they are not NULL
//   batchnorm_apply_runs  batchnorm_stats_finish and batchnorm_apply in one launch, GPU-shaped: work-group (c, r)
//             merges channel c's records as the finish does, group (c, 0) writes what the finish writes, and each
//             normalises the r-th run of channel c, as batchnorm_stats walks it (a launch fewer a batch norm)
//   batchnorm_invstd  invstd = 1/sqrt(var + eps) (evaluation mode, from the running variance)
//   batchnorm_apply  y = (x - mean) * invstd * weight + bias; NULL mean, weight or bias mean 0, 1 and 0 (so dy *
//             weight * invstd is this kernel too). With eps >= 0 the `invstd` argument holds the variance and each
//             channel's 1/sqrt(var + eps) is taken here (evaluation: one launch, no invstd pass); eps < 0: invstd.
//             ACT 1 or 4 (act_of's kinds): the ReLU or ReLU6 of that (a batch norm and the activation after it in one
//             pass); 0: none. GPU-shaped: UNROLL elements per work-item, a UNROLL-th of the tensor apart, all loaded
//             first
//   batchnorm_apply_planes  the same, CPU-shaped: work-item (n, g) takes the planes of channels g*cb .. g*cb + cb - 1
//             of image n (cb*P about SPAN values or more), eight lanes at a time
//   batchnorm_grad_sums  GPU-shaped first pass of backward: work-group (c, r) sums dy and dy * (x - mean) over its
//             run into partial (two floats per record), as batchnorm_stats
//   batchnorm_grad_sums_planes  the same, plane-shaped, as batchnorm_stats_planes
//   batchnorm_grad_finish  adds each channel's runs in order: dbias += sum dy, dweight += sum dy * xhat (when not
//             NULL; with add 0 they are written, not added to, and not read), and, when gmean is not NULL,
//             gmean[c] = sum dy / n, gmean[C + c] = sum dy * xhat / n
//   batchnorm_dx_runs  batchnorm_grad_finish and batchnorm_dx in one launch (without gmean), GPU-shaped, as
//             batchnorm_apply_runs
//   batchnorm_dx  dx = weight * invstd * (dy - gmean[c] - xhat * gmean[C + c]), xhat = (x - mean) * invstd; as
//             batchnorm_apply. With ACT (1 ReLU, 4 ReLU6) it and the gradient sums take dy through that activation's
//             gradient from its output y (act_grad_of) first: the batch norm's output went through it in the apply
//   batchnorm_dx_planes  the same, CPU-shaped, as batchnorm_apply_planes
// Accuracy: no running sum of values is longer than BLOCK terms (a work-item's on the GPU path, a lane's or a plane
// sum's on the plane path). For the statistics, each such block is summed shifted by its own first value and turned
// into (count, mean, M2); blocks, then work-items, then runs are merged by Chan, Golub and LeVeque's update, which is
// stable for any counts, so data far from zero (a mean of 100, a spread of 1) loses no more than a block's rounding:
// no E[x^2] - E[x]^2 over the whole channel. Gradient sums add block sums, then work-items and runs by a tree.
// Defines: LSIZE (work-group size of batchnorm_stats, batchnorm_grad_sums and both finish kernels, a power of two;
// 1 on the CPU-shaped path), BLOCK (the longest running sum; plane-path blocks are SPAN = 8*BLOCK values), UNROLL
// (loads a GPU-shaped work-item issues together; a divisor of BLOCK), ACT (0, or the activation after a training
// batch norm that batchnorm_apply, batchnorm_grad_sums and batchnorm_dx apply: a build of its own, so that the
// plain kernels carry no branch for it).
#include "common.h"
#include "elementwise_formulas.h"

#ifndef LSIZE
#define LSIZE 256   // work-group size of the reductions and the finish kernels
#endif
#ifndef BLOCK
#define BLOCK 64    // terms in a running sum before it is folded into its record
#endif
#ifndef ACT
#define ACT 0       // the activation after the batch norm its kernels apply (act_of's kinds; 0: none)
#endif
#ifndef UNROLL
#define UNROLL 4    // GPU-shaped kernels: values loaded together per work-item
#endif
#define SPAN (8 * BLOCK)  // values in a plane-shaped block: BLOCK per lane of eight
#if LSIZE & (LSIZE - 1)
#error "LSIZE must be a power of two"
#endif
#if BLOCK < 1 || UNROLL < 1 || BLOCK % UNROLL
#error "BLOCK must be a positive multiple of UNROLL"
#endif

// An unaligned float8 load or store: a plane starts wherever n*C*P + c*P falls (PoCL does not inline vload8).
typedef float8 __attribute__((aligned(4))) float8_unaligned;

inline float hsum8(const float8 v) {
    return ((v.s0 + v.s1) + (v.s2 + v.s3)) + ((v.s4 + v.s5) + (v.s6 + v.s7));
}

// (count, mean, M2) of k values from their sums s1 and s2 of (value - shift) and of its square. The shift is one
// of the values, so s2 - s1^2/k cancels only as far as the values spread around the block's own first value.
inline float3 block_stats(const int k, const float shift, const float s1, const float s2) {
    const float d = s1 / (float)k;
    return (float3)((float)k, shift + d, fmax(s2 - s1 * d, 0.0f));
}

// Two disjoint sets' (count, mean, M2) merged; a set of count 0 leaves the other as it is.
inline float3 merge_stats(const float3 a, const float3 b) {
    if (b.x == 0.0f) return a;
    const float n = a.x + b.x, w = b.x / n, d = b.y - a.y;
    return (float3)(n, a.y + d * w, a.z + b.z + d * d * a.x * w);
}

// A GPU-shaped work-item's walk through its run of channel c: it starts at pair `first` = (n, p), element i, and
// steps LSIZE pairs at a time, which is dn images and dp pixels, plus one image more when p passes P (one compare
// per step, no division).
#define RUN_START(first) \
    int e = (first), p = e % P, i = ((e / P) * C + c) * P + p; \
    const int dn = LSIZE / P, dp = LSIZE - dn * P, di = dn * C * P + dp, wrap = (C - 1) * P
#define RUN_STEP() \
    e += LSIZE; p += dp; i += di; \
    if (p >= P) { p -= P; i += wrap; }

__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void batchnorm_stats(__global const float* restrict x, OFFSET_PARAM(x), __global float* restrict partial,
                     OFFSET_PARAM(partial), const int N, const int C, const int P, const int chunk) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, partial)
    const int c = get_group_id(0), r = get_group_id(1), lid = get_local_id(0);
    const int e1 = min(N * P, (r + 1) * chunk);
    __local float4 part[LSIZE];
    float3 acc = (float3)(0.0f);
    RUN_START(r * chunk + lid);
    while (e < e1) {
        const float shift = x[i];
        float s1 = 0.0f, s2 = 0.0f;
        int k = 0;
        for (; k < BLOCK && e + (UNROLL - 1) * LSIZE < e1; k += UNROLL) {
            float v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                v[u] = x[i];
                RUN_STEP();
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const float d = v[u] - shift;
                s1 += d;
                s2 += d * d;
            }
        }
        for (; k < BLOCK && e < e1; k++) {  // the run's last few
            const float d = x[i] - shift;
            s1 += d;
            s2 += d * d;
            RUN_STEP();
        }
        acc = merge_stats(acc, block_stats(k, shift, s1, s2));
    }
    part[lid] = (float4)(acc, 0.0f);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = LSIZE / 2; w > 0; w >>= 1) {
        if (lid < w) part[lid].xyz = merge_stats(part[lid].xyz, part[lid + w].xyz);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) vstore3(part[0].xyz, r * C + c, partial);
}

// A CPU-shaped block: at most SPAN values, in pieces of planes; for planes under 8 values, BLOCK planes, so that
// every running sum (a lane, a plane's tail, the block's sum of pieces) stays within BLOCK terms.
inline int block_limit(const int P) {
    return P >= 8 ? SPAN : BLOCK * P;
}

// Sums of v - shift and of its square over v[0 .. len), in eight lanes and then the tail.
inline float2 shifted_sums(__global const float* v, const int len, const float shift) {
    const int len8 = len & ~7;
    float s1 = 0.0f, s2 = 0.0f;
    if (len8) {  // planes of a few values (1 for (N, C) inputs) skip the lanes' set-up and sum
        float8 l1 = (float8)(0.0f), l2 = (float8)(0.0f);
        for (int p = 0; p < len8; p += 8) {
            const float8 d = *(__global const float8_unaligned*)(v + p) - shift;
            l1 += d;
            l2 += d * d;
        }
        s1 = hsum8(l1);
        s2 = hsum8(l2);
    }
    for (int p = len8; p < len; p++) {
        const float d = v[p] - shift;
        s1 += d;
        s2 += d * d;
    }
    return (float2)(s1, s2);
}

__kernel void batchnorm_stats_planes(__global const float* restrict x, OFFSET_PARAM(x),
                                     __global float* restrict partial, OFFSET_PARAM(partial), const int N, const int C,
                                     const int P, const int nb) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, partial)
    const int gid = get_global_id(0), c = gid % C, r = gid / C, n0 = r * nb;
    if (n0 >= N) return;
    const int n1 = min(N, n0 + nb), limit = block_limit(P);
    float3 acc = (float3)(0.0f);
    float shift = x[(n0 * C + c) * P];
    float2 s = (float2)(0.0f);
    int k = 0;
    for (int n = n0; n < n1; n++) {
        __global const float* plane = x + (n * C + c) * P;
        for (int p0 = 0; p0 < P; p0 += SPAN) {
            const int len = min(SPAN, P - p0);
            if (k + len > limit) {
                acc = merge_stats(acc, block_stats(k, shift, s.x, s.y));
                shift = plane[p0];
                s = (float2)(0.0f);
                k = 0;
            }
            s += shifted_sums(plane + p0, len, shift);
            k += len;
        }
    }
    acc = merge_stats(acc, block_stats(k, shift, s.x, s.y));
    vstore3(acc, r * C + c, partial);
}

// Channel c's records of `partial` merged by a work-group, the same tree in every kernel that uses them (so the same
// bits): lane l merges records l, l + LSIZE, ... in order, then the lanes' results pairwise. Every lane returns the
// whole (count, mean, M2).
inline float3 merged_stats(__global const float* restrict partial, const int runs, const int C, const int c,
                           const int lid, __local float4* part) {
    float3 acc = (float3)(0.0f);
    for (int r = lid; r < runs; r += LSIZE) acc = merge_stats(acc, vload3(r * C + c, partial));
    part[lid] = (float4)(acc, 0.0f);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = LSIZE / 2; w > 0; w >>= 1) {
        if (lid < w) part[lid].xyz = merge_stats(part[lid].xyz, part[lid + w].xyz);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0].xyz;
}

// The finished statistics of channel c written: mean, invstd and the running statistics' update; returns invstd.
inline float stats_written(const float3 st, const int c, const float count, const float eps, const float momentum,
                           const float var_count, __global float* restrict mean, __global float* restrict invstd,
                           __global float* restrict running_mean, __global float* restrict running_var,
                           const int write) {
    const float inv = 1.0f / sqrt(st.z / count + eps);
    if (write) {
        mean[c] = st.y;
        invstd[c] = inv;
        if (running_mean) running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * st.y;
        if (running_var) running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (st.z / var_count);
    }
    return inv;
}

__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void batchnorm_stats_finish(__global const float* restrict partial, OFFSET_PARAM(partial), const int runs, const int C,
                            const float count, const float eps, const float momentum, const float var_count,
                            __global float* restrict mean, OFFSET_PARAM(mean), __global float* restrict invstd,
                            OFFSET_PARAM(invstd), __global float* restrict running_mean, OFFSET_PARAM(running_mean),
                            __global float* restrict running_var, OFFSET_PARAM(running_var)) {
    AT_OFFSET(__global const float*, partial) AT_OFFSET(__global float*, mean) AT_OFFSET(__global float*, invstd)
    AT_OFFSET(__global float*, running_mean) AT_OFFSET(__global float*, running_var)
    const int c = get_group_id(0), lid = get_local_id(0);
    __local float4 part[LSIZE];
    const float3 st = merged_stats(partial, runs, C, c, lid, part);
    stats_written(st, c, count, eps, momentum, var_count, mean, invstd, running_mean, running_var, lid == 0);
}

// batchnorm_stats_finish and batchnorm_apply in one launch, GPU-shaped: work-group (c, r) merges channel c's `runs`
// records as the finish does (every group of the channel the same bits), group (c, 0) writes the finished
// statistics, and each group normalises the r-th run of `chunk` pairs of channel c, walked as batchnorm_stats walks
// its runs (these runs are its own, as many as the grid has: not the records'). Its arguments are the finish's, then
// the apply's.
__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void batchnorm_apply_runs(__global const float* restrict partial, OFFSET_PARAM(partial), const int runs, const int C,
                          const float count, const float eps, const float momentum, const float var_count,
                          __global float* restrict mean, OFFSET_PARAM(mean), __global float* restrict invstd,
                          OFFSET_PARAM(invstd), __global float* restrict running_mean, OFFSET_PARAM(running_mean),
                          __global float* restrict running_var, OFFSET_PARAM(running_var),
                          __global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict weight,
                          OFFSET_PARAM(weight), __global const float* restrict bias, OFFSET_PARAM(bias),
                          __global float* restrict y, OFFSET_PARAM(y), const int N, const int P, const int chunk) {
    AT_OFFSET(__global const float*, partial) AT_OFFSET(__global float*, mean) AT_OFFSET(__global float*, invstd)
    AT_OFFSET(__global float*, running_mean) AT_OFFSET(__global float*, running_var) AT_OFFSET(__global const float*, x)
    AT_OFFSET(__global const float*, weight) AT_OFFSET(__global const float*, bias) AT_OFFSET(__global float*, y)
    const int c = get_group_id(0), r = get_group_id(1), lid = get_local_id(0);
    __local float4 part[LSIZE];
    const float3 st = merged_stats(partial, runs, C, c, lid, part);
    const float inv = stats_written(st, c, count, eps, momentum, var_count, mean, invstd, running_mean, running_var,
                                    r == 0 && lid == 0);
    const float m = st.y, s = inv * (weight ? weight[c] : 1.0f), b = bias ? bias[c] : 0.0f;
    const int e1 = min(N * P, (r + 1) * chunk);
    RUN_START(r * chunk + lid);
    while (e + (UNROLL - 1) * LSIZE < e1) {
        int at[UNROLL];
        float v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            at[u] = i;
            v[u] = x[i];
            RUN_STEP();
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const float out = (v[u] - m) * s + b;
            y[at[u]] = ACT ? act_of(ACT, out) : out;
        }
    }
    for (; e < e1;) {
        const float out = (x[i] - m) * s + b;
        y[i] = ACT ? act_of(ACT, out) : out;
        RUN_STEP();
    }
}

__kernel void batchnorm_invstd(__global const float* restrict var, OFFSET_PARAM(var), const float eps,
                               __global float* restrict invstd, OFFSET_PARAM(invstd), const int C) {
    AT_OFFSET(__global const float*, var) AT_OFFSET(__global float*, invstd)
    const int c = get_global_id(0);
    if (c < C) invstd[c] = 1.0f / sqrt(var[c] + eps);
}

// The per-channel affine map y = (x - m) * s + b of batchnorm_apply.
#define CHANNEL_AFFINE(c) \
    const float m = mean ? mean[c] : 0.0f; \
    const float s = (eps < 0.0f ? invstd[c] : 1.0f / sqrt(invstd[c] + eps)) * (weight ? weight[c] : 1.0f); \
    const float b = bias ? bias[c] : 0.0f

// A GPU-shaped element-wise work-item's elements: e0 + u*G for u < UNROLL, G a UNROLL-th of the total.
#define SPREAD_START() \
    const int G = (total + UNROLL - 1) / UNROLL, e0 = get_global_id(0); \
    if (e0 >= G) return

// ReLU (ACT 1) and ReLU6 (4) of eight values, as act_of's (NaN stays NaN)
inline float8 act8(const float8 v) {
    const float8 low = select(v, (float8)(0.0f), v < (float8)(0.0f));
    return ACT == 4 ? select(low, (float8)(6.0f), v > (float8)(6.0f)) : low;
}

__kernel void batchnorm_apply(__global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict mean,
                              OFFSET_PARAM(mean), __global const float* restrict invstd, OFFSET_PARAM(invstd),
                              __global const float* restrict weight, OFFSET_PARAM(weight),
                              __global const float* restrict bias, OFFSET_PARAM(bias), __global float* restrict y,
                              OFFSET_PARAM(y), const float eps, const int C, const int P, const int total) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, mean) AT_OFFSET(__global const float*, invstd)
    AT_OFFSET(__global const float*, weight) AT_OFFSET(__global const float*, bias) AT_OFFSET(__global float*, y)
    SPREAD_START();
    float v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int e = e0 + u * G;
        v[u] = e < total ? x[e] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int e = e0 + u * G;
        if (e < total) {
            const int c = (e / P) % C;
            CHANNEL_AFFINE(c);
            const float out = (v[u] - m) * s + b;
            y[e] = ACT ? act_of(ACT, out) : out;
        }
    }
}

// The CPU-shaped element-wise kernels' work-item (n, g): channels c0 .. c1 - 1 of image n.
#define CHANNEL_GROUP() \
    const int groups = (C + cb - 1) / cb, gid = get_global_id(0), n = gid / groups; \
    if (n >= N) return; \
    const int c0 = (gid - n * groups) * cb, c1 = min(C, c0 + cb)

__kernel void batchnorm_apply_planes(__global const float* restrict x, OFFSET_PARAM(x),
                                     __global const float* restrict mean, OFFSET_PARAM(mean),
                                     __global const float* restrict invstd, OFFSET_PARAM(invstd),
                                     __global const float* restrict weight, OFFSET_PARAM(weight),
                                     __global const float* restrict bias, OFFSET_PARAM(bias),
                                     __global float* restrict y, OFFSET_PARAM(y), const float eps, const int C,
                                     const int P, const int N, const int cb) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, mean) AT_OFFSET(__global const float*, invstd)
    AT_OFFSET(__global const float*, weight) AT_OFFSET(__global const float*, bias) AT_OFFSET(__global float*, y)
    CHANNEL_GROUP();
    const int P8 = P & ~7;
    for (int c = c0; c < c1; c++) {
        CHANNEL_AFFINE(c);
        __global const float* in = x + (n * C + c) * P;
        __global float* out = y + (n * C + c) * P;
        for (int p = 0; p < P8; p += 8) {
            const float8 v = (*(__global const float8_unaligned*)(in + p) - m) * s + b;
            *(__global float8_unaligned*)(out + p) = ACT ? act8(v) : v;
        }
        for (int p = P8; p < P; p++) {
            const float v = (in[p] - m) * s + b;
            out[p] = ACT ? act_of(ACT, v) : v;
        }
    }
}

__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void batchnorm_grad_sums(__global const float* restrict dy, OFFSET_PARAM(dy), __global const float* restrict x,
                         OFFSET_PARAM(x), __global const float* restrict mean, OFFSET_PARAM(mean),
                         __global const float* restrict y, OFFSET_PARAM(y), __global float* restrict partial,
                         OFFSET_PARAM(partial), const int N, const int C, const int P, const int chunk) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, mean)
    AT_OFFSET(__global const float*, y) AT_OFFSET(__global float*, partial)
    const int c = get_group_id(0), r = get_group_id(1), lid = get_local_id(0);
    const int e1 = min(N * P, (r + 1) * chunk);
    const float m = mean[c];
    __local float2 part[LSIZE];
    float2 acc = (float2)(0.0f);
    RUN_START(r * chunk + lid);
    while (e < e1) {
        float2 s = (float2)(0.0f);
        int k = 0;
        for (; k < BLOCK && e + (UNROLL - 1) * LSIZE < e1; k += UNROLL) {
            float g[UNROLL], v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                g[u] = ACT ? act_grad_of(ACT, y[i], dy[i]) : dy[i];
                v[u] = x[i];
                RUN_STEP();
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) s += (float2)(g[u], g[u] * (v[u] - m));
        }
        for (; k < BLOCK && e < e1; k++) {
            const float g = ACT ? act_grad_of(ACT, y[i], dy[i]) : dy[i];
            s += (float2)(g, g * (x[i] - m));
            RUN_STEP();
        }
        acc += s;
    }
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = LSIZE / 2; w > 0; w >>= 1) {
        if (lid < w) part[lid] += part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) vstore2(part[0], r * C + c, partial);
}

// The activation's gradient of eight values from its saved output y, as act_grad_of's (ReLU: 1, ReLU6: 4)
inline float8 act_grad8(const float8 y, const float8 g) {
    const int8 dead = ACT == 4 ? (y <= (float8)(0.0f)) | (y >= (float8)(6.0f)) : y <= (float8)(0.0f);
    return select(g, (float8)(0.0f), dead);
}

// Sums of g and of g * (v - m) over [0 .. len), in eight lanes and then the tail; with ACT, g is first taken
// through the activation's gradient from its output y.
inline float2 grad_sums(__global const float* g, __global const float* v, __global const float* y, const int len,
                        const float m) {
    const int len8 = len & ~7;
    float s1 = 0.0f, s2 = 0.0f;
    if (len8) {
        float8 l1 = (float8)(0.0f), l2 = (float8)(0.0f);
        for (int p = 0; p < len8; p += 8) {
            float8 gv = *(__global const float8_unaligned*)(g + p);
            if (ACT) gv = act_grad8(*(__global const float8_unaligned*)(y + p), gv);
            l1 += gv;
            l2 += gv * (*(__global const float8_unaligned*)(v + p) - m);
        }
        s1 = hsum8(l1);
        s2 = hsum8(l2);
    }
    for (int p = len8; p < len; p++) {
        const float gp = ACT ? act_grad_of(ACT, y[p], g[p]) : g[p];
        s1 += gp;
        s2 += gp * (v[p] - m);
    }
    return (float2)(s1, s2);
}

__kernel void batchnorm_grad_sums_planes(__global const float* restrict dy, OFFSET_PARAM(dy),
                                         __global const float* restrict x, OFFSET_PARAM(x),
                                         __global const float* restrict mean, OFFSET_PARAM(mean),
                                         __global const float* restrict y, OFFSET_PARAM(y),
                                         __global float* restrict partial, OFFSET_PARAM(partial), const int N,
                                         const int C, const int P, const int nb) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, mean)
    AT_OFFSET(__global const float*, y) AT_OFFSET(__global float*, partial)
    const int gid = get_global_id(0), c = gid % C, r = gid / C, n0 = r * nb;
    if (n0 >= N) return;
    const int n1 = min(N, n0 + nb), limit = block_limit(P);
    const float m = mean[c];
    float2 acc = (float2)(0.0f), s = (float2)(0.0f);
    int k = 0;
    for (int n = n0; n < n1; n++) {
        const int plane = (n * C + c) * P;
        for (int p0 = 0; p0 < P; p0 += SPAN) {
            const int len = min(SPAN, P - p0);
            if (k + len > limit) {
                acc += s;
                s = (float2)(0.0f);
                k = 0;
            }
            s += grad_sums(dy + plane + p0, x + plane + p0, ACT ? y + plane + p0 : y, len, m);
            k += len;
        }
    }
    vstore2(acc + s, r * C + c, partial);
}

// Channel c's gradient-sum records added by a work-group, the same tree in every kernel that uses them; every lane
// returns the whole (sum dy, sum dy * (x - mean)).
inline float2 merged_sums(__global const float* restrict partial, const int runs, const int C, const int c,
                          const int lid, __local float2* part) {
    float2 acc = (float2)(0.0f);
    for (int r = lid; r < runs; r += LSIZE) acc += vload2(r * C + c, partial);
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = LSIZE / 2; w > 0; w >>= 1) {
        if (lid < w) part[lid] += part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}

// The parameter gradients of channel c from its sums: dbias += sum dy, dweight += sum dy * xhat (written with add
// 0), each when not NULL.
inline void grads_written(const float sum_dy, const float sum_dy_xhat, const int c, __global float* restrict dweight,
                          __global float* restrict dbias, const int add) {
    if (dbias) dbias[c] = add ? dbias[c] + sum_dy : sum_dy;
    if (dweight) dweight[c] = add ? dweight[c] + sum_dy_xhat : sum_dy_xhat;
}

__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void batchnorm_grad_finish(__global const float* restrict partial, OFFSET_PARAM(partial), const int runs, const int C,
                           const float count, __global const float* restrict invstd, OFFSET_PARAM(invstd),
                           __global float* restrict dweight, OFFSET_PARAM(dweight), __global float* restrict dbias,
                           OFFSET_PARAM(dbias), __global float* restrict gmean, OFFSET_PARAM(gmean), const int add) {
    AT_OFFSET(__global const float*, partial) AT_OFFSET(__global const float*, invstd)
    AT_OFFSET(__global float*, dweight) AT_OFFSET(__global float*, dbias) AT_OFFSET(__global float*, gmean)
    const int c = get_group_id(0), lid = get_local_id(0);
    __local float2 part[LSIZE];
    const float2 sums = merged_sums(partial, runs, C, c, lid, part);
    if (lid != 0) return;
    const float sum_dy = sums.x, sum_dy_xhat = sums.y * invstd[c];
    grads_written(sum_dy, sum_dy_xhat, c, dweight, dbias, add);
    if (gmean) {
        gmean[c] = sum_dy / count;
        gmean[C + c] = sum_dy_xhat / count;
    }
}

// batchnorm_grad_finish and batchnorm_dx in one launch, GPU-shaped, as batchnorm_apply_runs: work-group (c, r) adds
// channel c's records as the finish does, group (c, 0) writes dweight and dbias, and each group writes dx over the
// r-th run of `chunk` pairs of channel c.
__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void batchnorm_dx_runs(__global const float* restrict partial, OFFSET_PARAM(partial), const int runs, const int C,
                       const float count, __global const float* restrict invstd, OFFSET_PARAM(invstd),
                       __global float* restrict dweight, OFFSET_PARAM(dweight), __global float* restrict dbias,
                       OFFSET_PARAM(dbias), const int add, __global const float* restrict dy, OFFSET_PARAM(dy),
                       __global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict mean,
                       OFFSET_PARAM(mean), __global const float* restrict weight, OFFSET_PARAM(weight),
                       __global float* restrict dx, OFFSET_PARAM(dx), __global const float* restrict y, OFFSET_PARAM(y),
                       const int N, const int P, const int chunk) {
    AT_OFFSET(__global const float*, partial) AT_OFFSET(__global const float*, invstd)
    AT_OFFSET(__global float*, dweight) AT_OFFSET(__global float*, dbias) AT_OFFSET(__global const float*, dy)
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, mean) AT_OFFSET(__global const float*, weight)
    AT_OFFSET(__global float*, dx) AT_OFFSET(__global const float*, y)
    const int c = get_group_id(0), r = get_group_id(1), lid = get_local_id(0);
    __local float2 part[LSIZE];
    const float2 sums = merged_sums(partial, runs, C, c, lid, part);
    const float inv = invstd[c], sum_dy = sums.x, sum_dy_xhat = sums.y * inv;
    if (r == 0 && lid == 0) grads_written(sum_dy, sum_dy_xhat, c, dweight, dbias, add);
    const float m = mean[c], s = inv * (weight ? weight[c] : 1.0f), g0 = sum_dy / count, g1 = sum_dy_xhat / count;
    const int e1 = min(N * P, (r + 1) * chunk);
    RUN_START(r * chunk + lid);
    while (e + (UNROLL - 1) * LSIZE < e1) {
        int at[UNROLL];
        float g[UNROLL], v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            at[u] = i;
            g[u] = ACT ? act_grad_of(ACT, y[i], dy[i]) : dy[i];
            v[u] = x[i];
            RUN_STEP();
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) dx[at[u]] = s * (g[u] - g0 - (v[u] - m) * inv * g1);
    }
    for (; e < e1;) {
        const float gv = ACT ? act_grad_of(ACT, y[i], dy[i]) : dy[i];
        dx[i] = s * (gv - g0 - (x[i] - m) * inv * g1);
        RUN_STEP();
    }
}

// The per-channel constants of batchnorm_dx.
#define CHANNEL_DX(c) \
    const float m = mean[c], inv = invstd[c], s = inv * (weight ? weight[c] : 1.0f); \
    const float g0 = gmean[c], g1 = gmean[C + (c)]

__kernel void batchnorm_dx(__global const float* restrict dy, OFFSET_PARAM(dy), __global const float* restrict x,
                           OFFSET_PARAM(x), __global const float* restrict mean, OFFSET_PARAM(mean),
                           __global const float* restrict invstd, OFFSET_PARAM(invstd),
                           __global const float* restrict weight, OFFSET_PARAM(weight),
                           __global const float* restrict gmean, OFFSET_PARAM(gmean), __global float* restrict dx,
                           OFFSET_PARAM(dx), __global const float* restrict y, OFFSET_PARAM(y), const int C,
                           const int P, const int total) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, mean)
    AT_OFFSET(__global const float*, invstd) AT_OFFSET(__global const float*, weight)
    AT_OFFSET(__global const float*, gmean) AT_OFFSET(__global float*, dx) AT_OFFSET(__global const float*, y)
    SPREAD_START();
    float g[UNROLL], v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int e = e0 + u * G;
        g[u] = e < total ? (ACT ? act_grad_of(ACT, y[e], dy[e]) : dy[e]) : 0.0f;
        v[u] = e < total ? x[e] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int e = e0 + u * G;
        if (e < total) {
            const int c = (e / P) % C;
            CHANNEL_DX(c);
            dx[e] = s * (g[u] - g0 - (v[u] - m) * inv * g1);
        }
    }
}

__kernel void batchnorm_dx_planes(__global const float* restrict dy, OFFSET_PARAM(dy), __global const float* restrict x,
                                  OFFSET_PARAM(x), __global const float* restrict mean, OFFSET_PARAM(mean),
                                  __global const float* restrict invstd, OFFSET_PARAM(invstd),
                                  __global const float* restrict weight, OFFSET_PARAM(weight),
                                  __global const float* restrict gmean, OFFSET_PARAM(gmean),
                                  __global float* restrict dx, OFFSET_PARAM(dx), __global const float* restrict y,
                                  OFFSET_PARAM(y), const int C, const int P, const int N, const int cb) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, mean)
    AT_OFFSET(__global const float*, invstd) AT_OFFSET(__global const float*, weight)
    AT_OFFSET(__global const float*, gmean) AT_OFFSET(__global float*, dx) AT_OFFSET(__global const float*, y)
    CHANNEL_GROUP();
    const int P8 = P & ~7;
    for (int c = c0; c < c1; c++) {
        CHANNEL_DX(c);
        const float h = inv * g1;  // xhat * g1 = (x - m) * h
        const int plane = (n * C + c) * P;
        __global const float* g = dy + plane;
        __global const float* in = x + plane;
        __global float* out = dx + plane;
        __global const float* ya = ACT ? y + plane : y;
        for (int p = 0; p < P8; p += 8) {
            float8 gv = *(__global const float8_unaligned*)(g + p);
            if (ACT) gv = act_grad8(*(__global const float8_unaligned*)(ya + p), gv);
            const float8 xv = *(__global const float8_unaligned*)(in + p);
            *(__global float8_unaligned*)(out + p) = s * (gv - g0 - (xv - m) * h);
        }
        for (int p = P8; p < P; p++) {
            const float gp = ACT ? act_grad_of(ACT, ya[p], g[p]) : g[p];
            out[p] = s * (gp - g0 - (in[p] - m) * h);
        }
    }
}
