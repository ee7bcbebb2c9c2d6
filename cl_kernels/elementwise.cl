// Element-wise ops and small reductions over flat float32 arrays of n elements.
//   act_fwd   y = f(x) for the activation ACT; act_bwd dx = dy * f'(.) written from the saved output y. NaN stays
//             NaN through ReLU and ReLU6, as in PyTorch (fmax would turn it into 0), and its gradient passes, as
//             PyTorch's does (it zeroes only where y <= 0, or y >= 6 for ReLU6)
//   fill      x = value (fill and accumulate: VW elements per work-item too)
//   fill_scaled  x = scale * g[0]: the gradient of a sum (g on the device, so no read-back)
//   mul       out = a * b
//   scale_by  out = a * g[0]: a gradient scaled by a one-element upstream gradient on the device
//   axpby     out = alpha * a + beta * b (act_fwd, act_bwd and axpby: VW = 4 elements per work-item); axpby_relu, its
//             ReLU (act_of's), for a residual sum that a ReLU alone reads
//   affine    out = alpha * a + beta
//   accumulate  dst += src (a leaf's gradient)
//   copy2d    dst[dst_off + r*dst_ld + c] = src[src_off + r*src_ld + c] for r < rows, c < cols: the concatenation and
//             its backward, as one block copy per input (rows: the dimensions before the joined one)
//   copy2d_add  the same, dst = acc + the copy, acc laid out as dst: a slice of a concatenation's gradient added to
//             what its input had received from its other uses (autograd's sum, in the order and bits of axpby's add)
//   copy2d_x4, copy2d_add_x4  the same in float4s, every offset, stride and length counted in float4s: where all of
//             them are multiples of four floats (pointers start float4-aligned), a work-item a float4 (a
//             concatenation copied at 1.9 TB/s a float a work-item on an H100, bench/NOTES.md v53)
//   copy_batch  a batch out of the loader's block: x = n_x floats of xs from x_off, y = n_y ints of ys from y_off,
//             in one launch (two device copies cost NVIDIA's host 16-21 us each, a launch 13-17: bench/NOTES.md v29)
//   reduce_sum  out[0] = scale * sum of x: one work-group of LSIZE, pairwise tree over per-item partial sums; with
//             ACCUMULATE, out[0] += that (a tensor past clnet's index limit is summed a chunk per launch)
//   dropout_fwd  mask = (hash(seed, i) >= p) / (1 - p); y = x * mask
//   bias_grad db[c] += sum over n and p of g[n, c, p] for g (N, C, P) (add 0: db[c] = that sum, db not read): g = dy,
//             or, with y not NULL (the output of the activation ACT that the layer applied itself), g = act_bwd's
//             gradient from y, also written to dx (a fused ReLU's gradient and the bias's in one pass). One
//             work-group of LSIZE per channel. With PARTIAL, work-group (c, s) sums only the s-th run of `chunk`
//             (n, p) pairs and stores it in db[s*C + c]: a first pass for large N*P, whose (S, C) result a plain pass
//             then adds up in order.
//   bias_grad_planes  the same, CPU-shaped: one work-item per channel sums each of its N planes in eight lanes
//             (a float8, one vector register), then the lanes, then adds the plane sums in order: no division
//             per element, no local memory or barriers, and no chain of dependent additions P long.
// Defines: ACT (1 ReLU, 2 Sigmoid, 3 Tanh, 4 ReLU6), LSIZE (work-group size of bias_grad and reduce_sum, a
// power of two), PARTIAL 0/1, ACCUMULATE 0/1.
#include "common.h"
#include "elementwise_formulas.h"

#ifndef ACT
#define ACT 1       // 1 ReLU, 2 Sigmoid, 3 Tanh, 4 ReLU6 (ReLU by default: bias_grad's y, built without ACT)
#endif
#ifndef LSIZE
#define LSIZE 256   // bias_grad and reduce_sum work-group size
#endif
#ifndef PARTIAL
#define PARTIAL 0   // bias_grad: first pass of two
#endif
#ifndef ACCUMULATE
#define ACCUMULATE 0  // reduce_sum: add to out[0] instead of overwriting it
#endif
#if ACT < 1 || ACT > 4
#error "unknown ACT"
#endif
#if LSIZE & (LSIZE - 1)
#error "LSIZE must be a power of two"
#endif

inline float act(const float v) { return act_of(ACT, v); }

// The gradient from the saved output y and the upstream gradient g.
inline float act_grad(const float y, const float g) { return act_grad_of(ACT, y, g); }

__kernel void act_fwd(__global const float* restrict x, OFFSET_PARAM(x), __global float* restrict y, OFFSET_PARAM(y),
                      const int n) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        const float4 v = CVEC(x + i);
        VEC(y + i) = (float4)(act(v.s0), act(v.s1), act(v.s2), act(v.s3));
    } else {
        for (int j = i; j < n; j++) y[j] = act(x[j]);
    }
}

__kernel void act_bwd(__global const float* restrict y, OFFSET_PARAM(y), __global const float* restrict dy,
                      OFFSET_PARAM(dy), __global float* restrict dx, OFFSET_PARAM(dx), const int n) {
    AT_OFFSET(__global const float*, y) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        const float4 v = CVEC(y + i), g = CVEC(dy + i);
        VEC(dx + i) = (float4)(act_grad(v.s0, g.s0), act_grad(v.s1, g.s1), act_grad(v.s2, g.s2),
                               act_grad(v.s3, g.s3));
    } else {
        for (int j = i; j < n; j++) dx[j] = act_grad(y[j], dy[j]);
    }
}

__kernel void fill(__global float* x, OFFSET_PARAM(x), const float value, const int n) {
    AT_OFFSET(__global float*, x)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        VEC(x + i) = (float4)(value);
    } else {
        for (int j = i; j < n; j++) x[j] = value;
    }
}

__kernel void fill_scaled(__global float* restrict x, OFFSET_PARAM(x), __global const float* restrict g,
                          OFFSET_PARAM(g), const float scale, const int n) {
    AT_OFFSET(__global float*, x) AT_OFFSET(__global const float*, g)
    const int i = get_global_id(0);
    if (i < n) x[i] = scale * g[0];
}

__kernel void scale_by(__global const float* restrict a, OFFSET_PARAM(a), __global const float* restrict g,
                       OFFSET_PARAM(g), __global float* restrict out, OFFSET_PARAM(out), const int n) {
    AT_OFFSET(__global const float*, a) AT_OFFSET(__global const float*, g) AT_OFFSET(__global float*, out)
    const int i = get_global_id(0);
    if (i < n) out[i] = a[i] * g[0];
}

__kernel void axpby(__global const float* restrict a, OFFSET_PARAM(a), __global const float* restrict b,
                    OFFSET_PARAM(b), __global float* restrict out, OFFSET_PARAM(out), const float alpha,
                    const float beta, const int n) {
    AT_OFFSET(__global const float*, a) AT_OFFSET(__global const float*, b) AT_OFFSET(__global float*, out)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        VEC(out + i) = alpha * CVEC(a + i) + beta * CVEC(b + i);
    } else {
        for (int j = i; j < n; j++) out[j] = axpby_of(alpha, a[j], beta, b[j]);
    }
}

__kernel void axpby_relu(__global const float* restrict a, OFFSET_PARAM(a), __global const float* restrict b,
                         OFFSET_PARAM(b), __global float* restrict out, OFFSET_PARAM(out), const float alpha,
                         const float beta, const int n) {
    AT_OFFSET(__global const float*, a) AT_OFFSET(__global const float*, b) AT_OFFSET(__global float*, out)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        const float4 v = alpha * CVEC(a + i) + beta * CVEC(b + i);  // axpby's, then act_of's ReLU
        VEC(out + i) = (float4)(act_of(1, v.s0), act_of(1, v.s1), act_of(1, v.s2), act_of(1, v.s3));
    } else {
        for (int j = i; j < n; j++) out[j] = act_of(1, axpby_of(alpha, a[j], beta, b[j]));
    }
}

__kernel void affine(__global const float* restrict a, OFFSET_PARAM(a), __global float* restrict out, OFFSET_PARAM(out),
                     const float alpha, const float beta, const int n) {
    AT_OFFSET(__global const float*, a) AT_OFFSET(__global float*, out)
    const int i = get_global_id(0);
    if (i < n) out[i] = affine_of(alpha, a[i], beta);
}

__kernel void accumulate(__global float* restrict dst, OFFSET_PARAM(dst), __global const float* restrict src,
                         OFFSET_PARAM(src), const int n) {
    AT_OFFSET(__global float*, dst) AT_OFFSET(__global const float*, src)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        VEC(dst + i) += CVEC(src + i);
    } else {
        for (int j = i; j < n; j++) dst[j] += src[j];
    }
}

// What the copy2d kernels share: their pointers are floats or float4s (see the header)
#define COPY2D_BODY \
    const int c = get_global_id(0), r = get_global_id(1); \
    if (c < cols && r < rows) dst[dst_off + r * dst_ld + c] = src[src_off + r * src_ld + c];
#define COPY2D_ADD_BODY \
    const int c = get_global_id(0), r = get_global_id(1); \
    if (c < cols && r < rows) { \
        const int d = dst_off + r * dst_ld + c; \
        dst[d] = acc[d] + src[src_off + r * src_ld + c]; \
    }

__kernel void copy2d(__global const float* restrict src, OFFSET_PARAM(src), const int src_off, const int src_ld,
                     __global float* restrict dst, OFFSET_PARAM(dst), const int dst_off, const int dst_ld,
                     const int rows, const int cols) {
    AT_OFFSET(__global const float*, src) AT_OFFSET(__global float*, dst)
    COPY2D_BODY
}

__kernel void copy2d_add(__global const float* restrict src, OFFSET_PARAM(src), const int src_off, const int src_ld,
                         __global float* restrict dst, OFFSET_PARAM(dst), const int dst_off, const int dst_ld,
                         const int rows, const int cols, __global const float* restrict acc, OFFSET_PARAM(acc)) {
    AT_OFFSET(__global const float*, src) AT_OFFSET(__global float*, dst) AT_OFFSET(__global const float*, acc)
    COPY2D_ADD_BODY
}

__kernel void copy2d_x4(__global const float4* restrict src, OFFSET_PARAM(src), const int src_off, const int src_ld,
                        __global float4* restrict dst, OFFSET_PARAM(dst), const int dst_off, const int dst_ld,
                        const int rows, const int cols) {
    AT_OFFSET(__global const float4*, src) AT_OFFSET(__global float4*, dst)
    COPY2D_BODY
}

__kernel void copy2d_add_x4(__global const float4* restrict src, OFFSET_PARAM(src), const int src_off, const int src_ld,
                            __global float4* restrict dst, OFFSET_PARAM(dst), const int dst_off, const int dst_ld,
                            const int rows, const int cols, __global const float4* restrict acc, OFFSET_PARAM(acc)) {
    AT_OFFSET(__global const float4*, src) AT_OFFSET(__global float4*, dst) AT_OFFSET(__global const float4*, acc)
    COPY2D_ADD_BODY
}

__kernel void copy_batch(__global const float* restrict xs, OFFSET_PARAM(xs), const int x_off, const int n_x,
                         __global const int* restrict ys, OFFSET_PARAM(ys), const int y_off, const int n_y,
                         __global float* restrict x, OFFSET_PARAM(x), __global int* restrict y, OFFSET_PARAM(y)) {
    AT_OFFSET(__global const float*, xs) AT_OFFSET(__global const int*, ys) AT_OFFSET(__global float*, x)
    AT_OFFSET(__global int*, y)
    const int e = get_global_id(0);
    if (e < n_x) {
        x[e] = xs[x_off + e];
    } else if (e < n_x + n_y) {
        y[e - n_x] = ys[y_off + e - n_x];
    }
}

__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void reduce_sum(__global const float* restrict x, OFFSET_PARAM(x), __global float* restrict out, OFFSET_PARAM(out),
                const float scale, const int n) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, out)
    const int lid = get_local_id(0);
    __local float part[LSIZE];
    // Each work-item sums a contiguous run in blocks of 64 (short float32 chains), then the tree adds the runs.
    const int run = CEIL_DIV(n, LSIZE);
    const int e0 = lid * run, e1 = min(n, e0 + run);
    float s = 0.0f;
    for (int b = e0; b < e1; b += 64) {
        float t = 0.0f;
        for (int e = b; e < min(e1, b + 64); e++) t += x[e];
        s += t;
    }
    const float total = group_sum(part, s, LSIZE);
#if ACCUMULATE
    if (lid == 0) out[0] += scale * total;
#else
    if (lid == 0) out[0] = scale * total;
#endif
}

__kernel void mul(__global const float* restrict a, OFFSET_PARAM(a), __global const float* restrict b, OFFSET_PARAM(b),
                  __global float* restrict out, OFFSET_PARAM(out), const int n) {
    AT_OFFSET(__global const float*, a) AT_OFFSET(__global const float*, b) AT_OFFSET(__global float*, out)
    const int i = get_global_id(0);
    if (i < n) out[i] = a[i] * b[i];
}

__kernel void dropout_fwd(__global const float* restrict x, OFFSET_PARAM(x), __global float* restrict y,
                          OFFSET_PARAM(y), __global float* restrict mask, OFFSET_PARAM(mask), const int n,
                          const float p, const uint seed) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y) AT_OFFSET(__global float*, mask)
    const int i = get_global_id(0);
    if (i >= n) return;
    const uint h = clnet_hash(clnet_hash((uint)i ^ 0x9e3779b9U) + seed);
    const float u = (float)(h >> 8) * (1.0f / 16777216.0f);  // uniform in [0, 1)
    const float m = u >= p ? 1.0f / (1.0f - p) : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
}

// The bias gradient's sums (see the header), each work-item's UNROLL elements LSIZE apart loaded before it adds them
// in order: the same order as one element at a time, so the same bits.
#ifndef UNROLL
#define UNROLL 4
#endif
__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void bias_grad(__global const float* restrict y, OFFSET_PARAM(y), __global const float* restrict dy, OFFSET_PARAM(dy),
               __global float* restrict dx, OFFSET_PARAM(dx), __global float* restrict db, OFFSET_PARAM(db),
               const int N, const int C, const int P, const int chunk, const int add) {
    AT_OFFSET(__global const float*, y) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    AT_OFFSET(__global float*, db)
    const int c = get_group_id(0);
    const int lid = get_local_id(0);
    __local float part[LSIZE];
    float s = 0.0f;
#if PARTIAL
    const int e0 = get_group_id(1) * chunk, e1 = min(N * P, e0 + chunk);
#else
    const int e0 = 0, e1 = N * P;
#endif
    for (int e = e0 + lid; e < e1; e += UNROLL * LSIZE) {
        int at[UNROLL];
        float g[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int f = e + u * LSIZE, n = f / P;
            at[u] = f < e1 ? (n * C + c) * P + f - n * P : -1;
            g[u] = at[u] < 0 ? 0.0f : y ? act_grad(y[at[u]], dy[at[u]]) : dy[at[u]];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (at[u] >= 0) {
                if (dx) dx[at[u]] = g[u];
                s += g[u];
            }
        }
    }
    const float total = group_sum(part, s, LSIZE);
#if PARTIAL
    if (lid == 0) db[get_group_id(1) * C + c] = total;
#else
    if (lid == 0) db[c] = add ? db[c] + total : total;
#endif
}

// An unaligned float8 load: p + o is only float-aligned (PoCL does not inline vload8).
typedef float8 __attribute__((aligned(4))) float8_unaligned;

__kernel void bias_grad_planes(__global const float* restrict y, OFFSET_PARAM(y), __global const float* restrict dy,
                               OFFSET_PARAM(dy), __global float* restrict dx, OFFSET_PARAM(dx),
                               __global float* restrict db, OFFSET_PARAM(db), const int N, const int C, const int P,
                               const int add) {
    AT_OFFSET(__global const float*, y) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    AT_OFFSET(__global float*, db)
    const int c = get_global_id(0);
    if (c >= C) return;
    const int P8 = P & ~7;
    float total = 0.0f;
    for (int n = 0; n < N; n++) {
        const int o = (n * C + c) * P;
        float8 lanes = (float8)(0.0f);
        for (int p = 0; p < P8; p += 8) {
            float8 g = *(__global const float8_unaligned*)(dy + o + p);
            if (y) {
                const float8 v = *(__global const float8_unaligned*)(y + o + p);
                g = (float8)(act_grad(v.s0, g.s0), act_grad(v.s1, g.s1), act_grad(v.s2, g.s2), act_grad(v.s3, g.s3),
                             act_grad(v.s4, g.s4), act_grad(v.s5, g.s5), act_grad(v.s6, g.s6), act_grad(v.s7, g.s7));
                *(__global float8_unaligned*)(dx + o + p) = g;
            }
            lanes += g;
        }
        float s = ((lanes.s0 + lanes.s1) + (lanes.s2 + lanes.s3)) + ((lanes.s4 + lanes.s5) + (lanes.s6 + lanes.s7));
        for (int p = P8; p < P; p++) {
            float g = dy[o + p];
            if (y) {
                g = act_grad(y[o + p], g);
                dx[o + p] = g;
            }
            s += g;
        }
        total += s;
    }
    db[c] = add ? db[c] + total : total;
}
