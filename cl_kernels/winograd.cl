// Winograd F(2x2, 3x3) convolution (Lavin & Gray, 2015) for 3x3, stride-1, undilated, ungrouped layers. The output
// is cut into 2x2 tiles; tile (ty, tx) reads the 4x4 input window whose top-left element is (2*ty - PH, 2*tx - PW),
// and Y = A^T [ sum over c of (G g G^T) .* (B^T d B) ] A. The sum over c of each of the 16 element-wise products is a
// matrix product, so the host runs one batched GEMM (batch 16) between the two transforms:
//   M[xi] (O, P) = U[xi] (O, C) @ V[xi] (C, P), xi = 4*row + column of the 4x4 transformed tile.
//
//   winograd_weights  w (O, C, 3, 3) -> U (16, O, C): U[xi][o][c] = (G w[o][c] G^T)[xi].
//                     With FLIP, the weights of the backward-data convolution (channels swapped, kernel rotated
//                     by 180 degrees): U (16, C, O), U[xi][c][o] = (G rot180(w[o][c]) G^T)[xi].
//   winograd_input    x (N, C, H, W), images [n0, n0 + nimg) from element x_off on -> V (16, C, P), P = nimg*TH*TW,
//                     column p = (i*TH + ty)*TW + tx: V[xi][c][p] = (B^T d B)[xi], d read as zero outside the image.
//                     PH, PW may be negative (the backward-data convolution of a layer padded by more than 2).
//   winograd_output   M (16, O, P) -> y (N, O, OH, OW) from element y_off on: the 2x2 tile A^T m A (+ bias[o], then
//                     ReLU); rows and columns past OH, OW (odd output sizes) are not written.
// Work-items: one per (p, c) for the input transform, per (p, o) for the output transform, p the fastest index so
// neighbouring work-items touch neighbouring elements of V and M. Sizes are arguments.
// Defines: FLIP (winograd_weights), BIAS and RELU (winograd_output).
//
// The matrices (the F(2, 3) choice of interpolation points 0, 1, -1 and infinity):
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
//   A^T = [1 1 1 0; 0 1 -1 -1]
#include "common.h"

#ifndef FLIP
#define FLIP 0  // 1: transform the backward-data weights, rot180 and (O, C) transposed
#endif
#ifndef BIAS
#define BIAS 0  // 1: winograd_output adds bias[o]
#endif
#ifndef RELU
#define RELU 0  // 1: winograd_output applies max(0, .) after the bias
#endif

// u = G g for one column (g0, g1, g2) of a 3x3 kernel.
#define WINO_G(g0, g1, g2, u0, u1, u2, u3) \
    do { (u0) = (g0); (u1) = 0.5f * ((g0) + (g1) + (g2)); (u2) = 0.5f * ((g0) - (g1) + (g2)); (u3) = (g2); } while (0)

// v = B^T d for one column (d0, d1, d2, d3) of a 4x4 tile.
#define WINO_BT(d0, d1, d2, d3, v0, v1, v2, v3) \
    do { (v0) = (d0) - (d2); (v1) = (d1) + (d2); (v2) = (d2) - (d1); (v3) = (d1) - (d3); } while (0)

// y = A^T m for one column (m0, m1, m2, m3) of a 4x4 tile.
#define WINO_AT(m0, m1, m2, m3, y0, y1) \
    do { (y0) = (m0) + (m1) + (m2); (y1) = (m1) - (m2) - (m3); } while (0)

__kernel void winograd_weights(__global const float* restrict w, const int O, const int C,
                               __global float* restrict U) {
    const int e = get_global_id(0);
    if (e >= O * C) return;
    const int o = e / C, c = e % C;
    float g[9];
    for (int k = 0; k < 9; k++) g[k] = w[e * 9 + (FLIP ? 8 - k : k)];
    float t[12];  // G g: 4 rows x 3 columns
    for (int j = 0; j < 3; j++) WINO_G(g[j], g[3 + j], g[6 + j], t[j], t[3 + j], t[6 + j], t[9 + j]);
    float u[16];  // (G g) G^T: the same transform applied to each row
    for (int i = 0; i < 4; i++)
        WINO_G(t[3 * i], t[3 * i + 1], t[3 * i + 2], u[4 * i], u[4 * i + 1], u[4 * i + 2], u[4 * i + 3]);
    const int oc = O * C;
    const int dst = FLIP ? c * O + o : e;
    for (int xi = 0; xi < 16; xi++) U[xi * oc + dst] = u[xi];
}

__kernel void winograd_input(__global const float* restrict x, const int x_off, const int C, const int H, const int W,
                             const int PH, const int PW, const int TH, const int TW, const int nimg,
                             __global float* restrict V) {
    const int p = get_global_id(0);
    const int c = get_global_id(1);
    const int P = nimg * TH * TW;
    if (p >= P || c >= C) return;
    const int tx = p % TW, ty = (p / TW) % TH, i = p / (TW * TH);
    const int y0 = 2 * ty - PH, x0 = 2 * tx - PW;
    __global const float* plane = x + x_off + (i * C + c) * H * W;
    float d[16];
    for (int r = 0; r < 4; r++) {
        const int yy = y0 + r;
        const bool row_in = yy >= 0 && yy < H;
        for (int q = 0; q < 4; q++) {
            const int xx = x0 + q;
            d[4 * r + q] = (row_in && xx >= 0 && xx < W) ? plane[yy * W + xx] : 0.0f;
        }
    }
    float s[16];  // B^T d
    for (int q = 0; q < 4; q++) WINO_BT(d[q], d[4 + q], d[8 + q], d[12 + q], s[q], s[4 + q], s[8 + q], s[12 + q]);
    float v[16];  // (B^T d) B
    for (int r = 0; r < 4; r++)
        WINO_BT(s[4 * r], s[4 * r + 1], s[4 * r + 2], s[4 * r + 3], v[4 * r], v[4 * r + 1], v[4 * r + 2], v[4 * r + 3]);
    const int cp = C * P;
    for (int xi = 0; xi < 16; xi++) V[xi * cp + c * P + p] = v[xi];
}

__kernel void winograd_output(__global const float* restrict M, __global const float* restrict bias, const int O,
                              const int OH, const int OW, const int TH, const int TW, const int nimg,
                              __global float* restrict y, const int y_off) {
    const int p = get_global_id(0);
    const int o = get_global_id(1);
    const int P = nimg * TH * TW;
    if (p >= P || o >= O) return;
    const int tx = p % TW, ty = (p / TW) % TH, i = p / (TW * TH);
    const int op = O * P;
    float m[16];
    for (int xi = 0; xi < 16; xi++) m[xi] = M[xi * op + o * P + p];
    float r[8];  // A^T m: 2 rows x 4 columns
    for (int q = 0; q < 4; q++) WINO_AT(m[q], m[4 + q], m[8 + q], m[12 + q], r[q], r[4 + q]);
    float out[4];  // (A^T m) A
    for (int k = 0; k < 2; k++) WINO_AT(r[4 * k], r[4 * k + 1], r[4 * k + 2], r[4 * k + 3], out[2 * k], out[2 * k + 1]);
    const float b = BIAS ? bias[o] : 0.0f;
    __global float* plane = y + y_off + (i * O + o) * OH * OW;
    const int oy = 2 * ty, ox = 2 * tx;
    for (int k = 0; k < 2; k++) {
        if (oy + k >= OH) break;
        for (int l = 0; l < 2; l++) {
            if (ox + l >= OW) break;
            float v = out[2 * k + l] + b;
            if (RELU) v = fmax(v, 0.0f);
            plane[(oy + k) * OW + ox + l] = v;
        }
    }
}
