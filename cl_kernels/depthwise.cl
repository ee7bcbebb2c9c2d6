// Depthwise convolution (groups == input channels C, M = O / C output channels per input channel): forward, data
// gradient and weight gradient, each reading its operands in place.
//   x (N, C, H, W), w (O, 1, KH, KW), bias (O,), y and dy (N, O, OH, OW), dx like x, dw like w; row-major, offsets
//   in elements. Output channel o reads input channel o / M; iy = oy*SH - PH + ky*DH, ix = ox*SW - PW + kx*DW, x read
//   as zero outside the image (PH, PW are the top and left paddings; OH, OW imply the bottom and right ones).
//   y[n][o][oy][ox]  = bias[o] + sum over ky, kx of w[o][ky][kx] * x[n][o/M][iy][ix]
//   dx[n][c][iy][ix] = sum over m < M and the (ky, kx, oy, ox) that reach (iy, ix) of w[cM+m][ky][kx] * dy[n][cM+m][oy][ox]
//   dw[o][ky][kx]    = sum over n, oy, ox of dy[n][o][oy][ox] * x[n][o/M][iy][ix]
// Each output is KH*KW multiply-adds over one input plane: 2*KH*KW flops per 8 bytes of y and x (stride 1), so every
// pass is bound by memory traffic, not arithmetic, and none lowers x into columns.
// Kernels, GPU-shaped (an element per work-item, consecutive work-items along a row: coalesced loads and stores):
//   conv2d_fwd_depthwise            PY outputs down a column each
//   conv2d_bwd_data_depthwise_s1    stride 1: PY elements of dx down a column each (dy through the flipped window)
//   conv2d_bwd_data_depthwise       other strides: one element of dx each, gathering the outputs whose windows hold
//                                   it
//   conv2d_bwd_weights_depthwise    a work-group of LS work-items per (output channel, run of pixels): each keeps
//                                   KH*KW sums over the pixels it visits, reduced in local memory at the end
//   conv2d_depthwise_sum_runs       dw = (dw +) the runs' partial sums, added in order
// CPU-shaped (a row or a channel per work-item, loops inside, the image's interior without bounds checks):
//   conv2d_fwd_depthwise_rows       one output row each
//   conv2d_bwd_data_depthwise_rows  one row of dx each
//   conv2d_bwd_weights_depthwise_planes  one output channel's KH*KW sums per work-item, over a run of images
// Sizes are arguments; the window is compiled in (KH, KW): the weight gradient's per-tap sums live in registers,
// and the window's loops unroll. flags: bit 0 adds the bias, bit 1 applies max(0, .) after it (forward).
// Defines:
#ifndef KH
#define KH 3  // window rows
#endif
#ifndef KW
#define KW 3  // window columns
#endif
#ifndef PY
#define PY 4  // GPU forward and stride-1 data gradient: outputs per work-item, down a column (1 to 8)
#endif
#ifndef LS
#define LS 256  // conv2d_bwd_weights_depthwise: work-items per work-group, a power of two (local memory KH*KW*LS floats)
#endif
#include "common.h"

#define KK (KH * KW)
#if KH < 1 || KW < 1 || KK > 64
#error "KH and KW must be positive, with at most 64 taps"
#endif
#if LS < 1 || (LS & (LS - 1)) != 0
#error "LS must be a power of two"
#endif
#if PY < 1 || PY > 8
#error "PY must be between 1 and 8"
#endif

#define DW_ARGS \
    const int N, const int C, const int H, const int W, const int O, const int SH, const int SW, const int PH, \
    const int PW, const int DH, const int DW, const int OH, const int OW

#define FLAG_BIAS 1
#define FLAG_RELU 2

// Bias and ReLU on one output.
inline float dw_epilogue(float acc, __global const float* bias, const int o, const int flags) {
    if (flags & FLAG_BIAS) acc += bias[o];
    if ((flags & FLAG_RELU) && acc < 0.0f) acc = 0.0f;  // NaN stays NaN
    return acc;
}

// One output at (oy, ox) of plane xp (H x W) through the window wk, taps outside the image skipped.
inline float dw_window_checked(__global const float* xp, const float* wk, const int iy0, const int ix0, const int H,
                               const int W, const int DH, const int DW) {
    float acc = 0.0f;
#pragma unroll
    for (int ky = 0; ky < KH; ky++) {
        const int iy = iy0 + ky * DH;
        if (iy < 0 || iy >= H) continue;
        __global const float* row = xp + iy * W;
#pragma unroll
        for (int kx = 0; kx < KW; kx++) {
            const int ix = ix0 + kx * DW;
            if (ix >= 0 && ix < W) acc += wk[ky * KW + kx] * row[ix];
        }
    }
    return acc;
}

// acc[l] += the window's products for PY outputs down a column of one plane src (SRC_H x SRC_W): output l's tap
// (ky, kx) reads src[y0 + l*ystep + ky*ty][x0 + kx*tx], zero outside the plane. The forward reads x with
// (ystep, ty, tx) = (SH, DH, DW); the stride-1 data gradient reads dy with (1, -DH, -DW), the window flipped. Where
// every tap of the column lies inside (most of a plane) no tap is checked.
inline void dw_column(__global const float* src, const int SRC_H, const int SRC_W, const int y0, const int ystep,
                      const int ty, const int x0, const int tx, const float* wk, float* acc) {
    const int ylo = y0 + min(0, (KH - 1) * ty), yhi = y0 + (PY - 1) * ystep + max(0, (KH - 1) * ty);
    const int xlo = x0 + min(0, (KW - 1) * tx), xhi = x0 + max(0, (KW - 1) * tx);
    if (ylo >= 0 && yhi < SRC_H && xlo >= 0 && xhi < SRC_W) {
        __global const float* base = src + y0 * SRC_W + x0;
#pragma unroll
        for (int l = 0; l < PY; l++)
#pragma unroll
            for (int ky = 0; ky < KH; ky++)
#pragma unroll
                for (int kx = 0; kx < KW; kx++)
                    acc[l] += wk[ky * KW + kx] * base[(l * ystep + ky * ty) * SRC_W + kx * tx];
        return;
    }
#pragma unroll
    for (int l = 0; l < PY; l++)
#pragma unroll
        for (int ky = 0; ky < KH; ky++) {
            const int iy = y0 + l * ystep + ky * ty;
            if (iy < 0 || iy >= SRC_H) continue;
            __global const float* row = src + iy * SRC_W;
#pragma unroll
            for (int kx = 0; kx < KW; kx++) {
                const int ix = x0 + kx * tx;
                if (ix >= 0 && ix < SRC_W) acc[l] += wk[ky * KW + kx] * row[ix];
            }
        }
}

// Global size N*O*ceil(OH/PY)*OW: work-item q computes PY outputs down column ox of plane (n, o), consecutive
// work-items on consecutive columns.
__kernel void conv2d_fwd_depthwise(__global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict w,
                                   OFFSET_PARAM(w), __global const float* restrict bias, OFFSET_PARAM(bias),
                                   __global float* restrict y, OFFSET_PARAM(y), DW_ARGS, const int flags) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, bias)
    AT_OFFSET(__global float*, y)
    const int q = get_global_id(0), blocks = CEIL_DIV(OH, PY);
    if (q >= N * O * blocks * OW) return;
    const int row = q / OW, ox = q - row * OW;  // row: (plane, block of PY output rows)
    const int plane = row / blocks, oy0 = (row - plane * blocks) * PY;
    const int n = plane / O, o = plane - n * O, M = O / C;
    __global const float* xp = x + ((long)n * C + (M == 1 ? o : o / M)) * H * W;
    float wk[KK], acc[PY];
#pragma unroll
    for (int t = 0; t < KK; t++) wk[t] = w[o * KK + t];
#pragma unroll
    for (int l = 0; l < PY; l++) acc[l] = 0.0f;
    dw_column(xp, H, W, oy0 * SH - PH, SH, DH, ox * SW - PW, DW, wk, acc);
    __global float* out = y + ((long)plane * OH + oy0) * OW + ox;
#pragma unroll
    for (int l = 0; l < PY; l++)
        if (oy0 + l < OH) out[l * OW] = dw_epilogue(acc[l], bias, o, flags);
}

// Global size N*C*ceil(H/PY)*W, for stride 1 (SH == SW == 1): dx is dy convolved with the flipped window, PY
// elements of dx down a column per work-item, as the forward.
__kernel void conv2d_bwd_data_depthwise_s1(__global const float* restrict w, OFFSET_PARAM(w),
                                           __global const float* restrict dy, OFFSET_PARAM(dy),
                                           __global float* restrict dx, OFFSET_PARAM(dx), DW_ARGS) {
    AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int q = get_global_id(0), blocks = CEIL_DIV(H, PY);
    if (q >= N * C * blocks * W) return;
    const int row = q / W, ix = q - row * W;
    const int plane = row / blocks, iy0 = (row - plane * blocks) * PY;
    const int n = plane / C, c = plane - n * C, M = O / C;
    float acc[PY];
#pragma unroll
    for (int l = 0; l < PY; l++) acc[l] = 0.0f;
    for (int m = 0; m < M; m++) {
        const int o = c * M + m;
        float wk[KK];
#pragma unroll
        for (int t = 0; t < KK; t++) wk[t] = w[o * KK + t];
        dw_column(dy + ((long)n * O + o) * OH * OW, OH, OW, iy0 + PH, 1, -DH, ix + PW, -DW, wk, acc);
    }
    __global float* out = dx + ((long)plane * H + iy0) * W + ix;
#pragma unroll
    for (int l = 0; l < PY; l++)
        if (iy0 + l < H) out[l * W] = acc[l];
}

// The output coordinate that tap k (offset k*D) maps input coordinate i to, or -1 when none does: i = o*S - P + k*D
// for an integer 0 <= o < OUT.
inline int dw_source(const int i, const int k, const int S, const int P, const int D, const int OUT) {
    const int t = i + P - k * D;
    if (t < 0) return -1;
    const int o = S == 1 ? t : S == 2 ? t >> 1 : t / S;  // (no division at mobilenet's strides)
    return (o * S == t && o < OUT) ? o : -1;
}

__kernel void conv2d_bwd_data_depthwise(__global const float* restrict w, OFFSET_PARAM(w),
                                        __global const float* restrict dy, OFFSET_PARAM(dy),
                                        __global float* restrict dx, OFFSET_PARAM(dx), DW_ARGS) {
    AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int q = get_global_id(0), P = H * W;
    if (q >= N * C * P) return;
    const int plane = q / P, p = q - plane * P;
    const int iy = p / W, ix = p - iy * W;
    const int n = plane / C, c = plane - n * C, M = O / C;
    int oys[KH], oxs[KW];  // where each window row and column comes from (-1: nowhere), the same for every m
#pragma unroll
    for (int ky = 0; ky < KH; ky++) oys[ky] = dw_source(iy, ky, SH, PH, DH, OH);
#pragma unroll
    for (int kx = 0; kx < KW; kx++) oxs[kx] = dw_source(ix, kx, SW, PW, DW, OW);
    float acc = 0.0f;
    for (int m = 0; m < M; m++) {
        const int o = c * M + m;
        __global const float* dyp = dy + ((long)n * O + o) * OH * OW;
        __global const float* wk = w + o * KK;
#pragma unroll
        for (int ky = 0; ky < KH; ky++) {
            if (oys[ky] < 0) continue;
            __global const float* row = dyp + oys[ky] * OW;
#pragma unroll
            for (int kx = 0; kx < KW; kx++)
                if (oxs[kx] >= 0) acc += wk[ky * KW + kx] * row[oxs[kx]];
        }
    }
    dx[q] = acc;
}

// Global size (O * LS, runs), work-groups of (LS, 1): group (o, r) sums pixels [r*chunk, (r+1)*chunk) of the
// N*OH*OW that output channel o has. partial 0: dw[o] = (accumulate ? dw[o] : 0) + the sums; partial 1: the sums go
// to out[(r*O + o)*KK + t] for conv2d_depthwise_sum_runs.
__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void conv2d_bwd_weights_depthwise(__global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict dy,
                                  OFFSET_PARAM(dy), __global float* restrict out, OFFSET_PARAM(out), DW_ARGS,
                                  const int chunk, const int partial, const int accumulate) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, out)
    const int o = get_group_id(0), r = get_group_id(1), lid = get_local_id(0);
    const int M = O / C, total = N * OH * OW;
    const int end = min(total, (r + 1) * chunk);
    int q = r * chunk + lid;
    // (n, oy, ox) of pixel q, advanced by LS pixels a step without dividing: LS = (dn*OH + doy)*OW + dox, each digit
    // below its base, so each carries at most one.
    const int dox = LS % OW, drow = LS / OW, doy = drow % OH, dn = drow / OH;
    int n = q / (OH * OW), oy = (q - n * OH * OW) / OW, ox = q - (n * OH + oy) * OW;
    float acc[KK];
#pragma unroll
    for (int t = 0; t < KK; t++) acc[t] = 0.0f;
    const long xstride = (long)C * H * W;
    __global const float* xc = x + (long)(M == 1 ? o : o / M) * H * W;
    __global const float* dyo = dy + (long)o * OH * OW;
    for (; q < end; q += LS) {
        const float g = dyo[(long)n * O * OH * OW + oy * OW + ox];
        __global const float* xp = xc + n * xstride;
        const int iy0 = oy * SH - PH, ix0 = ox * SW - PW;
        // (no unchecked path for the window's interior here: on 28x28 to 7x7 planes a warp's pixels straddle the
        // border and run both paths; with it the H200 took 1.3x as long there, bench/results/h200-depthwise-v1
        // against v2)
#pragma unroll
        for (int ky = 0; ky < KH; ky++) {
            const int iy = iy0 + ky * DH;
            const bool row_in = iy >= 0 && iy < H;
#pragma unroll
            for (int kx = 0; kx < KW; kx++) {
                const int ix = ix0 + kx * DW;
                if (row_in && ix >= 0 && ix < W) acc[ky * KW + kx] += g * xp[iy * W + ix];
            }
        }
        ox += dox;
        oy += doy;
        n += dn;
        if (ox >= OW) { ox -= OW; oy++; }
        if (oy >= OH) { oy -= OH; n++; }
    }
    // every tap's LS sums reduced together: log2(LS) barriers, not KK times as many
    __local float red[KK * LS];
#pragma unroll
    for (int t = 0; t < KK; t++) red[t * LS + lid] = acc[t];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LS / 2; s > 0; s >>= 1) {
        if (lid < s) {
#pragma unroll
            for (int t = 0; t < KK; t++) red[t * LS + lid] += red[t * LS + lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int t = lid; t < KK; t += LS) {
        const float v = red[t * LS];
        if (partial) out[((long)r * O + o) * KK + t] = v;
        else out[o * KK + t] = accumulate ? out[o * KK + t] + v : v;
    }
}

// dw[e] = (accumulate ? dw[e] : 0) + the sum over runs r of part[r * O*KK + e], added in run order. One work-item per
// weight.
__kernel void conv2d_depthwise_sum_runs(__global const float* restrict part, OFFSET_PARAM(part),
                                        __global float* restrict dw, OFFSET_PARAM(dw), const int count, const int runs,
                                        const int accumulate) {
    AT_OFFSET(__global const float*, part) AT_OFFSET(__global float*, dw)
    const int e = get_global_id(0);
    if (e >= count) return;
    float s = 0.0f;
    for (int r = 0; r < runs; r++) s += part[(long)r * count + e];
    dw[e] = accumulate ? dw[e] + s : s;
}

// ---- CPU shape ------------------------------------------------------------------------------------------------------

// Columns [lo, hi) of an output row whose windows lie inside the image row: ox*SW - PW >= 0 and
// ox*SW - PW + (KW-1)*DW < W.
#define INTERIOR(lo, hi, S, P, D, K, IN, OUT) \
    const int lo = min(CEIL_DIV(P, S), OUT); \
    const int hi = max(lo, min(OUT, ((IN) + (P) - ((K) - 1) * (D)) > 0 ? ((IN) + (P) - ((K) - 1) * (D) - 1) / (S) + 1 : 0))

// Global size (OH, N*O): one output row per work-item.
__kernel void conv2d_fwd_depthwise_rows(__global const float* restrict x, OFFSET_PARAM(x),
                                        __global const float* restrict w, OFFSET_PARAM(w),
                                        __global const float* restrict bias, OFFSET_PARAM(bias),
                                        __global float* restrict y, OFFSET_PARAM(y), DW_ARGS, const int flags) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, bias)
    AT_OFFSET(__global float*, y)
    const int oy = get_global_id(0), plane = get_global_id(1);
    if (oy >= OH || plane >= N * O) return;
    const int n = plane / O, o = plane - n * O, M = O / C;
    __global const float* xp = x + ((long)n * C + (M == 1 ? o : o / M)) * H * W;
    __global float* yrow = y + ((long)plane * OH + oy) * OW;
    float wk[KK];
#pragma unroll
    for (int t = 0; t < KK; t++) wk[t] = w[o * KK + t];
    const float b = (flags & FLAG_BIAS) ? bias[o] : 0.0f;
    const int iy0 = oy * SH - PH;
    INTERIOR(lo, hi, SW, PW, DW, KW, W, OW);
    const bool rows_in = iy0 >= 0 && iy0 + (KH - 1) * DH < H;
    const int a = rows_in ? lo : OW, z = rows_in ? hi : OW;  // [a, z): no checks
    for (int ox = 0; ox < a; ox++)
        yrow[ox] = dw_epilogue(dw_window_checked(xp, wk, iy0, ox * SW - PW, H, W, DH, DW), bias, o, flags);
    __global const float* xr = xp + iy0 * W - PW;
    for (int ox = a; ox < z; ox++) {
        __global const float* r = xr + ox * SW;
        float acc = b;
#pragma unroll
        for (int ky = 0; ky < KH; ky++)
#pragma unroll
            for (int kx = 0; kx < KW; kx++) acc += wk[ky * KW + kx] * r[ky * DH * W + kx * DW];
        yrow[ox] = ((flags & FLAG_RELU) && acc < 0.0f) ? 0.0f : acc;
    }
    for (int ox = z; ox < OW; ox++)
        yrow[ox] = dw_epilogue(dw_window_checked(xp, wk, iy0, ox * SW - PW, H, W, DH, DW), bias, o, flags);
}

// Stride 1 along the row: dxrow[ix] += the window row wkrow's taps over dy's row, for ix in [from, to), each dy
// column ix + PW - kx*DW checked against [0, OW) (the row's two ends, where the window reaches past dy).
inline void dw_row_checked(__global float* dxrow, __global const float* row, const float* wkrow, const int from,
                           const int to, const int PW, const int DW, const int OW) {
    for (int ix = from; ix < to; ix++) {
        float acc = dxrow[ix];
#pragma unroll
        for (int kx = 0; kx < KW; kx++) {
            const int ox = ix + PW - kx * DW;
            if (ox >= 0 && ox < OW) acc += wkrow[kx] * row[ox];
        }
        dxrow[ix] = acc;
    }
}

// Global size (H, N*C): one row of dx per work-item. At stride 1 along the row the gradient is a convolution of dy's
// rows with the flipped window, gathered (the interior without checks); at other strides each dy row instead adds
// its window's products into the dx row, which this work-item alone writes (no division per tap).
__kernel void conv2d_bwd_data_depthwise_rows(__global const float* restrict w, OFFSET_PARAM(w),
                                             __global const float* restrict dy, OFFSET_PARAM(dy),
                                             __global float* restrict dx, OFFSET_PARAM(dx), DW_ARGS) {
    AT_OFFSET(__global const float*, w) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int iy = get_global_id(0), plane = get_global_id(1);
    if (iy >= H || plane >= N * C) return;
    const int n = plane / C, c = plane - n * C, M = O / C;
    __global float* dxrow = dx + ((long)plane * H + iy) * W;
    int oys[KH];
#pragma unroll
    for (int ky = 0; ky < KH; ky++) oys[ky] = dw_source(iy, ky, SH, PH, DH, OH);
    // stride 1: column ix takes dy's columns ix + PW - kx*DW, all inside [0, OW) for ix in [a, z)
    const int a = SW == 1 ? min(W, max(0, (KW - 1) * DW - PW)) : W;
    const int z = SW == 1 ? max(a, min(W, OW - PW)) : W;
    INTERIOR(lo, hi, SW, PW, DW, KW, W, OW);  // other strides: dy columns whose window lies inside the row
    for (int ix = 0; ix < W; ix++) dxrow[ix] = 0.0f;
    for (int m = 0; m < M; m++) {
        const int o = c * M + m;
        __global const float* dyp = dy + ((long)n * O + o) * OH * OW;
        float wk[KK];
#pragma unroll
        for (int t = 0; t < KK; t++) wk[t] = w[o * KK + t];
#pragma unroll
        for (int ky = 0; ky < KH; ky++) {
            if (oys[ky] < 0) continue;
            __global const float* row = dyp + oys[ky] * OW;
            if (SW != 1) {
                for (int ox = 0; ox < OW; ox++) {
                    const float g = row[ox];
                    const int ix0 = ox * SW - PW;
                    if (ox >= lo && ox < hi) {
#pragma unroll
                        for (int kx = 0; kx < KW; kx++) dxrow[ix0 + kx * DW] += wk[ky * KW + kx] * g;
                    } else {
#pragma unroll
                        for (int kx = 0; kx < KW; kx++) {
                            const int ix = ix0 + kx * DW;
                            if (ix >= 0 && ix < W) dxrow[ix] += wk[ky * KW + kx] * g;
                        }
                    }
                }
                continue;
            }
            dw_row_checked(dxrow, row, wk + ky * KW, 0, a, PW, DW, OW);
            __global const float* rs = row + PW;
            for (int ix = a; ix < z; ix++) {
                float acc = dxrow[ix];
#pragma unroll
                for (int kx = 0; kx < KW; kx++) acc += wk[ky * KW + kx] * rs[ix - kx * DW];
                dxrow[ix] = acc;
            }
            dw_row_checked(dxrow, row, wk + ky * KW, z, W, PW, DW, OW);
        }
    }
}

// Global size (O, runs): work-item (o, r) sums images [r*chunk, (r+1)*chunk) of output channel o. partial as in
// conv2d_bwd_weights_depthwise.
__kernel void conv2d_bwd_weights_depthwise_planes(__global const float* restrict x, OFFSET_PARAM(x),
                                                  __global const float* restrict dy, OFFSET_PARAM(dy),
                                                  __global float* restrict out, OFFSET_PARAM(out), DW_ARGS,
                                                  const int chunk, const int partial, const int accumulate) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, out)
    const int o = get_global_id(0), r = get_global_id(1);
    if (o >= O) return;
    const int M = O / C;
    float acc[KK];
#pragma unroll
    for (int t = 0; t < KK; t++) acc[t] = 0.0f;
    INTERIOR(lo, hi, SW, PW, DW, KW, W, OW);
    const int n_end = min(N, (r + 1) * chunk);
    for (int n = r * chunk; n < n_end; n++) {
        __global const float* xp = x + ((long)n * C + (M == 1 ? o : o / M)) * H * W;
        __global const float* dyp = dy + ((long)n * O + o) * OH * OW;
        for (int oy = 0; oy < OH; oy++) {
            __global const float* dyrow = dyp + oy * OW;
            const int iy0 = oy * SH - PH;
            const bool rows_in = iy0 >= 0 && iy0 + (KH - 1) * DH < H;
            const int a = rows_in ? lo : OW, z = rows_in ? hi : OW;
            for (int ox = 0; ox < OW; ox++) {
                if (ox == a) {  // the interior: no checks
                    __global const float* xr = xp + iy0 * W - PW;
                    for (; ox < z; ox++) {
                        const float g = dyrow[ox];
                        __global const float* rr = xr + ox * SW;
#pragma unroll
                        for (int ky = 0; ky < KH; ky++)
#pragma unroll
                            for (int kx = 0; kx < KW; kx++) acc[ky * KW + kx] += g * rr[ky * DH * W + kx * DW];
                    }
                    if (ox >= OW) break;
                }
                const float g = dyrow[ox];
                const int ix0 = ox * SW - PW;
#pragma unroll
                for (int ky = 0; ky < KH; ky++) {
                    const int iy = iy0 + ky * DH;
                    if (iy < 0 || iy >= H) continue;
#pragma unroll
                    for (int kx = 0; kx < KW; kx++) {
                        const int ix = ix0 + kx * DW;
                        if (ix >= 0 && ix < W) acc[ky * KW + kx] += g * xp[iy * W + ix];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < KK; t++) {
        if (partial) out[((long)r * O + o) * KK + t] = acc[t];
        else out[o * KK + t] = accumulate ? out[o * KK + t] + acc[t] : acc[t];
    }
}
