// Direct convolution, forward: y = conv(x, w) + bias (then ReLU), reading x in place (no column buffer). Meant
// for layers with few input channels per group (first layers), where im2col's buffer is many times the input and the
// GEMM's depth C*KH*KW is small.
//   x (N, C, H, W), w (O, C/G, KH, KW), bias (O,), y (N, O, OH, OW); row-major, offsets in elements.
//   y[n][o][oy][ox] = bias[o] + sum over c < C/G, ky, kx of w[o][c][ky][kx] * x[n][g*C/G + c][iy][ix],
//   g = o / (O/G), iy = oy*SH - PH + ky*DH, ix = ox*SW - PW + kx*DW, x read as zero outside the image (PH, PW are the
//   top and left paddings; OH, OW imply the bottom and right ones).
// Output channels are taken OB at a time (a block never straddles two groups; the last block of a group may be
// partial: its missing channels are computed from repeated or zero weights and not stored), so each input value
// loaded feeds OB multiply-adds.
// Two shapes, chosen by device class (tuning.cpu_shaped):
//   conv2d_fwd_direct       GPU-shaped: one work-item per (output pixel, channel block, image), consecutive work-items
//                           on consecutive output pixels of one plane (coalesced loads of x, stores of y); the block's
//                           weights (the same for the whole work-group) are staged in local memory when WLOCAL > 0.
//   conv2d_fwd_direct_rows  CPU-shaped: one work-item per (channel block, output row, image), looping over the row PX
//                           pixels at a time with an OB x PX register block (PX vectors of OB channels), no division
//                           per element and no builtins in the hot loop (PoCL calls, rather than inlines,
//                           min/max/fma/vload). It reads the weights packed by conv2d_direct_pack, wp (blocks,
//                           C/G*KH*KW, OB): a tap's OB weights are one vector load. Runs of pixels whose windows lie
//                           wholly inside the image row take a branch-free path; the row's ends check each pixel.
// Sizes are arguments. Defines:
#ifndef OB
#define OB 4  // output channels per work-item (register block; on the CPU shape the vector width): 2, 4, 8 or 16
#endif
#ifndef WLOCAL
#define WLOCAL 0  // conv2d_fwd_direct: floats of local memory for the block's weights (>= OB*C/G*KH*KW), 0: read global
#endif
#ifndef PX
#define PX 8  // conv2d_fwd_direct_rows: output pixels per run (1 to 16), each an accumulator vector of OB channels
#endif
#ifndef BIAS
#define BIAS 0  // 1: add bias[o]
#endif
#ifndef RELU
#define RELU 0  // 1: max(0, .) after the bias
#endif
#include "common.h"

#if OB != 2 && OB != 4 && OB != 8 && OB != 16
#error "OB must be 2, 4, 8 or 16 (a vector width)"
#endif
#if PX < 1 || PX > 16
#error "PX must be between 1 and 16"
#endif

#define CONV_DIRECT_ARGS \
    const int C, const int H, const int W, const int O, const int G, const int KH, const int KW, const int SH, \
    const int SW, const int PH, const int PW, const int DH, const int DW, const int OH, const int OW

// First output channel o0 of channel block `blk`, its group grp, and how many of its channels are real (nb): blocks
// are numbered group by group, ceil(Og/OB) per group.
#define CHANNEL_BLOCK(blk) \
    const int Og = O / G, per_group = CEIL_DIV(Og, OB); \
    const int grp = (blk) / per_group; \
    const int o0 = grp * Og + ((blk) - grp * per_group) * OB; \
    const int nb = (Og - (o0 - grp * Og)) < OB ? (Og - (o0 - grp * Og)) : OB

__kernel void conv2d_fwd_direct(__global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict w,
                                OFFSET_PARAM(w), __global const float* restrict bias, OFFSET_PARAM(bias),
                                __global float* restrict y, OFFSET_PARAM(y), CONV_DIRECT_ARGS) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, bias)
    AT_OFFSET(__global float*, y)
    const int p = get_global_id(0), blk = get_global_id(1), n = get_global_id(2);
    CHANNEL_BLOCK(blk);
    const int Cg = C / G, c0 = grp * Cg, ckk = Cg * KH * KW;
#if WLOCAL
    // Every work-item of the group helps stage the block's weights (contiguous in w), then leaves if past the plane.
    __local float wl[WLOCAL];
    for (int e = get_local_id(0); e < nb * ckk; e += get_local_size(0)) wl[e] = w[o0 * ckk + e];
    barrier(CLK_LOCAL_MEM_FENCE);
    __local const float* wb = wl;
#else
    __global const float* wb = w + o0 * ckk;
#endif
    if (p >= OH * OW) return;
    const int oy = p / OW, ox = p - oy * OW;
    int woff[OB];  // where each block channel's weights start; the missing channels of a partial block repeat the last
    float acc[OB];
#pragma unroll
    for (int b = 0; b < OB; b++) {
        woff[b] = (b < nb ? b : nb - 1) * ckk;
#if BIAS
        acc[b] = bias[o0 + (b < nb ? b : nb - 1)];
#else
        acc[b] = 0.0f;
#endif
    }
    const int iy0 = oy * SH - PH, ix0 = ox * SW - PW;
    __global const float* xn = x + ((long)n * C + c0) * H * W;
    int widx = 0;
    for (int c = 0; c < Cg; c++) {
        __global const float* plane = xn + c * H * W;
        for (int ky = 0; ky < KH; ky++) {
            const int iy = iy0 + ky * DH;
            if (iy < 0 || iy >= H) {
                widx += KW;
                continue;
            }
            __global const float* row = plane + iy * W;
            for (int kx = 0; kx < KW; kx++, widx++) {
                const int ix = ix0 + kx * DW;
                if (ix < 0 || ix >= W) continue;
                const float v = row[ix];
#pragma unroll
                for (int b = 0; b < OB; b++) acc[b] += wb[woff[b] + widx] * v;
            }
        }
    }
    __global float* out = y + ((long)n * O + o0) * OH * OW + p;
#pragma unroll
    for (int b = 0; b < OB; b++) {
        if (b < nb) {
#if RELU
            out[b * OH * OW] = acc[b] < 0.0f ? 0.0f : acc[b];  // NaN stays NaN
#else
            out[b * OH * OW] = acc[b];
#endif
        }
    }
}

// The CPU shape's vectors run over the block's OB output channels: with weights packed per tap
// (conv2d_direct_pack), one tap is a vector load of OB weights and, per pixel, a scalar load of x broadcast into a
// multiply-add, whatever the stride (a vector over pixels would gather x at stride SW). Lanes are read and written
// one by one through these macros, never through a pointer to a vector: taking its address would keep the
// accumulators in memory.
#if OB == 2
#define OVEC float2
#define LOADV(p) LANES2(p)
#define CHANNELS(F, o, v, n) do { F(o, v, n, 0, s0); F(o, v, n, 1, s1); } while (0)
#elif OB == 4
#define OVEC float4
#define LOADV(p) LANES4(p)
#define CHANNELS(F, o, v, n) do { F(o, v, n, 0, s0); F(o, v, n, 1, s1); F(o, v, n, 2, s2); F(o, v, n, 3, s3); } \
    while (0)
#elif OB == 8
#define OVEC float8
#define LOADV(p) LANES8(p)
#define CHANNELS(F, o, v, n) do { F(o, v, n, 0, s0); F(o, v, n, 1, s1); F(o, v, n, 2, s2); F(o, v, n, 3, s3); \
    F(o, v, n, 4, s4); F(o, v, n, 5, s5); F(o, v, n, 6, s6); F(o, v, n, 7, s7); } while (0)
#elif OB == 16
#define OVEC float16
#define LOADV(p) LANES16(p)
#define CHANNELS(F, o, v, n) do { F(o, v, n, 0, s0); F(o, v, n, 1, s1); F(o, v, n, 2, s2); F(o, v, n, 3, s3); \
    F(o, v, n, 4, s4); F(o, v, n, 5, s5); F(o, v, n, 6, s6); F(o, v, n, 7, s7); F(o, v, n, 8, s8); \
    F(o, v, n, 9, s9); F(o, v, n, 10, sa); F(o, v, n, 11, sb); F(o, v, n, 12, sc); F(o, v, n, 13, sd); \
    F(o, v, n, 14, se); F(o, v, n, 15, sf); } while (0)
#endif
// Channel lane b of v to o[b * plane] (when b < n: a partial block stores its real channels only).
#define STORE_CHANNEL(o, v, n, b, sb) if ((b) < (n)) (o)[(b) * plane] = (v).sb
#define BIAS_CHANNEL(o, v, n, b, sb) (v).sb = (o)[(b) < (n) ? (b) : 0]

// wp (G * per_group, Cg*KH*KW, OB): block blk's weights for tap t are OB consecutive floats, zero for the missing
// channels of a partial block. One work-item per element.
__kernel void conv2d_direct_pack(__global const float* restrict w, OFFSET_PARAM(w), __global float* restrict wp,
                                 OFFSET_PARAM(wp), const int O, const int G, const int ckk) {
    AT_OFFSET(__global const float*, w) AT_OFFSET(__global float*, wp)
    const int e = get_global_id(0), blk = get_global_id(1);
    CHANNEL_BLOCK(blk);
    if (e >= ckk * OB) return;
    const int t = e / OB, b = e - t * OB;
    wp[(long)blk * ckk * OB + e] = b < nb ? w[(long)(o0 + b) * ckk + t] : 0.0f;
}

__kernel void conv2d_fwd_direct_rows(__global const float* restrict x, OFFSET_PARAM(x),
                                     __global const float* restrict wp, OFFSET_PARAM(wp),
                                     __global const float* restrict bias, OFFSET_PARAM(bias),
                                     __global float* restrict y, OFFSET_PARAM(y), CONV_DIRECT_ARGS) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, wp) AT_OFFSET(__global const float*, bias)
    AT_OFFSET(__global float*, y)
    const int blk = get_global_id(0), oy = get_global_id(1), n = get_global_id(2);
    CHANNEL_BLOCK(blk);
    if (blk >= G * per_group || oy >= OH) return;
    const int Cg = C / G, c0 = grp * Cg, ckk = Cg * KH * KW, plane = OH * OW;
    __global const float* wb = wp + (long)blk * ckk * OB;
    __global const float* xn = x + ((long)n * C + c0) * H * W;
    __global float* out = y + (((long)n * O + o0) * OH + oy) * OW;
    OVEC b0 = (OVEC)(0.0f);
#if BIAS
    CHANNELS(BIAS_CHANNEL, bias + o0, b0, nb);
#endif
    const int iy0 = oy * SH - PH;
    // Runs of PX pixels from ox0 read only inside the row when ox_lo <= ox0 < ox_hi: the first tap of the first pixel,
    // ox0*SW - PW, is >= 0, and the last tap of the last, (ox0 + PX - 1)*SW - PW + (KW - 1)*DW, is < W.
    const int ox_lo = CEIL_DIV(PW, SW);
    const int span = W + PW - (KW - 1) * DW - (PX - 1) * SW;  // ox0*SW < span
    const int ox_hi = span > 0 ? (span - 1) / SW + 1 : 0;
    for (int ox0 = 0; ox0 < OW; ox0 += PX) {
        const bool inside = ox0 >= ox_lo && ox0 < ox_hi;
        const int ix0 = ox0 * SW - PW;
        OVEC acc[PX];
#pragma unroll
        for (int l = 0; l < PX; l++) acc[l] = b0;
        __global const float* wt = wb;
        for (int c = 0; c < Cg; c++) {
            __global const float* xc = xn + c * H * W;
            for (int ky = 0; ky < KH; ky++) {
                const int iy = iy0 + ky * DH;
                if (iy < 0 || iy >= H) {
                    wt += KW * OB;
                    continue;
                }
                __global const float* row = xc + iy * W;
                if (inside) {
                    __global const float* r = row + ix0;
                    for (int kx = 0; kx < KW; kx++, wt += OB, r += DW) {
                        const OVEC wv = LOADV(wt);
#pragma unroll
                        for (int l = 0; l < PX; l++) acc[l] += wv * r[l * SW];
                    }
                } else {
                    for (int kx = 0; kx < KW; kx++, wt += OB) {
                        const OVEC wv = LOADV(wt);
                        const int ix = ix0 + kx * DW;
#pragma unroll
                        for (int l = 0; l < PX; l++) {
                            const int i = ix + l * SW;
                            acc[l] += wv * ((i >= 0 && i < W) ? row[i] : 0.0f);
                        }
                    }
                }
            }
        }
        const int count = OW - ox0;  // pixels to store: all but in the row's last run
#pragma unroll
        for (int l = 0; l < PX; l++) {
            if (l >= count) break;
#if RELU
            acc[l] = acc[l] < (OVEC)(0.0f) ? (OVEC)(0.0f) : acc[l];  // NaN stays NaN
#endif
            CHANNELS(STORE_CHANNEL, out + ox0 + l, acc[l], nb);
        }
    }
}
