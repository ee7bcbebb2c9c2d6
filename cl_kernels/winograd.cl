// Winograd F(2x2, 3x3) convolution (Lavin & Gray, 2015) for 3x3, stride-1, undilated, ungrouped layers. The output
// is cut into 2x2 tiles; tile (ty, tx) reads the 4x4 input window whose top-left element is (2*ty - PH, 2*tx - PW),
// and Y = A^T [ sum over c of (G g G^T) .* (B^T d B) ] A. The sum over c of each of the 16 element-wise products is a
// matrix product, so the host runs one batched GEMM (batch 16) between the two transforms:
//   M[xi] (O, P) = U[xi] (O, C) @ V[xi] (C, P), xi = 4*row + column of the 4x4 transformed tile.
// The weight gradient runs the same product backwards: with Z = A dY A^T (the adjoint of the output transform),
//   Mhat[xi] (O, C) = sum over p of Z[xi] (p, O) * V[xi] (p, C), and dw += G^T Mhat G (the adjoint of G g G^T).
//
//   winograd_weights       w (O, C, 3, 3) -> U (16, O, C): U[xi][o][c] = (G w[o][c] G^T)[xi].
//                          With FLIP, the weights of the backward-data convolution (channels swapped, kernel rotated
//                          by 180 degrees): U (16, C, O), U[xi][c][o] = (G rot180(w[o][c]) G^T)[xi].
//   winograd_input         x (N, C, H, W), images [n0, n0 + nimg) from element x_off on -> V (16, C, P),
//                          P = nimg*TH*TW, column p = (i*TH + ty)*TW + tx: V[xi][c][p] = (B^T d B)[xi], d read as zero
//                          outside the image. PH, PW may be negative (the backward-data convolution of a layer padded
//                          by more than 2). With V_PC, V is stored (16, P, C) instead: V[xi][p][c].
//   winograd_output        M (16, O, P) -> y (N, O, OH, OW) from element y_off on: the 2x2 tile A^T m A (+ bias[o],
//                          then ReLU); rows and columns past OH, OW (odd output sizes) are not written.
//   winograd_grad_output   dy (N, O, OH, OW), images from element dy_off on -> Z (16, P, O): Z[xi][p][o] =
//                          (A dY A^T)[xi] for the 2x2 tile dY of dy, read as zero past OH, OW (those outputs were
//                          never produced, so they carry no gradient).
//   winograd_grad_weights  Mhat (16, O, C) -> dw (O, C, 3, 3) += G^T Mhat[.][o][c] G (4x4 -> 3x3).
// Work-items: one per (p, c) for the input transform ((c, p) with V_PC), per (p, o) for the output transform, per
// (o, p) for the output-gradient transform, per (o, c) for the weight transforms. The fastest index is the one that
// puts neighbouring work-items' 16 loads or stores of V, M or Z (the large buffers) at neighbouring addresses; the
// other side (x, y, dy) is read or written at a stride of 2 or of a plane. Sizes are arguments.
// Defines: FLIP (winograd_weights), V_PC (winograd_input), BIAS and RELU (winograd_output).
//
// The matrices (the F(2, 3) choice of interpolation points 0, 1, -1 and infinity):
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
//   A^T = [1 1 1 0; 0 1 -1 -1]
#include "common.h"

#ifndef FLIP
#define FLIP 0  // 1: transform the backward-data weights, rot180 and (O, C) transposed
#endif
#ifndef V_PC
#define V_PC 0  // 1: winograd_input stores V as (16, P, C) (the weight gradient's GEMM operand, k = p slowest)
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

// z = A y for one column (y0, y1) of a 2x2 tile: the adjoint of WINO_AT.
#define WINO_A(y0, y1, z0, z1, z2, z3) \
    do { (z0) = (y0); (z1) = (y0) + (y1); (z2) = (y0) - (y1); (z3) = -(y1); } while (0)

// g = G^T u for one column (u0, u1, u2, u3) of a 4x4 tile: the adjoint of WINO_G.
#define WINO_GT(u0, u1, u2, u3, g0, g1, g2) \
    do { const float h = 0.5f * ((u1) + (u2)); (g0) = (u0) + h; (g1) = 0.5f * ((u1) - (u2)); (g2) = h + (u3); } \
    while (0)

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
    const int p = get_global_id(V_PC ? 1 : 0);
    const int c = get_global_id(V_PC ? 0 : 1);
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
    const int dst = V_PC ? p * C + c : c * P + p;
    for (int xi = 0; xi < 16; xi++) V[xi * cp + dst] = v[xi];
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

__kernel void winograd_grad_output(__global const float* restrict dy, const int dy_off, const int O, const int OH,
                                   const int OW, const int TH, const int TW, const int nimg,
                                   __global float* restrict Z) {
    const int o = get_global_id(0);
    const int p = get_global_id(1);
    const int P = nimg * TH * TW;
    if (o >= O || p >= P) return;
    const int tx = p % TW, ty = (p / TW) % TH, i = p / (TW * TH);
    __global const float* plane = dy + dy_off + (i * O + o) * OH * OW;
    const int oy = 2 * ty, ox = 2 * tx;
    float d[4];
    for (int k = 0; k < 2; k++)
        for (int l = 0; l < 2; l++)
            d[2 * k + l] = (oy + k < OH && ox + l < OW) ? plane[(oy + k) * OW + ox + l] : 0.0f;
    float t[8];  // A dY: 4 rows x 2 columns
    for (int l = 0; l < 2; l++) WINO_A(d[l], d[2 + l], t[l], t[2 + l], t[4 + l], t[6 + l]);
    float z[16];  // (A dY) A^T
    for (int r = 0; r < 4; r++) WINO_A(t[2 * r], t[2 * r + 1], z[4 * r], z[4 * r + 1], z[4 * r + 2], z[4 * r + 3]);
    const int po = P * O;
    for (int xi = 0; xi < 16; xi++) Z[xi * po + p * O + o] = z[xi];
}

__kernel void winograd_grad_weights(__global const float* restrict Mhat, const int O, const int C,
                                    __global float* restrict dw) {
    const int e = get_global_id(0);
    if (e >= O * C) return;
    const int oc = O * C;
    float m[16];
    for (int xi = 0; xi < 16; xi++) m[xi] = Mhat[xi * oc + e];
    float t[12];  // G^T m: 3 rows x 4 columns
    for (int q = 0; q < 4; q++) WINO_GT(m[q], m[4 + q], m[8 + q], m[12 + q], t[q], t[4 + q], t[8 + q]);
    float g[9];  // (G^T m) G
    for (int r = 0; r < 3; r++)
        WINO_GT(t[4 * r], t[4 * r + 1], t[4 * r + 2], t[4 * r + 3], g[3 * r], g[3 * r + 1], g[3 * r + 2]);
    for (int k = 0; k < 9; k++) dw[e * 9 + k] += g[k];
}
