// 1x1 convolutions at stride 1 without padding (pointwise layers) on NCHW planes, read in place; CPU-shaped.
//   conv1x1_rows: out[n][oc][p] = bias[oc] + sum over ic < IC/G of wt(oc, ic) * in[n][g*IC/G + ic][p], for OC output
//     channels in G groups (g = oc / (OC/G)) of P-pixel planes, the weights read at
//     wt(oc, ic) = w[g*(OC/G)*(IC/G) + (oc - g*OC/G)*WO + ic*WC]. The forward takes w (O, C/G) as it is (WO = C/G,
//     WC = 1); the data gradient is the same product with each group's matrix transposed (in = dy, out = dx, WO = 1,
//     WC = C/G, no bias).
//   conv1x1_weights: part[n][o][c] = sum over p < P of dy[n][o][p] * x[n][g*C/G + c][p], one image's share of the
//     weight gradient dw (O, C/G); conv1x1_weights_sum: dw = beta * dw + the images' shares added in order (beta 0:
//     dw is not read). With one image the first writes dw itself (PART 0).
// A work-item of conv1x1_rows takes a run of NV vectors of PV pixels of one plane for a block of OB output channels:
// OB x NV accumulator vectors; per input channel, NV vector loads of `in` and OB weights, each broadcast into NV
// multiply-adds. One of conv1x1_weights takes a block of OB x CB weights of one image: per PV pixels, OB + CB vector
// loads feed OB x CB multiply-adds; the lanes are added at the end. Consecutive work-items share an image, so its
// planes are read from the caches after the first. A block never straddles a group; a partial block computes
// repeated channels and stores only its own. Pixels past a plane's end are neither read nor written. Lanes are read
// and written one by one (PoCL calls vloadn and vstoren rather than inline them, and a pointer to a vector keeps the
// accumulators in memory).
// Sizes are arguments. Defines:
#ifndef PV
#define PV 16  // pixels a vector: 8 or 16
#endif
#ifndef NV
#define NV 2  // conv1x1_rows: vectors a run (1 to 4)
#endif
#ifndef OB
#define OB 8  // output channels a work-item (conv1x1_rows: 1 to 16; conv1x1_weights: 1 to 8)
#endif
#ifndef CB
#define CB 4  // conv1x1_weights: input channels a work-item (1 to 8)
#endif
#ifndef BIAS
#define BIAS 0  // conv1x1_rows: 1 adds bias[oc]
#endif
#ifndef RELU
#define RELU 0  // conv1x1_rows: 1 takes max(0, .) after the bias (NaN stays NaN)
#endif
#ifndef WEIGHTS
#define WEIGHTS 0  // 0 builds conv1x1_rows, 1 conv1x1_weights and conv1x1_weights_sum (one pass's kernels a build: an
                   // unrolled block is slow to compile, Intel's compiler taking tens of seconds for each)
#endif
#ifndef PART
#define PART 1  // conv1x1_weights: 1 writes each image's share to part; 0 (one image) writes dw = beta * dw + it
#endif
#include "common.h"

#if NV < 1 || NV > 4 || OB < 1 || OB > 16 || CB < 1 || CB > 8
#error "NV must be 1 to 4, OB 1 to 16, CB 1 to 8"
#endif

// A vector of the PV pixels from p (LOADV: all inside the plane; LOADV_IN: the first `room`, the rest 0), PV pixels
// stored from p (STOREV_IN: the first `room`), and the sum of a vector's lanes.
#if PV == 8
#define PVEC float8
#define LOADV(p) LANES8(p)
#define LOADV_IN(p, room) ((float8)((p)[0], (1 < (room) ? (p)[1] : 0.0f), (2 < (room) ? (p)[2] : 0.0f), \
    (3 < (room) ? (p)[3] : 0.0f), (4 < (room) ? (p)[4] : 0.0f), (5 < (room) ? (p)[5] : 0.0f), \
    (6 < (room) ? (p)[6] : 0.0f), (7 < (room) ? (p)[7] : 0.0f)))
#define STOREV(p, v) do { (p)[0] = (v).s0; (p)[1] = (v).s1; (p)[2] = (v).s2; (p)[3] = (v).s3; (p)[4] = (v).s4; \
    (p)[5] = (v).s5; (p)[6] = (v).s6; (p)[7] = (v).s7; } while (0)
#define STOREV_IN(p, v, room) do { if (0 < (room)) (p)[0] = (v).s0; if (1 < (room)) (p)[1] = (v).s1; \
    if (2 < (room)) (p)[2] = (v).s2; if (3 < (room)) (p)[3] = (v).s3; if (4 < (room)) (p)[4] = (v).s4; \
    if (5 < (room)) (p)[5] = (v).s5; if (6 < (room)) (p)[6] = (v).s6; if (7 < (room)) (p)[7] = (v).s7; } while (0)
#define SUMV(v) ((v).s0 + (v).s1 + (v).s2 + (v).s3 + (v).s4 + (v).s5 + (v).s6 + (v).s7)
#elif PV == 16
#define PVEC float16
#define LOADV(p) LANES16(p)
#define LOADV_IN(p, room) ((float16)((p)[0], (1 < (room) ? (p)[1] : 0.0f), (2 < (room) ? (p)[2] : 0.0f), \
    (3 < (room) ? (p)[3] : 0.0f), (4 < (room) ? (p)[4] : 0.0f), (5 < (room) ? (p)[5] : 0.0f), \
    (6 < (room) ? (p)[6] : 0.0f), (7 < (room) ? (p)[7] : 0.0f), (8 < (room) ? (p)[8] : 0.0f), \
    (9 < (room) ? (p)[9] : 0.0f), (10 < (room) ? (p)[10] : 0.0f), (11 < (room) ? (p)[11] : 0.0f), \
    (12 < (room) ? (p)[12] : 0.0f), (13 < (room) ? (p)[13] : 0.0f), (14 < (room) ? (p)[14] : 0.0f), \
    (15 < (room) ? (p)[15] : 0.0f)))
#define STOREV(p, v) do { (p)[0] = (v).s0; (p)[1] = (v).s1; (p)[2] = (v).s2; (p)[3] = (v).s3; (p)[4] = (v).s4; \
    (p)[5] = (v).s5; (p)[6] = (v).s6; (p)[7] = (v).s7; (p)[8] = (v).s8; (p)[9] = (v).s9; (p)[10] = (v).sa; \
    (p)[11] = (v).sb; (p)[12] = (v).sc; (p)[13] = (v).sd; (p)[14] = (v).se; (p)[15] = (v).sf; } while (0)
#define STOREV_IN(p, v, room) do { if (0 < (room)) (p)[0] = (v).s0; if (1 < (room)) (p)[1] = (v).s1; \
    if (2 < (room)) (p)[2] = (v).s2; if (3 < (room)) (p)[3] = (v).s3; if (4 < (room)) (p)[4] = (v).s4; \
    if (5 < (room)) (p)[5] = (v).s5; if (6 < (room)) (p)[6] = (v).s6; if (7 < (room)) (p)[7] = (v).s7; \
    if (8 < (room)) (p)[8] = (v).s8; if (9 < (room)) (p)[9] = (v).s9; if (10 < (room)) (p)[10] = (v).sa; \
    if (11 < (room)) (p)[11] = (v).sb; if (12 < (room)) (p)[12] = (v).sc; if (13 < (room)) (p)[13] = (v).sd; \
    if (14 < (room)) (p)[14] = (v).se; if (15 < (room)) (p)[15] = (v).sf; } while (0)
#define SUMV(v) ((v).s0 + (v).s1 + (v).s2 + (v).s3 + (v).s4 + (v).s5 + (v).s6 + (v).s7 + (v).s8 + (v).s9 + \
    (v).sa + (v).sb + (v).sc + (v).sd + (v).se + (v).sf)
#else
#error "PV must be 8 or 16"
#endif


// The block's first channel within its group and how many of its channels are real.
#define BLOCK(blk, per_group, width, count) \
    const int grp = (blk) / (per_group); \
    const int first = ((blk) - grp * (per_group)) * (width); \
    const int real = (count) - first < (width) ? (count) - first : (width)

#if !WEIGHTS
__kernel void conv1x1_rows(__global const float* restrict in, OFFSET_PARAM(in), __global const float* restrict w,
                           OFFSET_PARAM(w), __global const float* restrict bias, OFFSET_PARAM(bias),
                           __global float* restrict out, OFFSET_PARAM(out), const int IC, const int OC, const int G,
                           const int P, const int WO, const int WC) {
    AT_OFFSET(__global const float*, in) AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, bias)
    AT_OFFSET(__global float*, out)
    const int run = get_global_id(0), blk = get_global_id(1), n = get_global_id(2);
    const int OCg = OC / G, ICg = IC / G;
    BLOCK(blk, CEIL_DIV(OCg, OB), OB, OCg);
    const int p0 = run * NV * PV;
    if (p0 >= P) return;
    const int room = P - p0;
    __global const float* wg = w + grp * OCg * ICg;
    __global const float* x = in + ((long)n * IC + grp * ICg) * P + p0;
    int wo[OB];
    PVEC acc[OB][NV];
#pragma unroll
    for (int b = 0; b < OB; b++) {
        const int oc = first + (b < real ? b : real - 1);
        wo[b] = oc * WO;
#if BIAS
        const float b0 = bias[grp * OCg + oc];
#else
        const float b0 = 0.0f;
#endif
#pragma unroll
        for (int j = 0; j < NV; j++) acc[b][j] = (PVEC)(b0);
    }
    if (room >= NV * PV) {
        for (int c = 0; c < ICg; c++, x += P) {
            PVEC v[NV];
#pragma unroll
            for (int j = 0; j < NV; j++) v[j] = LOADV(x + j * PV);
#pragma unroll
            for (int b = 0; b < OB; b++) {
                const float wv = wg[wo[b] + c * WC];
#pragma unroll
                for (int j = 0; j < NV; j++) acc[b][j] += wv * v[j];
            }
        }
    } else {
        for (int c = 0; c < ICg; c++, x += P) {
            PVEC v[NV];
#pragma unroll
            for (int j = 0; j < NV; j++) v[j] = room > j * PV ? LOADV_IN(x + j * PV, room - j * PV) : (PVEC)(0.0f);
#pragma unroll
            for (int b = 0; b < OB; b++) {
                const float wv = wg[wo[b] + c * WC];
#pragma unroll
                for (int j = 0; j < NV; j++) acc[b][j] += wv * v[j];
            }
        }
    }
    __global float* y = out + ((long)n * OC + grp * OCg + first) * P + p0;
#pragma unroll
    for (int b = 0; b < OB; b++) {
        if (b >= real) break;
#pragma unroll
        for (int j = 0; j < NV; j++) {
#if RELU
            const PVEC r = select(acc[b][j], (PVEC)(0.0f), acc[b][j] < (PVEC)(0.0f));
#else
            const PVEC r = acc[b][j];
#endif
            if (room >= (j + 1) * PV) {
                STOREV(y + b * P + j * PV, r);
            } else if (room > j * PV) {
                STOREV_IN(y + b * P + j * PV, r, room - j * PV);
            }
        }
    }
}

#endif

#if WEIGHTS
__kernel void conv1x1_weights(__global const float* restrict dy, OFFSET_PARAM(dy), __global const float* restrict x,
                              OFFSET_PARAM(x), __global float* restrict part, OFFSET_PARAM(part), const int C,
                              const int O, const int G, const int P, const float beta) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, part)
    const int cblk = get_global_id(0), oblk = get_global_id(1), n = get_global_id(2);  // c block within o's group
    const int Og = O / G, Cg = C / G;
    BLOCK(oblk, CEIL_DIV(Og, OB), OB, Og);
    const int c0 = cblk * CB;
    if (c0 >= Cg) return;
    const int creal = Cg - c0 < CB ? Cg - c0 : CB;
    __global const float* dyb[OB];
    __global const float* xb[CB];
#pragma unroll
    for (int b = 0; b < OB; b++) dyb[b] = dy + ((long)n * O + grp * Og + first + (b < real ? b : real - 1)) * P;
#pragma unroll
    for (int k = 0; k < CB; k++) xb[k] = x + ((long)n * C + grp * Cg + c0 + (k < creal ? k : creal - 1)) * P;
    PVEC acc[OB][CB];
#pragma unroll
    for (int b = 0; b < OB; b++)
#pragma unroll
        for (int k = 0; k < CB; k++) acc[b][k] = (PVEC)(0.0f);
    int p = 0;
    for (; p + PV <= P; p += PV) {
        PVEC d[OB], v[CB];
#pragma unroll
        for (int b = 0; b < OB; b++) d[b] = LOADV(dyb[b] + p);
#pragma unroll
        for (int k = 0; k < CB; k++) v[k] = LOADV(xb[k] + p);
#pragma unroll
        for (int b = 0; b < OB; b++)
#pragma unroll
            for (int k = 0; k < CB; k++) acc[b][k] += d[b] * v[k];
    }
    if (p < P) {
        PVEC d[OB], v[CB];
#pragma unroll
        for (int b = 0; b < OB; b++) d[b] = LOADV_IN(dyb[b] + p, P - p);
#pragma unroll
        for (int k = 0; k < CB; k++) v[k] = LOADV_IN(xb[k] + p, P - p);
#pragma unroll
        for (int b = 0; b < OB; b++)
#pragma unroll
            for (int k = 0; k < CB; k++) acc[b][k] += d[b] * v[k];
    }
#if PART
    __global float* out = part + ((long)n * O + grp * Og + first) * Cg + c0;
#else
    __global float* out = part + (grp * Og + first) * Cg + c0;
#endif
#pragma unroll
    for (int b = 0; b < OB; b++) {
        if (b >= real) break;
#pragma unroll
        for (int k = 0; k < CB; k++) {
            if (k >= creal) break;
            const float s = SUMV(acc[b][k]);
#if PART
            out[b * Cg + k] = s;
#else
            out[b * Cg + k] = beta == 0.0f ? s : beta * out[b * Cg + k] + s;
#endif
        }
    }
}

// dw[i] = beta * dw[i] + sum over n < N of part[n][i], in order (beta 0: dw not read); i < count = O * C/G.
__kernel void conv1x1_weights_sum(__global const float* restrict part, OFFSET_PARAM(part), __global float* restrict dw,
                                  OFFSET_PARAM(dw), const int N, const int count, const float beta) {
    AT_OFFSET(__global const float*, part) AT_OFFSET(__global float*, dw)
    const int i = get_global_id(0);
    if (i >= count) return;
    float s = 0.0f;
    for (int n = 0; n < N; n++) s += part[(long)n * count + i];
    dw[i] = beta == 0.0f ? s : beta * dw[i] + s;
}
#endif
