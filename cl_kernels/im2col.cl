// Convolution lowering to matrix products.
//   im2col: x (N, C, H, W) images [n0, n0 + nimg) -> col (C*KH*KW, nimg*OH*OW); row r = (c*KH + ky)*KW + kx,
//           column j = i*OH*OW + oy*OW + ox; zero where the window reads padding.
//   col2im: the adjoint: dcol (C*KH*KW, nimg*OH*OW) -> dx (nimg, C, H, W), each input element gathering from every
//           window position that read it (no atomics, deterministic). Writes dx; does not accumulate.
// Two shapes of each, chosen by device class (tuning.py):
//   im2col, col2im              GPU-shaped: consecutive work-items on consecutive addresses of col (coalesced);
//                               im2col has a work-item per column and channel (its KH*KW rows), col2im one per
//                               element of dx.
//   im2col_rows, col2im_planes  CPU-shaped: one work-item per row of col (one (c, ky, kx) of one image), or per input
//                               plane, looping over pixels without a division per element; col2im_planes scatters
//                               the plane's windows into dx in a fixed order (the plane is the work-item's own, so
//                               no atomics, and the result is deterministic). Its grid is (image, channel) so that
//                               neighbouring work-items read neighbouring runs of col, and each window row's range
//                               inside the plane is found once, leaving a branch-free loop: lenet b64's second
//                               layer 2.3-3.9 -> 0.54-0.8 ms on PoCL (bench/NOTES.md, v16).
// All sizes are arguments; no defines.
#include "common.h"

#define CONV_GEOMETRY \
    const int C, const int H, const int W, const int KH, const int KW, const int SH, const int SW, \
    const int PH, const int PW, const int DH, const int DW, const int OH, const int OW, const int nimg

__kernel void im2col(__global const float* restrict x, OFFSET_PARAM(x), const int x_off, CONV_GEOMETRY,
                     __global float* restrict col, OFFSET_PARAM(col)) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, col)
    const int j = get_global_id(0);  // column: image i, output pixel (oy, ox)
    const int c = get_global_id(1);  // channel: rows c*KH*KW to (c + 1)*KH*KW - 1
    const int ohw = OH * OW, np = nimg * ohw;
    if (j >= np || c >= C) return;
    // the divisions once per work-item, not per element: they were most of the cost of one work-item per element
    const int i = j / ohw, p = j % ohw;
    const int y0 = (p / OW) * SH - PH, x0 = (p % OW) * SW - PW;
    __global const float* plane = x + x_off + (i * C + c) * H * W;
    __global float* out = col + c * KH * KW * np + j;
    for (int ky = 0; ky < KH; ky++) {
        const int y = y0 + ky * DH;
        const bool row_in = y >= 0 && y < H;
        for (int kx = 0; kx < KW; kx++) {
            const int xx = x0 + kx * DW;
            *out = (row_in && xx >= 0 && xx < W) ? plane[y * W + xx] : 0.0f;
            out += np;
        }
    }
}

__kernel void col2im(__global const float* restrict col, OFFSET_PARAM(col), CONV_GEOMETRY, __global float* restrict dx,
                     OFFSET_PARAM(dx), const int dx_off) {
    AT_OFFSET(__global const float*, col) AT_OFFSET(__global float*, dx)
    const int e = get_global_id(0);
    if (e >= nimg * C * H * W) return;
    const int xx = e % W, y = (e / W) % H, c = (e / (W * H)) % C, i = e / (W * H * C);
    const int ohw = OH * OW, np = nimg * ohw;
    float sum = 0.0f;
    for (int ky = 0; ky < KH; ky++) {
        const int ty = y + PH - ky * DH;
        if (ty < 0 || ty % SH != 0) continue;
        const int oy = ty / SH;
        if (oy >= OH) continue;
        for (int kx = 0; kx < KW; kx++) {
            const int tx = xx + PW - kx * DW;
            if (tx < 0 || tx % SW != 0) continue;
            const int ox = tx / SW;
            if (ox >= OW) continue;
            sum += col[((c * KH + ky) * KW + kx) * np + i * ohw + oy * OW + ox];
        }
    }
    dx[dx_off + e] = sum;
}

__kernel void im2col_rows(__global const float* restrict x, OFFSET_PARAM(x), const int x_off, CONV_GEOMETRY,
                          __global float* restrict col, OFFSET_PARAM(col)) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, col)
    const int r = get_global_id(0), i = get_global_id(1);
    if (r >= C * KH * KW || i >= nimg) return;
    const int kx = r % KW, ky = (r / KW) % KH, c = r / (KW * KH);
    const int ohw = OH * OW;
    __global const float* plane = x + x_off + (i * C + c) * H * W;
    __global float* out = col + r * (nimg * ohw) + i * ohw;
    for (int oy = 0; oy < OH; oy++, out += OW) {
        const int y = oy * SH - PH + ky * DH;
        if (y < 0 || y >= H) {
            for (int ox = 0; ox < OW; ox++) out[ox] = 0.0f;
            continue;
        }
        __global const float* row = plane + y * W;
        int xx = kx * DW - PW;
        for (int ox = 0; ox < OW; ox++, xx += SW) out[ox] = (xx >= 0 && xx < W) ? row[xx] : 0.0f;
    }
}

__kernel void col2im_planes(__global const float* restrict col, OFFSET_PARAM(col), CONV_GEOMETRY,
                            __global float* restrict dx, OFFSET_PARAM(dx), const int dx_off) {
    AT_OFFSET(__global const float*, col) AT_OFFSET(__global float*, dx)
    const int i = get_global_id(0), c = get_global_id(1);
    if (c >= C || i >= nimg) return;
    const int ohw = OH * OW, np = nimg * ohw;
    __global float* plane = dx + dx_off + (i * C + c) * H * W;
    for (int e = 0; e < H * W; e++) plane[e] = 0.0f;
    for (int ky = 0; ky < KH; ky++)
        for (int kx = 0; kx < KW; kx++) {
            __global const float* src = col + ((c * KH + ky) * KW + kx) * np + i * ohw;
            const int x0 = kx * DW - PW;
            const int lo = x0 >= 0 ? 0 : CEIL_DIV(-x0, SW);
            const int hi = x0 >= W ? 0 : min(OW, (W - 1 - x0) / SW + 1);
            for (int oy = 0; oy < OH; oy++, src += OW) {
                const int y = oy * SH - PH + ky * DH;
                if (y < 0 || y >= H) continue;
                __global float* row = plane + y * W;
                if (SW == 1)
                    for (int ox = lo; ox < hi; ox++) row[x0 + ox] += src[ox];
                else
                    for (int ox = lo; ox < hi; ox++) row[x0 + ox * SW] += src[ox];
            }
        }
}
