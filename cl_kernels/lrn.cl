// Local response normalisation across channels (PyTorch's local_response_norm, AlexNet's LRN) over NCHW float32
// tensors viewed as (N, C, P), P = H*W (P = 1 for (N, C) inputs). Channel c's window is c - size/2 .. c + (size-1)/2,
// clipped to 0 .. C-1 (PyTorch pads size/2 zero channels in front and (size-1)/2 behind, then averages `size`).
//   lrn_fwd    scale = k + alpha/size * sum over the window of x^2; y = x * scale^-beta; an element per work-item,
//              which reads its window's values down its column (they are cache hits for the neighbouring channels)
//   lrn_fwd_planes  the same, CPU-shaped: one work-item per cb planes (n, c0 .. c0 + cb - 1), eight lanes at a time
//   lrn_bwd    dx = dy * scale^-beta - 2*alpha*beta/size * x * sum over the channels j whose window holds c
//              (c - (size-1)/2 .. c + size/2, clipped) of dy[j] * y[j] / scale[j]; an element per work-item
//   lrn_bwd_planes  the same, CPU-shaped
// Every element's window is summed afresh (no running sum slid across channels, whose additions and removals of
// squares would carry rounding from one channel to the next). scale^-beta is exp2(-beta * log2(scale)) (scale > 0:
// pow's handling of negative bases only costs; PoCL's vector pow ran 5x slower), and for AlexNet's beta = 0.75
// 1 / sqrt(scale * sqrt(scale)), another 4x on PoCL, where the power dominated the kernel. Defines: none.

#include "common.h"

// An unaligned float8 load or store: a plane starts wherever n*C*P + c*P falls (PoCL does not inline vload8).
typedef float8 __attribute__((aligned(4))) float8_unaligned;
#define LOAD8(ptr) (*(__global const float8_unaligned*)(ptr))
#define STORE8(ptr) (*(__global float8_unaligned*)(ptr))
// s^-beta for s > 0, scalar or float8 (beta is uniform, so the choice is one branch per work-item)
#define NEG_POW(s, beta) ((beta) == 0.75f ? rsqrt((s) * sqrt(s)) : exp2(-(beta) * log2(s)))

__kernel void lrn_fwd(__global const float* restrict x, OFFSET_PARAM(x), __global float* restrict y, OFFSET_PARAM(y),
                      __global float* restrict scale, OFFSET_PARAM(scale), const int C, const int P, const int total,
                      const int size, const float alpha_size, const float beta, const float k) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y) AT_OFFSET(__global float*, scale)
    const int e = get_global_id(0);
    if (e >= total) return;
    const int nc = e / P, c = nc % C;
    __global const float* column = x + e - c * P;  // channel 0 of this image at this pixel
    const int j0 = max(0, c - size / 2), j1 = min(C - 1, c + (size - 1) / 2);
    float s = 0.0f;
    for (int j = j0; j <= j1; j++) {
        const float v = column[j * P];
        s += v * v;
    }
    const float sc = k + alpha_size * s;
    scale[e] = sc;
    y[e] = x[e] * NEG_POW(sc, beta);
}

// A CPU-shaped work-item (n, g): channels c0 .. c1 - 1 of image n, cb of them (cb*P at least a few hundred values,
// so that small planes, 1 value for (N, C) inputs, are not a work-item each).
#define CHANNEL_GROUP() \
    const int groups = (C + cb - 1) / cb, gid = get_global_id(0), n = gid / groups; \
    if (n >= N) return; \
    const int c0 = (gid - n * groups) * cb, c1 = min(C, c0 + cb), P8 = P & ~7

__kernel void lrn_fwd_planes(__global const float* restrict x, OFFSET_PARAM(x), __global float* restrict y,
                             OFFSET_PARAM(y), __global float* restrict scale, OFFSET_PARAM(scale), const int C,
                             const int P, const int N, const int cb, const int size, const float alpha_size,
                             const float beta, const float k) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y) AT_OFFSET(__global float*, scale)
    CHANNEL_GROUP();
    for (int c = c0; c < c1; c++) {
        const int plane = (n * C + c) * P;
        const int j0 = max(0, c - size / 2) - c, j1 = min(C - 1, c + (size - 1) / 2) - c;  // relative to c
        for (int p = 0; p < P8; p += 8) {
            __global const float* at = x + plane + p;
            float8 s = (float8)(0.0f);
            for (int j = j0; j <= j1; j++) {
                const float8 v = LOAD8(at + j * P);
                s += v * v;
            }
            const float8 sc = k + alpha_size * s;
            STORE8(scale + plane + p) = sc;
            STORE8(y + plane + p) = LOAD8(at) * NEG_POW(sc, beta);
        }
        for (int p = P8; p < P; p++) {
            __global const float* at = x + plane + p;
            float s = 0.0f;
            for (int j = j0; j <= j1; j++) s += at[j * P] * at[j * P];
            const float sc = k + alpha_size * s;
            scale[plane + p] = sc;
            y[plane + p] = at[0] * NEG_POW(sc, beta);
        }
    }
}

__kernel void lrn_bwd(__global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict y,
                      OFFSET_PARAM(y), __global const float* restrict scale, OFFSET_PARAM(scale),
                      __global const float* restrict dy, OFFSET_PARAM(dy), __global float* restrict dx,
                      OFFSET_PARAM(dx), const int C, const int P, const int total, const int size, const float beta,
                      const float coef) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, y) AT_OFFSET(__global const float*, scale)
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int e = get_global_id(0);
    if (e >= total) return;
    const int nc = e / P, c = nc % C, col = e - c * P;
    const int j0 = max(0, c - (size - 1) / 2), j1 = min(C - 1, c + size / 2);
    float t = 0.0f;
    for (int j = j0; j <= j1; j++) {
        const int i = col + j * P;
        t += dy[i] * y[i] / scale[i];
    }
    dx[e] = dy[e] * NEG_POW(scale[e], beta) - coef * x[e] * t;
}

__kernel void lrn_bwd_planes(__global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict y,
                             OFFSET_PARAM(y), __global const float* restrict scale, OFFSET_PARAM(scale),
                             __global const float* restrict dy, OFFSET_PARAM(dy), __global float* restrict dx,
                             OFFSET_PARAM(dx), const int C, const int P, const int N, const int cb, const int size,
                             const float beta, const float coef) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, y) AT_OFFSET(__global const float*, scale)
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    CHANNEL_GROUP();
    for (int c = c0; c < c1; c++) {
        const int plane = (n * C + c) * P;
        const int j0 = max(0, c - (size - 1) / 2) - c, j1 = min(C - 1, c + size / 2) - c;  // relative to c
        for (int p = 0; p < P8; p += 8) {
            const int i = plane + p;
            float8 t = (float8)(0.0f);
            for (int j = j0; j <= j1; j++) {
                const int o = i + j * P;
                t += LOAD8(dy + o) * LOAD8(y + o) / LOAD8(scale + o);
            }
            STORE8(dx + i) = LOAD8(dy + i) * NEG_POW(LOAD8(scale + i), beta) - coef * LOAD8(x + i) * t;
        }
        for (int p = P8; p < P; p++) {
            const int i = plane + p;
            float t = 0.0f;
            for (int j = j0; j <= j1; j++) {
                const int o = i + j * P;
                t += dy[o] * y[o] / scale[o];
            }
            dx[i] = dy[i] * NEG_POW(scale[i], beta) - coef * x[i] * t;
        }
    }
}
