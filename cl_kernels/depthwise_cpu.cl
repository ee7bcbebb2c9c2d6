// Depthwise convolution on CPUs, for small planes (mobilenet's 28x28 and below): a work-item takes a whole plane,
// copies it once into a zero-bordered private tile (so no tap is ever bounds-checked) and computes each output row
// as float16 lanes (AVX-512's width), a window tap a vector multiply-add. The row kernels of depthwise.cl run
// scalar, checking taps at the edges, and on a 7x7 plane every row is an edge; here a 7x7 plane is 7 vector rows of
// KH*KW multiply-adds each. Layouts and formulas as depthwise.cl's header (x (N, C, H, W), w (O, 1, KH, KW), y and dy
// (N, O, OH, OW), M = O / C output channels per input channel).
//   tile t: TW floats a row (the row pitch); t[r*TW + c] = the source plane's element (r - R0, c - C0), zero outside.
//   Output lane l of a row chunk starting at column c0 reads t[row*TW + (c0 + l)*S + kx*DW]: S 1 is one vload16, S 2
//   two vload16s' even lanes. Lanes past the row's end read the next tile row or the tile's slack and are dropped.
// Kernels (global size in brackets, no local memory, no barriers):
// Each plane kernel takes per_item consecutive planes a work-item (global size the planes over per_item, rounded up):
// PoCL's cost per work-group, paid per plane at one each, is of the order of a small plane's arithmetic.
//   conv2d_fwd_depthwise_cpu_planes           (N*O)  one output plane each; strides 1 and 2
//   conv2d_bwd_data_depthwise_cpu_planes      (N*C)  one plane of dx each, stride 1: dy through the flipped window
//   conv2d_bwd_weights_depthwise_cpu_planes   (O)    one output channel's KH*KW sums over every image, each a float16
//                                                    of partial sums added across lanes at the end
// The caller (clnet/depthwise.py, planes_tile) checks that a plane's tile fits: rows <= TH, columns <= TW.
// Defines:
#ifndef KH
#define KH 3  // window rows
#endif
#ifndef KW
#define KW 3  // window columns
#endif
#ifndef TW
#define TW 16  // tile row pitch in floats, a multiple of 16: every source column a plane's outputs read lies below it
#endif
#ifndef TH
#define TH 24  // tile rows at most
#endif
#include "common.h"

#define KK (KH * KW)
#if KH < 1 || KW < 1 || KK > 64
#error "KH and KW must be positive, with at most 64 taps"
#endif
#if TW < 16 || TW % 16 != 0
#error "TW must be a positive multiple of 16"
#endif
#if TH < 1
#error "TH must be positive"
#endif
// two rows of slack: a stride-2 chunk's lanes read up to 31 floats past its first column
#define TILE ((TH + 2) * TW)

#define DW_ARGS \
    const int N, const int C, const int H, const int W, const int O, const int SH, const int SW, const int PH, \
    const int PW, const int DH, const int DW, const int OH, const int OW

#define FLAG_BIAS 1
#define FLAG_RELU 2

// Fill rows [0, rows) of tile t (and its slack) from plane src (SRC_H x SRC_W), shifted down by R0 and right by C0.
inline void cpu_tile(float* t, __global const float* src, const int SRC_H, const int SRC_W, const int R0,
                     const int C0, const int rows) {
    for (int i = 0; i < (rows + 2) * TW; i += 16) vstore16((float16)0.0f, 0, t + i);
    const int r1 = min(rows, SRC_H + R0), c0 = max(0, C0), c1 = min(TW, SRC_W + C0);
    for (int r = max(0, R0); r < r1; r++) {
        __global const float* s = src + (r - R0) * SRC_W - C0;
        float* d = t + r * TW;
        for (int c = c0; c < c1; c++) d[c] = s[c];
    }
}

// The 16 lanes p[l*S], S 1 or 2.
inline float16 cpu_lanes(const float* p, const int S) {
    if (S == 1) return vload16(0, p);
    return (float16)(vload16(0, p).even, vload16(0, p + 16).even);
}

// The first n (1 to 16) lanes of v to dst.
inline void cpu_store(__global float* dst, const float16 v, const int n) {
    if (n == 16) {
        vstore16(v, 0, dst);
        return;
    }
    float tmp[16];
    vstore16(v, 0, tmp);
    for (int l = 0; l < n; l++) dst[l] = tmp[l];
}

__kernel void conv2d_fwd_depthwise_cpu_planes(__global const float* restrict x, OFFSET_PARAM(x),
                                              __global const float* restrict w, OFFSET_PARAM(w),
                                              __global const float* restrict bias, OFFSET_PARAM(bias),
                                              __global float* restrict y, OFFSET_PARAM(y), DW_ARGS, const int flags,
                                              const int per_item) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, bias)
    AT_OFFSET(__global float*, y)
    const int first = get_global_id(0) * per_item, last = min(N * O, first + per_item);
    for (int plane = first; plane < last; plane++) {
        const int n = plane / O, o = plane - n * O, M = O / C;
        float t[TILE], wk[KK];
        cpu_tile(t, x + ((long)n * C + (M == 1 ? o : o / M)) * H * W, H, W, PH, PW,
                 (OH - 1) * SH + (KH - 1) * DH + 1);
#pragma unroll
        for (int k = 0; k < KK; k++) wk[k] = w[o * KK + k];
        const float b = (flags & FLAG_BIAS) ? bias[o] : 0.0f;
        __global float* yp = y + (long)plane * OH * OW;
        for (int oy = 0; oy < OH; oy++)
            for (int ox0 = 0; ox0 < OW; ox0 += 16) {
                const float* base = t + oy * SH * TW + ox0 * SW;
                float16 acc = (float16)b;
#pragma unroll
                for (int ky = 0; ky < KH; ky++)
#pragma unroll
                    for (int kx = 0; kx < KW; kx++)
                        acc += wk[ky * KW + kx] * cpu_lanes(base + ky * DH * TW + kx * DW, SW);
                if (flags & FLAG_RELU) acc = select(acc, (float16)0.0f, acc < (float16)0.0f);  // NaN stays NaN
                cpu_store(yp + oy * OW + ox0, acc, min(16, OW - ox0));
            }
    }
}

// Stride 1: dx[iy][ix] = sum over m, ky, kx of w[cM+m][ky][kx] * dy[iy + PH - ky*DH][ix + PW - kx*DW], the tile
// holding dy shifted by the window's reach less the padding, so that tap (ky, kx) reads
// t[(iy + (KH-1-ky)*DH)*TW + ix + (KW-1-kx)*DW].
__kernel void conv2d_bwd_data_depthwise_cpu_planes(__global const float* restrict w, OFFSET_PARAM(w),
                                                   __global const float* restrict dy, OFFSET_PARAM(dy),
                                                   __global float* restrict dx, OFFSET_PARAM(dx), DW_ARGS,
                                                   const int per_item) {
    AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int first = get_global_id(0) * per_item, last = min(N * C, first + per_item);
    for (int plane = first; plane < last; plane++) {
        const int n = plane / C, c = plane - n * C, M = O / C;
        const int R0 = (KH - 1) * DH - PH, C0 = (KW - 1) * DW - PW;
        __global float* dxp = dx + (long)plane * H * W;
        float t[TILE], wk[KK];
        for (int m = 0; m < M; m++) {
            const int o = c * M + m;
            cpu_tile(t, dy + ((long)n * O + o) * OH * OW, OH, OW, R0, C0, H + (KH - 1) * DH);
#pragma unroll
            for (int k = 0; k < KK; k++) wk[k] = w[o * KK + k];
            for (int iy = 0; iy < H; iy++)
                for (int ix0 = 0; ix0 < W; ix0 += 16) {
                    const float* base = t + iy * TW + ix0;
                    const int lanes = min(16, W - ix0);
                    float16 acc = (float16)0.0f;
                    if (m > 0) {  // the earlier channels' sums, written by this work-item alone
                        float tmp[16];
                        for (int l = 0; l < lanes; l++) tmp[l] = dxp[iy * W + ix0 + l];
                        for (int l = lanes; l < 16; l++) tmp[l] = 0.0f;
                        acc = vload16(0, tmp);
                    }
#pragma unroll
                    for (int ky = 0; ky < KH; ky++)
#pragma unroll
                        for (int kx = 0; kx < KW; kx++)
                            acc += wk[ky * KW + kx] * vload16(0, base + (KH - 1 - ky) * DH * TW + (KW - 1 - kx) * DW);
                    cpu_store(dxp + iy * W + ix0, acc, lanes);
                }
        }
    }
}

// dw[o][t] (+)= sum over n, oy, ox of dy[n][o][oy][ox] * x[n][o/M][oy*SH - PH + ky*DH][ox*SW - PW + kx*DW]: both
// planes tiled (dy's with zeros past OW, so the dropped lanes add nothing), each tap's products summed in 16 lanes.
__kernel void conv2d_bwd_weights_depthwise_cpu_planes(__global const float* restrict x, OFFSET_PARAM(x),
                                                      __global const float* restrict dy, OFFSET_PARAM(dy),
                                                      __global float* restrict dw, OFFSET_PARAM(dw), DW_ARGS,
                                                      const int accumulate) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dw)
    const int o = get_global_id(0);
    if (o >= O) return;
    const int M = O / C;
    float t[TILE], g[TILE];
    float16 acc[KK];
#pragma unroll
    for (int k = 0; k < KK; k++) acc[k] = (float16)0.0f;
    for (int n = 0; n < N; n++) {
        cpu_tile(t, x + ((long)n * C + (M == 1 ? o : o / M)) * H * W, H, W, PH, PW,
                 (OH - 1) * SH + (KH - 1) * DH + 1);
        cpu_tile(g, dy + ((long)n * O + o) * OH * OW, OH, OW, 0, 0, OH);
        for (int oy = 0; oy < OH; oy++)
            for (int ox0 = 0; ox0 < OW; ox0 += 16) {
                const float16 gv = vload16(0, g + oy * TW + ox0);
                const float* base = t + oy * SH * TW + ox0 * SW;
#pragma unroll
                for (int ky = 0; ky < KH; ky++)
#pragma unroll
                    for (int kx = 0; kx < KW; kx++)
                        acc[ky * KW + kx] += gv * cpu_lanes(base + ky * DH * TW + kx * DW, SW);
            }
    }
#pragma unroll
    for (int k = 0; k < KK; k++) {
        const float16 a = acc[k];
        const float8 h8 = a.lo + a.hi;
        const float4 h4 = h8.lo + h8.hi;
        const float2 h2 = h4.lo + h4.hi;
        const float v = h2.x + h2.y;
        dw[o * KK + k] = accumulate ? dw[o * KK + k] + v : v;
    }
}
