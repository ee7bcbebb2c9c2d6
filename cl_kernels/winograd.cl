// Winograd F(m x m, r x r) convolution (Lavin & Gray, 2015) for r x r, stride-1, undilated, ungrouped layers. The
// output is cut into m x m tiles; tile (ty, tx) reads the a x a input window (a = m + r - 1) whose top-left element
// is (m*ty - PH, m*tx - PW), and Y = A^T [ sum over c of (G g G^T) .* (B^T d B) ] A. The sum over c of each of the
// a*a element-wise products is a matrix product, so the host runs one batched GEMM (batch a*a) between the transforms:
//   M[xi] (O, P) = U[xi] (O, C) @ V[xi] (C, P), xi = a*row + column of the a x a transformed tile.
// The weight gradient runs the same product backwards: with Z = A dY A^T (the adjoint of the output transform),
//   Mhat[xi] (O, C) = sum over p of Z[xi] (p, O) * V[xi] (p, C), and dw += G^T Mhat G (the adjoint of G g G^T).
//
//   winograd_weights       w (O, C, r, r) -> U (a*a, O, C): U[xi][o][c] = (G w[o][c] G^T)[xi].
//                          With FLIP, the weights of the backward-data convolution (channels swapped, kernel rotated
//                          by 180 degrees): U (a*a, C, O), U[xi][c][o] = (G rot180(w[o][c]) G^T)[xi].
//   winograd_input         x (N, C, H, W), images [n0, n0 + nimg) from element x_off on -> V (a*a, C, P),
//                          P = nimg*TH*TW, column p = (i*TH + ty)*TW + tx: V[xi][c][p] = (B^T d B)[xi], d read as zero
//                          outside the image. PH, PW may be negative (the backward-data convolution of a layer padded
//                          by more than r - 1).
//   winograd_input_pc      the same transform stored (a*a, P, C), V[xi][p][c]: the weight gradient's operand.
//   winograd_output        M (a*a, O, P) -> y (N, O, OH, OW) from element y_off on: the m x m tile A^T M A
//                          (+ bias[o], then ReLU); rows and columns past OH, OW (clipped tiles) are not written.
//   winograd_grad_output   dy (N, O, OH, OW), images from element dy_off on -> Z (a*a, P, O): Z[xi][p][o] =
//                          (A dY A^T)[xi] for the m x m tile dY of dy, read as zero past OH, OW (those outputs were
//                          never produced, so they carry no gradient).
//   winograd_grad_weights  Mhat (a*a, O, C) -> dw (O, C, r, r) += G^T Mhat[.][o][c] G (a x a -> r x r); add 0 writes
//                          dw instead, without reading it.
// Work-items: one per (p, c) for the input transforms, per (p, o) for the output transform, per (o, p) for the
// output-gradient transform, per (o, c) for the weight transforms. winograd_input and winograd_output run p fastest:
// neighbouring work-items read or write neighbouring tiles of one plane of x or y, and neighbouring elements of V or M.
// winograd_input_pc stores V channel-fastest; run in that order, each work-item's a x a window lies in another plane,
// and it took 1.2-2.9x winograd_input's time on the same input (h200-v9, where it shared winograd_input's name: its
// time there is that name's backward total less h200-v11's data-gradient transform). So it reads p fastest and passes
// its results through local memory in TPC x TPC blocks, to store them channel-fastest (store_channel_fastest):
// 0.55-0.77 of that time at every layer measured but AlexNet's 5x5 one, where it took 1.17x (h200-v11).
// winograd_grad_output reads only m x m values per a x a it writes, and the same scheme made it 1.0-1.8x slower
// (h200-v10), so it runs channel-fastest. Sizes are arguments.
// Defines: WINO_M and WINO_R (the variant: F(2, 3), F(2, 5) or F(4, 3)), FLIP (winograd_weights), BIAS and RELU
// (winograd_output).
//
// The matrices are Toom-Cook's for interpolation points f_i and infinity: A^T[j][i] = f_i^j; row i of B^T holds the
// coefficients (ascending powers) of prod over k != i of (x - f_k), and its last row those of prod over all k; row i
// of G is (1, f_i, f_i^2, ...) / prod over k != i of (f_i - f_k), its last row (0, ..., 0, 1). Each row of B^T is
// scaled to integers and its row of G divided by the same factor, so the input transform (applied to every tile of
// every channel) stays exact in small integers and the divisions fall on the weights. The points 0, 1, -1, 2, -1/2
// for a = 6: in float32 they gave 2-3x lower error than 0, +-1, +-2 or 0, +-1, +-1/2 (simulated against float64,
// F(4, 3): 2.1e-6 against 1.3e-5 and 7.8e-6 for 64 channels; F(2, 5): 1.4e-6 against 3.3e-6 and 3.8e-6).
#include "common.h"

#ifndef WINO_M
#define WINO_M 2  // m: output tile side
#endif
#ifndef WINO_R
#define WINO_R 3  // r: kernel side
#endif
#ifndef FLIP
#define FLIP 0  // 1: transform the backward-data weights, rot180 and (O, C) transposed
#endif
#ifndef BIAS
#define BIAS 0  // 1: winograd_output adds bias[o]
#endif
#ifndef RELU
#define RELU 0  // 1: winograd_output applies max(0, .) after the bias
#endif

#define WA (WINO_M + WINO_R - 1)  // a: transformed tile side
#define WAA (WA * WA)

#if WINO_M == 2 && WINO_R == 3
// points 0, 1, -1: Lavin & Gray's matrices (rows 0 and 3 of B^T negated against the rule above, with G's row 0 and
// A^T's column 3)
__constant float BT[WA * WA] = {1, 0, -1, 0,  0, 1, 1, 0,  0, -1, 1, 0,  0, 1, 0, -1};
__constant float G[WA * WINO_R] = {1, 0, 0,  0.5f, 0.5f, 0.5f,  0.5f, -0.5f, 0.5f,  0, 0, 1};
__constant float AT[WINO_M * WA] = {1, 1, 1, 0,  0, 1, -1, -1};
#elif WA == 6
// points 0, 1, -1, 2, -1/2; B^T and G are the same for F(2, 5) and F(4, 3) up to G's width
__constant float BT[WA * WA] = {2, 3, -4, -3, 2, 0,  0, -2, -5, -1, 2, 0,  0, 2, 1, -5, 2, 0,  0, -1, -2, 1, 2, 0,
                                0, 2, -1, -2, 1, 0,  0, 2, 3, -4, -3, 2};
#if WINO_R == 5
__constant float G[WA * WINO_R] = {
    1.0f / 2, 0, 0, 0, 0,
    -1.0f / 6, -1.0f / 6, -1.0f / 6, -1.0f / 6, -1.0f / 6,
    1.0f / 6, -1.0f / 6, 1.0f / 6, -1.0f / 6, 1.0f / 6,
    1.0f / 30, 1.0f / 15, 2.0f / 15, 4.0f / 15, 8.0f / 15,
    -16.0f / 15, 8.0f / 15, -4.0f / 15, 2.0f / 15, -1.0f / 15,
    0, 0, 0, 0, 1.0f / 2};
__constant float AT[WINO_M * WA] = {1, 1, 1, 1, 1, 0,  0, 1, -1, 2, -0.5f, 1};
#elif WINO_R == 3
__constant float G[WA * WINO_R] = {
    1.0f / 2, 0, 0,
    -1.0f / 6, -1.0f / 6, -1.0f / 6,
    1.0f / 6, -1.0f / 6, 1.0f / 6,
    1.0f / 30, 1.0f / 15, 2.0f / 15,
    -16.0f / 15, 8.0f / 15, -4.0f / 15,
    0, 0, 1.0f / 2};
__constant float AT[WINO_M * WA] = {1, 1, 1, 1, 1, 0,  0, 1, -1, 2, -0.5f, 0,  0, 1, 1, 4, 0.25f, 0,
                                    0, 1, -1, 8, -0.125f, 1};
#else
#error "WINO_M = 2 with WINO_R = 5, or WINO_M = 4 with WINO_R = 3"
#endif
#else
#error "supported variants: F(2, 3), F(2, 5), F(4, 3)"
#endif

// out (n x n) = L in L^T, for in (k x k) and L (n x k) whose element (i, l) is L[i * RS + l * CS]: (RS, CS) = (k, 1)
// for a matrix stored (n x k) row-major, (1, n) for the transpose of one stored (k x n), which gives the adjoint
// transforms (A dY A^T from A^T, G^T M G from G). The sizes are constants at every call, so the loops unroll and the
// products with L's zeros and ones fold away.
#define SANDWICH(L, RS, CS, n, k, in, out) do { \
    float t_[(n) * (k)]; \
    for (int i_ = 0; i_ < (n); i_++) \
        for (int j_ = 0; j_ < (k); j_++) { \
            float s_ = 0.0f; \
            for (int l_ = 0; l_ < (k); l_++) s_ += (L)[i_ * (RS) + l_ * (CS)] * (in)[l_ * (k) + j_]; \
            t_[i_ * (k) + j_] = s_; \
        } \
    for (int i_ = 0; i_ < (n); i_++) \
        for (int j_ = 0; j_ < (n); j_++) { \
            float s_ = 0.0f; \
            for (int l_ = 0; l_ < (k); l_++) s_ += t_[i_ * (k) + l_] * (L)[j_ * (RS) + l_ * (CS)]; \
            (out)[i_ * (n) + j_] = s_; \
        } \
} while (0)

__kernel void winograd_weights(__global const float* restrict w, OFFSET_PARAM(w), const int O, const int C,
                               __global float* restrict U, OFFSET_PARAM(U)) {
    AT_OFFSET(__global const float*, w) AT_OFFSET(__global float*, U)
    const int e = get_global_id(0);
    if (e >= O * C) return;
    const int o = e / C, c = e % C;
    float g[WINO_R * WINO_R];
    for (int k = 0; k < WINO_R * WINO_R; k++) g[k] = w[e * WINO_R * WINO_R + (FLIP ? WINO_R * WINO_R - 1 - k : k)];
    float u[WAA];
    SANDWICH(G, WINO_R, 1, WA, WINO_R, g, u);
    const int oc = O * C;
    const int dst = FLIP ? c * O + o : e;
    for (int xi = 0; xi < WAA; xi++) U[xi * oc + dst] = u[xi];
}

// The a x a transform B^T d B of the input window of tile p of channel c (zero outside the image).
inline void input_tile(__global const float* restrict x, const int x_off, const int C, const int H, const int W,
                       const int PH, const int PW, const int TH, const int TW, const int p, const int c, float* v) {
    const int tx = p % TW, ty = (p / TW) % TH, i = p / (TW * TH);
    const int y0 = WINO_M * ty - PH, x0 = WINO_M * tx - PW;
    __global const float* plane = x + x_off + (i * C + c) * H * W;
    float d[WAA];
    for (int r = 0; r < WA; r++) {
        const int yy = y0 + r;
        const bool row_in = yy >= 0 && yy < H;
        for (int q = 0; q < WA; q++) {
            const int xx = x0 + q;
            d[WA * r + q] = (row_in && xx >= 0 && xx < W) ? plane[yy * W + xx] : 0.0f;
        }
    }
    SANDWICH(BT, WA, 1, WA, WA, d, v);
}

#ifndef TPC
#define TPC 16  // tiles and channels per side of a store_channel_fastest block (the host fits it to the device)
#endif

// Work-item (p0 + lx, ch0 + ly) of a TPC x TPC work-group holds v, its a*a values; stores them all to
// D[xi][p][ch] (P x CH per xi) with the channel fastest, each work-item storing for (p0 + ly, ch0 + lx), through
// `t` (a*a x TPC x (TPC + 1) floats of local memory: the odd row length leaves at most 2-way bank conflicts in
// either pass, where a row length of TPC would serialise the transposed pass TPC-fold).
inline void store_channel_fastest(__local float* t, const float* v, const int p0, const int ch0, const int P,
                                  const int CH, __global float* restrict D) {
    const int lx = get_local_id(0), ly = get_local_id(1);
    for (int xi = 0; xi < WAA; xi++) t[(xi * TPC + ly) * (TPC + 1) + lx] = v[xi];
    barrier(CLK_LOCAL_MEM_FENCE);
    const int p = p0 + ly, ch = ch0 + lx;
    if (p >= P || ch >= CH) return;
    for (int xi = 0; xi < WAA; xi++) D[(size_t)xi * P * CH + p * CH + ch] = t[(xi * TPC + lx) * (TPC + 1) + ly];
}

__kernel void winograd_input(__global const float* restrict x, OFFSET_PARAM(x), const int x_off, const int C,
                             const int H, const int W, const int PH, const int PW, const int TH, const int TW,
                             const int nimg, __global float* restrict V, OFFSET_PARAM(V)) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, V)
    const int p = get_global_id(0), c = get_global_id(1);
    const int P = nimg * TH * TW;
    if (p >= P || c >= C) return;
    float v[WAA];
    input_tile(x, x_off, C, H, W, PH, PW, TH, TW, p, c, v);
    const int cp = C * P;
    for (int xi = 0; xi < WAA; xi++) V[xi * cp + c * P + p] = v[xi];
}

__kernel __attribute__((reqd_work_group_size(TPC, TPC, 1)))
void winograd_input_pc(__global const float* restrict x, OFFSET_PARAM(x), const int x_off, const int C, const int H,
                       const int W, const int PH, const int PW, const int TH, const int TW, const int nimg,
                       __global float* restrict V, OFFSET_PARAM(V)) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, V)
    __local float t[WAA * TPC * (TPC + 1)];
    const int p = get_global_id(0), c = get_global_id(1);
    const int P = nimg * TH * TW;
    float v[WAA];
    if (p < P && c < C) {
        input_tile(x, x_off, C, H, W, PH, PW, TH, TW, p, c, v);
    } else {
        for (int xi = 0; xi < WAA; xi++) v[xi] = 0.0f;  // every work-item reaches the barrier
    }
    store_channel_fastest(t, v, get_group_id(0) * TPC, get_group_id(1) * TPC, P, C, V);
}

__kernel void winograd_output(__global const float* restrict M, OFFSET_PARAM(M), __global const float* restrict bias,
                              OFFSET_PARAM(bias), const int O, const int OH, const int OW, const int TH, const int TW,
                              const int nimg, __global float* restrict y, OFFSET_PARAM(y), const int y_off) {
    AT_OFFSET(__global const float*, M) AT_OFFSET(__global const float*, bias) AT_OFFSET(__global float*, y)
    const int p = get_global_id(0);
    const int o = get_global_id(1);
    const int P = nimg * TH * TW;
    if (p >= P || o >= O) return;
    const int tx = p % TW, ty = (p / TW) % TH, i = p / (TW * TH);
    const int op = O * P;
    float m[WAA];
    for (int xi = 0; xi < WAA; xi++) m[xi] = M[xi * op + o * P + p];
    float out[WINO_M * WINO_M];
    SANDWICH(AT, WA, 1, WINO_M, WA, m, out);
    const float b = BIAS ? bias[o] : 0.0f;
    __global float* plane = y + y_off + (i * O + o) * OH * OW;
    const int oy = WINO_M * ty, ox = WINO_M * tx;
    for (int k = 0; k < WINO_M; k++) {
        if (oy + k >= OH) break;
        for (int l = 0; l < WINO_M; l++) {
            if (ox + l >= OW) break;
            float v = out[WINO_M * k + l] + b;
            if (RELU) v = v < 0.0f ? 0.0f : v;  // not fmax: NaN stays NaN
            plane[(oy + k) * OW + ox + l] = v;
        }
    }
}

__kernel void winograd_grad_output(__global const float* restrict dy, OFFSET_PARAM(dy), const int dy_off, const int O,
                                   const int OH, const int OW, const int TH, const int TW, const int nimg,
                                   __global float* restrict Z, OFFSET_PARAM(Z)) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, Z)
    const int o = get_global_id(0);
    const int p = get_global_id(1);
    const int P = nimg * TH * TW;
    if (o >= O || p >= P) return;
    const int tx = p % TW, ty = (p / TW) % TH, i = p / (TW * TH);
    __global const float* plane = dy + dy_off + (i * O + o) * OH * OW;
    const int oy = WINO_M * ty, ox = WINO_M * tx;
    float d[WINO_M * WINO_M];
    for (int k = 0; k < WINO_M; k++)
        for (int l = 0; l < WINO_M; l++)
            d[WINO_M * k + l] = (oy + k < OH && ox + l < OW) ? plane[(oy + k) * OW + ox + l] : 0.0f;
    float z[WAA];
    SANDWICH(AT, 1, WA, WA, WINO_M, d, z);  // A = (A^T)^T, A^T stored (m x a)
    const int po = P * O;
    for (int xi = 0; xi < WAA; xi++) Z[xi * po + p * O + o] = z[xi];
}

__kernel void winograd_grad_weights(__global const float* restrict Mhat, OFFSET_PARAM(Mhat), const int O, const int C,
                                    __global float* restrict dw, OFFSET_PARAM(dw), const int add) {
    AT_OFFSET(__global const float*, Mhat) AT_OFFSET(__global float*, dw)
    const int e = get_global_id(0);
    if (e >= O * C) return;
    const int oc = O * C;
    float m[WAA];
    for (int xi = 0; xi < WAA; xi++) m[xi] = Mhat[xi * oc + e];
    float g[WINO_R * WINO_R];
    SANDWICH(G, 1, WINO_R, WINO_R, WA, m, g);  // G^T, G stored (a x r)
    __global float* out = dw + e * WINO_R * WINO_R;
    for (int k = 0; k < WINO_R * WINO_R; k++) out[k] = add ? out[k] + g[k] : g[k];
}
