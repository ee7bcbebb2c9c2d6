// 2-D pooling over NCHW tensors, forward and backward. Windows start at o*S - P; ceil_mode is decided on the host
// (it only changes OH, OW). Backward kernels gather: each input element visits the windows that cover it, so no
// atomics are needed and results are deterministic.
//   maxpool2d_fwd  y = max over the window (padding never wins; a NaN is the max, as in PyTorch); idx = the
//                  argmax's offset y*W + x in its plane, the first one on ties (as PyTorch)
//   maxpool2d_fwd_grid  the same, CPU-shaped: a work-item per output in a 3-D launch (x, y, plane), so no division
//                  per element and PoCL vectorises along x; the running maximum kept by selects, a NaN found by a
//                  flag and its window scanned again only then (one work-item per plane, as the backward runs, took
//                  2x as long on PoCL; a NaN test inside the select, 2-3x)
//   maxpool2d_bwd_grid  dx = sum of dy over the windows whose argmax is this element; GPU-shaped: a work-item per
//                  input element in a 3-D launch (x, y, plane) whose rows run along x (coalesced stores), the strides
//                  fixed at build (STRIDE_H, STRIDE_W): no division by a value known only at run time, where a flat
//                  launch made eight an element (integer division is a long instruction sequence on GPUs: vgg11_bn's
//                  five poolings ran at 0.8 TB/s on an H100 that way)
//   maxpool2d_bwd_tiles  the same where the windows tile the input (stride = window, no padding, none past the
//                  edge: VGG's 2x2 poolings): a work-item per window in a (x, y, plane) grid writes its whole window,
//                  dy at the argmax and 0 elsewhere, and the last window of a row or column also zeroes the input past
//                  it; it reads idx, dy (and y) once a window where the grid kernel read them once an input element
//                  (vgg11_bn's five: 2.26 ms at 1.2 TB/s on an H100 that way), its window fixed at build (TILE_KH,
//                  TILE_KW)
//   maxpool2d_bwd_bias  the same for a small layer (GPUs) whose input is a convolution's output with a bias:
//                  work-group c (of LSIZE) writes dx over channel c of every image and sums it into db[c] (add 1:
//                  db[c] += that sum), in elementwise.cl bias_grad's order and tree, so db has that kernel's bits and
//                  its launch is saved
//   maxpool2d_bwd_planes  the same, CPU-shaped: one work-item per plane zeroes it and adds each window's dy at its
//                  argmax, in window order (the plane is its own: no atomics, deterministic)
//   RELU 1 (max pooling): y = max(0, the window's max), which is the max of the ReLU'd window (ReLU is monotonic:
//                  they commute exactly; nn.Sequential runs ReLU then MaxPool2d so), and the backward kernels take y
//                  after idx and pass dy only where y > 0 (a NaN's gradient passes, as act_bwd's)
//   avgpool2d_fwd  y = sum / divisor; divisor counts padding when COUNT_PAD (windows clipped to the padded input)
//   avgpool2d_bwd  dx = sum over covering windows of dy / divisor
//   avgpool2d_bwd_whole  the same where one unpadded window covers each whole plane (a global average pool): dx = dy /
//                  P, one integer division an element where the general kernel takes six
// Defines: RELU 0/1 (maxpool only); LSIZE (maxpool2d_bwd_bias's work-group size, a power of two); COUNT_PAD 0/1
// (avgpool only); WIN_KH, WIN_KW (maxpool2d_fwd_grid only): the window's size, set by the host where no padding and
// no ceil mode put a window past the input's edge (0: sizes and bounds at run time); STRIDE_H, STRIDE_W
// (maxpool2d_bwd_grid only): the window's strides fixed at build (0: SH, SW at run time; the host always sets them);
// TILE_KH, TILE_KW (maxpool2d_bwd_tiles only): the window, which is also its stride, fixed at build (0: KH, KW at run
// time; the host always sets them).
#include "common.h"

#ifndef COUNT_PAD
#define COUNT_PAD 1  // AvgPool2d count_include_pad
#endif
#ifndef RELU
#define RELU 0  // max pooling of a ReLU's output: the ReLU applied after the max, its gradient in the backward
#endif
#if RELU
#define RELU_Y , __global const float* restrict y  // max_gather's: the forward's output (the kernels always take y)
#define RELU_GRAD(g, o) (y[o] <= 0.0f ? 0.0f : (g))
#define RELU_OUT(v) ((v) < 0.0f ? 0.0f : (v))  // NaN stays NaN
#else
#define RELU_Y
#define RELU_GRAD(g, o) (g)
#define RELU_OUT(v) (v)
#endif
#ifndef LSIZE
#define LSIZE 256  // maxpool2d_bwd_bias's work-group size
#endif
#ifndef WIN_KH
#define WIN_KH 0  // maxpool2d_fwd_grid's window height fixed at build (0: at run time)
#endif
#ifndef WIN_KW
#define WIN_KW 0  // and its width
#endif
#ifndef STRIDE_H
#define STRIDE_H 0  // maxpool2d_bwd_grid's strides fixed at build (0: at run time)
#endif
#ifndef STRIDE_W
#define STRIDE_W 0
#endif
#ifndef TILE_KH
#define TILE_KH 0  // maxpool2d_bwd_tiles' window (and stride) fixed at build (0: at run time)
#endif
#ifndef TILE_KW
#define TILE_KW 0
#endif

#define POOL_GEOMETRY \
    const int NC, const int H, const int W, const int KH, const int KW, const int SH, const int SW, \
    const int PH, const int PW, const int OH, const int OW

__kernel void maxpool2d_fwd(__global const float* restrict x, OFFSET_PARAM(x), POOL_GEOMETRY,
                            __global float* restrict y, OFFSET_PARAM(y), __global int* restrict idx,
                            OFFSET_PARAM(idx)) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y) AT_OFFSET(__global int*, idx)
    const int e = get_global_id(0);
    if (e >= NC * OH * OW) return;
    const int ox = e % OW, oy = (e / OW) % OH, nc = e / (OW * OH);
    const int y0 = oy * SH - PH, x0 = ox * SW - PW;
    __global const float* plane = x + nc * H * W;
    float best = -INFINITY;
    int arg = -1;
    for (int ky = max(0, -y0); ky < KH && y0 + ky < H; ky++)
        for (int kx = max(0, -x0); kx < KW && x0 + kx < W; kx++) {
            const int off = (y0 + ky) * W + x0 + kx;
            const float v = plane[off];
            if (v > best || isnan(v) || arg < 0) { best = v; arg = off; }  // NaN wins, as in PyTorch
        }
    y[e] = RELU_OUT(best);
    idx[e] = arg;
}

__kernel void maxpool2d_fwd_grid(__global const float* restrict x, OFFSET_PARAM(x), POOL_GEOMETRY,
                                 __global float* restrict y, OFFSET_PARAM(y), __global int* restrict idx,
                                 OFFSET_PARAM(idx)) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y) AT_OFFSET(__global int*, idx)
    const int ox = get_global_id(0), oy = get_global_id(1), nc = get_global_id(2);
    if (ox >= OW || oy >= OH || nc >= NC) return;
    const int o = (nc * OH + oy) * OW + ox;
    __global const float* plane = x + nc * H * W;
#if WIN_KH  // every window inside the input, of a size fixed at build: constant loops, no bounds
    const int y0 = oy * SH, x0 = ox * SW;
    const int ky0 = 0, ky1 = WIN_KH, kx0 = 0, kx1 = WIN_KW;
#else
    const int y0 = oy * SH - PH, x0 = ox * SW - PW;
    const int ky0 = max(0, -y0), ky1 = min(KH, H - y0), kx0 = max(0, -x0), kx1 = min(KW, W - x0);
    if (ky0 >= ky1 || kx0 >= kx1) {  // all padding (MaxPool2d's checks rule it out): as maxpool2d_fwd
        y[o] = -INFINITY;
        idx[o] = -1;
        return;
    }
#endif
    int arg = (y0 + ky0) * W + x0 + kx0;  // the window's first element (padding never wins)
    float best = plane[arg];
    int nan = 0;
    for (int ky = ky0; ky < ky1; ky++)
        for (int kx = kx0; kx < kx1; kx++) {
            const int off = (y0 + ky) * W + x0 + kx;
            const float v = plane[off];
            const bool better = v > best;  // strictly: the first maximum wins ties
            best = better ? v : best;
            arg = better ? off : arg;
            nan |= v != v;  // not in the select above: there it made PoCL's loop 2-3x slower
        }
    if (nan)  // rare: the window's last NaN wins, as in PyTorch
        for (int ky = ky0; ky < ky1; ky++)
            for (int kx = kx0; kx < kx1; kx++) {
                const int off = (y0 + ky) * W + x0 + kx;
                if (isnan(plane[off])) {
                    best = plane[off];
                    arg = off;
                }
            }
    y[o] = RELU_OUT(best);
    idx[o] = arg;
}

#if RELU
#define RELU_Y_ARG , y
#else
#define RELU_Y_ARG
#endif

// The gradient at input element (yy, xx) of plane nc: dy summed over the windows whose argmax it is, in window order.
inline float max_gather(__global const float* restrict dy, __global const int* restrict idx RELU_Y, const int nc,
                        const int yy, const int xx, const int H, const int W, const int KH, const int KW,
                        const int SH, const int SW, const int PH, const int PW, const int OH, const int OW) {
    const int off = yy * W + xx;
    const int oy_lo = max(0, CEIL_DIV(yy + PH - KH + 1, SH)), oy_hi = min(OH - 1, (yy + PH) / SH);
    const int ox_lo = max(0, CEIL_DIV(xx + PW - KW + 1, SW)), ox_hi = min(OW - 1, (xx + PW) / SW);
    float sum = 0.0f;
    for (int oy = oy_lo; oy <= oy_hi; oy++)
        for (int ox = ox_lo; ox <= ox_hi; ox++) {
            const int o = (nc * OH + oy) * OW + ox;
            if (idx[o] == off) sum += RELU_GRAD(dy[o], o);
        }
    return sum;
}

__kernel void maxpool2d_bwd_grid(__global const float* restrict dy, OFFSET_PARAM(dy),
                                 __global const int* restrict idx, OFFSET_PARAM(idx),
                                 __global const float* restrict y, OFFSET_PARAM(y), POOL_GEOMETRY,
                                 __global float* restrict dx, OFFSET_PARAM(dx)) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const int*, idx) AT_OFFSET(__global const float*, y)
    AT_OFFSET(__global float*, dx)
    const int xx = get_global_id(0), yy = get_global_id(1), nc = get_global_id(2);
    if (xx >= W || yy >= H) return;  // the launch pads x and y to whole work-groups
    dx[(nc * H + yy) * W + xx] = max_gather(dy, idx RELU_Y_ARG, nc, yy, xx, H, W, KH, KW, STRIDE_H ? STRIDE_H : SH,
                                            STRIDE_W ? STRIDE_W : SW, PH, PW, OH, OW);
}

__kernel void maxpool2d_bwd_tiles(__global const float* restrict dy, OFFSET_PARAM(dy),
                                  __global const int* restrict idx, OFFSET_PARAM(idx),
                                  __global const float* restrict y, OFFSET_PARAM(y), POOL_GEOMETRY,
                                  __global float* restrict dx, OFFSET_PARAM(dx)) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const int*, idx) AT_OFFSET(__global const float*, y)
    AT_OFFSET(__global float*, dx)
    const int ox = get_global_id(0), oy = get_global_id(1), nc = get_global_id(2);
    if (ox >= OW || oy >= OH) return;
    const int o = (nc * OH + oy) * OW + ox;
    const int at = idx[o];
    const float g = RELU_GRAD(dy[o], o);
    __global float* plane = dx + nc * H * W;
    const int kh = TILE_KH ? TILE_KH : KH, kw = TILE_KW ? TILE_KW : KW;
    const int y0 = oy * kh, x0 = ox * kw;
    const int y1 = oy == OH - 1 ? H : y0 + kh;  // the last window of a column, and of a row, also covers the input
    const int x1 = ox == OW - 1 ? W : x0 + kw;  // past it, which no window reads: its gradient is 0
    for (int yy = y0; yy < y1; yy++)
        for (int xx = x0; xx < x1; xx++) {
            const int off = yy * W + xx;
            plane[off] = off == at ? g : 0.0f;
        }
}

__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void maxpool2d_bwd_bias(__global const float* restrict dy, OFFSET_PARAM(dy), __global const int* restrict idx,
                        OFFSET_PARAM(idx), __global const float* restrict y, OFFSET_PARAM(y), POOL_GEOMETRY,
                        __global float* restrict dx, OFFSET_PARAM(dx), __global float* restrict db, OFFSET_PARAM(db),
                        const int C, const int add) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const int*, idx) AT_OFFSET(__global const float*, y)
    AT_OFFSET(__global float*, dx) AT_OFFSET(__global float*, db)
    const int c = get_group_id(0), lid = get_local_id(0);
    const int P = H * W, NP = NC / C * P;
    __local float part[LSIZE];
    float s = 0.0f;
    for (int e = lid; e < NP; e += LSIZE) {  // bias_grad's loop over (n, p)
        const int n = e / P, p = e % P, nc = n * C + c;
        const float g = max_gather(dy, idx RELU_Y_ARG, nc, p / W, p % W, H, W, KH, KW, SH, SW, PH, PW, OH, OW);
        dx[nc * P + p] = g;
        s += g;
    }
    const float total = group_sum(part, s, LSIZE);  // bias_grad's tree
    if (lid == 0) db[c] = add ? db[c] + total : total;
}

__kernel void maxpool2d_bwd_planes(__global const float* restrict dy, OFFSET_PARAM(dy),
                                   __global const int* restrict idx, OFFSET_PARAM(idx),
                                   __global const float* restrict y, OFFSET_PARAM(y), POOL_GEOMETRY,
                                   __global float* restrict dx, OFFSET_PARAM(dx)) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const int*, idx) AT_OFFSET(__global const float*, y)
    AT_OFFSET(__global float*, dx)
    const int nc = get_global_id(0);
    if (nc >= NC) return;
    __global float* plane = dx + nc * H * W;
    for (int e = 0; e < H * W; e++) plane[e] = 0.0f;
    __global const float* g = dy + nc * OH * OW;
    __global const int* at = idx + nc * OH * OW;
#if RELU
    y += nc * OH * OW;
#endif
    for (int o = 0; o < OH * OW; o++) plane[at[o]] += RELU_GRAD(g[o], o);
}

inline float avg_divisor(const int y0, const int x0, const int H, const int W, const int KH, const int KW,
                         const int PH, const int PW) {
#if COUNT_PAD
    const int y1 = min(y0 + KH, H + PH), x1 = min(x0 + KW, W + PW);
    return (float)((y1 - y0) * (x1 - x0));
#else
    const int y1 = min(y0 + KH, H), x1 = min(x0 + KW, W);
    return (float)((y1 - max(y0, 0)) * (x1 - max(x0, 0)));
#endif
}

__kernel void avgpool2d_fwd(__global const float* restrict x, OFFSET_PARAM(x), POOL_GEOMETRY,
                            __global float* restrict y, OFFSET_PARAM(y)) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y)
    const int e = get_global_id(0);
    if (e >= NC * OH * OW) return;
    const int ox = e % OW, oy = (e / OW) % OH, nc = e / (OW * OH);
    const int y0 = oy * SH - PH, x0 = ox * SW - PW;
    __global const float* plane = x + nc * H * W;
    // Each row of the window summed on its own, then the rows: a global pool's H*W terms in one running sum lose
    // up to H*W roundings (4e-6 of a 112x112 mean), as rows about H + W (5e-7)
    float sum = 0.0f;
    for (int yy = max(y0, 0); yy < min(y0 + KH, H); yy++) {
        float row = 0.0f;
        for (int xx = max(x0, 0); xx < min(x0 + KW, W); xx++) row += plane[yy * W + xx];
        sum += row;
    }
    y[e] = sum / avg_divisor(y0, x0, H, W, KH, KW, PH, PW);
}

__kernel void avgpool2d_bwd(__global const float* restrict dy, OFFSET_PARAM(dy), POOL_GEOMETRY,
                            __global float* restrict dx, OFFSET_PARAM(dx)) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int e = get_global_id(0);
    if (e >= NC * H * W) return;
    const int xx = e % W, yy = (e / W) % H, nc = e / (W * H);
    const int oy_lo = max(0, CEIL_DIV(yy + PH - KH + 1, SH)), oy_hi = min(OH - 1, (yy + PH) / SH);
    const int ox_lo = max(0, CEIL_DIV(xx + PW - KW + 1, SW)), ox_hi = min(OW - 1, (xx + PW) / SW);
    float sum = 0.0f;
    for (int oy = oy_lo; oy <= oy_hi; oy++)
        for (int ox = ox_lo; ox <= ox_hi; ox++)
            sum += dy[(nc * OH + oy) * OW + ox] / avg_divisor(oy * SH - PH, ox * SW - PW, H, W, KH, KW, PH, PW);
    dx[e] = sum;
}

__kernel void avgpool2d_bwd_whole(__global const float* restrict dy, OFFSET_PARAM(dy), const int P, const int n,
                                  __global float* restrict dx, OFFSET_PARAM(dx)) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int e = get_global_id(0);
    if (e < n) dx[e] = dy[e / P] / (float)P;
}
