// General batched matrix product with a fused epilogue:
//   C[b](m, n) = act(alpha * sum_k A[b](m, k) * B[b](k, n) + beta * C[b](m, n) + bias)
// Each operand X in {A, B, C} is addressed through strides, so transposes and NCHW views need no copies:
//   X[b](r, c) = X[x_off + b*x_bs + r*x_rs + (c % x_cdiv)*x_cs + (c / x_cdiv)*x_cso]
// The column split (cdiv, cso) lets a column index run over (image, pixel) pairs of an NCHW tensor; it is compiled
// in only where needed (A_SPLIT, B_SPLIT, C_SPLIT). beta == 0 never reads C, so C may hold garbage.
// Split-K: with ksplit > 1 the third global index z runs over batch * ksplit; slice s = z % ksplit sums k in
// [s*kc, s*kc + kc) and writes its partial product to C[z] (plain, alpha 1, beta 0, no epilogue: the host passes a
// scratch buffer), then gemm_reduce sums the slices in a fixed order and applies the real epilogue. This keeps
// products with a small M x N and a huge K (convolution weight gradients) both parallel and accurate.
//
// Two kernels, one per device shape:
//   gemm_tiled  GPU-shaped: a TM x TN tile per work-group staged through local memory in TK-deep slices, each
//               work-item computing WM x WN outputs spread with stride (TM/WM, TN/WN) for conflict-free local reads.
//               Work-group: (TN/WN, TM/WM, 1); global: (ceil(N/TN)*TN/WN, ceil(M/TM)*TM/WM, batch).
//   gemm_block  CPU-shaped: each work-item computes RM rows x 16 columns straight from global memory (rows of B,
//               as two float8, where they are contiguous), no local memory and no barriers.
//               Global: (ceil(N/16), ceil(M/RM), batch); small work-groups.
//
// Defines:
//   A_SPLIT, B_SPLIT, C_SPLIT  0/1: column split in use for that operand
//   BIAS      0 none, 1 one value per row m, 2 one value per column n (bias pointer advanced by b*bias_bs)
//   RELU      0/1: apply max(0, x) last
//   TM TN TK WM WN             gemm_tiled tile shape
//   A_KFAST   0/1: gemm_tiled loads A with consecutive work-items along k (set when A's k stride is 1)
//   B_KFAST   0/1: likewise for B (default: consecutive along n)
//   RM        gemm_block rows per work-item
//   B_CONTIG  0/1: gemm_block may load B rows as float8 pairs (B's column stride is 1 and no split)
#include "common.h"

#ifndef A_SPLIT
#define A_SPLIT 0   // column split on A
#endif
#ifndef B_SPLIT
#define B_SPLIT 0   // column split on B
#endif
#ifndef C_SPLIT
#define C_SPLIT 0   // column split on C
#endif
#ifndef BIAS
#define BIAS 0      // 0 none, 1 per row, 2 per column
#endif
#ifndef RELU
#define RELU 0      // fused ReLU
#endif
#ifndef TM
#define TM 64       // tile rows
#endif
#ifndef TN
#define TN 64       // tile columns
#endif
#ifndef TK
#define TK 16       // tile depth
#endif
#ifndef WM
#define WM 4        // rows per work-item
#endif
#ifndef WN
#define WN 4        // columns per work-item
#endif
#ifndef A_KFAST
#define A_KFAST 0   // A loads run along k
#endif
#ifndef B_KFAST
#define B_KFAST 0   // B loads run along k
#endif
#ifndef RM
#define RM 4        // gemm_block rows per work-item
#endif
#ifndef B_CONTIG
#define B_CONTIG 0  // gemm_block: B rows contiguous
#endif

#if TM % WM != 0 || TN % WN != 0
#error "TM must be a multiple of WM and TN of WN"
#endif
#if BIAS < 0 || BIAS > 2
#error "BIAS must be 0, 1 or 2"
#endif
#if B_CONTIG && B_SPLIT
#error "B_CONTIG needs an unsplit B"
#endif

#if A_SPLIT
#define A_COL(c) (((c) % a_cdiv) * a_cs + ((c) / a_cdiv) * a_cso)
#else
#define A_COL(c) ((c) * a_cs)
#endif
#if B_SPLIT
#define B_COL(c) (((c) % b_cdiv) * b_cs + ((c) / b_cdiv) * b_cso)
#else
#define B_COL(c) ((c) * b_cs)
#endif
#if C_SPLIT
#define C_COL(c) (((c) % c_cdiv) * c_cs + ((c) / c_cdiv) * c_cso)
#else
#define C_COL(c) ((c) * c_cs)
#endif

#define GEMM_ARGS \
    const int M, const int N, const int K, const float alpha, const float beta, \
    __global const float* restrict A, const int a_off, const int a_bs, const int a_rs, const int a_cs, \
    const int a_cdiv, const int a_cso, \
    __global const float* restrict B, const int b_off, const int b_bs, const int b_rs, const int b_cs, \
    const int b_cdiv, const int b_cso, \
    __global float* C, const int c_off, const int c_bs, const int c_rs, const int c_cs, \
    const int c_cdiv, const int c_cso, \
    __global const float* restrict bias, const int bias_bs, const int ksplit, const int kc

inline float epilogue(float acc, const float alpha, const float beta, __global const float* C, const int c_idx,
                      __global const float* restrict bias, const int bias_idx) {
    float v = alpha * acc;
    if (beta != 0.0f) v += beta * C[c_idx];
#if BIAS
    v += bias[bias_idx];
#endif
#if RELU
    v = fmax(v, 0.0f);
#endif
    return v;
}

__kernel __attribute__((reqd_work_group_size(TN / WN, TM / WM, 1)))
void gemm_tiled(GEMM_ARGS) {
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int z = get_global_id(2), b = z / ksplit;
    const int kbeg = (z % ksplit) * kc, kend = min(K, kbeg + kc);
    const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;
    const int tid = ty * (TN / WN) + tx;
    const int nthreads = (TM / WM) * (TN / WN);
    __global const float* Ab = A + a_off + b * a_bs;
    __global const float* Bb = B + b_off + b * b_bs;

    __local float As[TK][TM + 1];
    __local float Bs[TK][TN + 1];
    float acc[WM][WN];
    for (int i = 0; i < WM; i++)
        for (int j = 0; j < WN; j++) acc[i][j] = 0.0f;

    for (int k0 = kbeg; k0 < kend; k0 += TK) {
        for (int e = tid; e < TM * TK; e += nthreads) {
#if A_KFAST
            const int kk = e % TK, mm = e / TK;
#else
            const int mm = e % TM, kk = e / TM;
#endif
            const int gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < kend) ? Ab[gm * a_rs + A_COL(gk)] : 0.0f;
        }
        for (int e = tid; e < TN * TK; e += nthreads) {
#if B_KFAST
            const int kk = e % TK, nn = e / TK;
#else
            const int nn = e % TN, kk = e / TN;
#endif
            const int gn = n0 + nn, gk = k0 + kk;
            Bs[kk][nn] = (gn < N && gk < kend) ? Bb[gk * b_rs + B_COL(gn)] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (int kk = 0; kk < TK; kk++) {
            float a[WM], bv[WN];
            for (int i = 0; i < WM; i++) a[i] = As[kk][ty + i * (TM / WM)];
            for (int j = 0; j < WN; j++) bv[j] = Bs[kk][tx + j * (TN / WN)];
            for (int i = 0; i < WM; i++)
                for (int j = 0; j < WN; j++) acc[i][j] = mad(a[i], bv[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    __global float* Cb = C + c_off + z * c_bs;
    __global const float* biasb = bias + b * bias_bs;
    for (int i = 0; i < WM; i++) {
        const int gm = m0 + ty + i * (TM / WM);
        if (gm >= M) continue;
        for (int j = 0; j < WN; j++) {
            const int gn = n0 + tx + j * (TN / WN);
            if (gn >= N) continue;
            const int ci = gm * c_rs + C_COL(gn);
            Cb[ci] = epilogue(acc[i][j], alpha, beta, Cb, ci, biasb, BIAS == 1 ? gm : gn);
        }
    }
}

// 16 columns as two float8 halves: float8 is one AVX2 register, and PoCL miscompiles float16 on CPUs without
// AVX-512 (the upper half comes back as zeros).
#define VEC8_FROM(t, o) (float8)(t[o], t[o + 1], t[o + 2], t[o + 3], t[o + 4], t[o + 5], t[o + 6], t[o + 7])
#define VEC8_PARTS(v) v.s0, v.s1, v.s2, v.s3, v.s4, v.s5, v.s6, v.s7

__kernel void gemm_block(GEMM_ARGS) {
    const int n0 = get_global_id(0) * 16;
    const int m0 = get_global_id(1) * RM;
    const int z = get_global_id(2), b = z / ksplit;
    const int kbeg = (z % ksplit) * kc, kend = min(K, kbeg + kc);
    if (n0 >= N || m0 >= M) return;
    __global const float* Ab = A + a_off + b * a_bs;
    __global const float* Bb = B + b_off + b * b_bs;
    const bool full_n = n0 + 16 <= N;

    float8 lo[RM], hi[RM];
    int arow[RM];
    for (int i = 0; i < RM; i++) {
        lo[i] = (float8)(0.0f);
        hi[i] = (float8)(0.0f);
        arow[i] = min(m0 + i, M - 1) * a_rs;  // rows past M repeat the last row; never stored
    }
    for (int k = kbeg; k < kend; k++) {
        float8 blo, bhi;
#if B_CONTIG
        if (full_n) {
            blo = vload8(0, Bb + k * b_rs + n0);
            bhi = vload8(1, Bb + k * b_rs + n0);
        } else
#endif
        {
            float t[16];
            for (int j = 0; j < 16; j++) t[j] = (n0 + j < N) ? Bb[k * b_rs + B_COL(n0 + j)] : 0.0f;
            blo = VEC8_FROM(t, 0);
            bhi = VEC8_FROM(t, 8);
        }
        const int acol = A_COL(k);
        for (int i = 0; i < RM; i++) {
            const float a = Ab[arow[i] + acol];
            lo[i] += a * blo;
            hi[i] += a * bhi;
        }
    }

    __global float* Cb = C + c_off + z * c_bs;
    __global const float* biasb = bias + b * bias_bs;
    for (int i = 0; i < RM; i++) {
        const int gm = m0 + i;
        if (gm >= M) break;
        const float8 vl = lo[i], vh = hi[i];
        const float t[16] = {VEC8_PARTS(vl), VEC8_PARTS(vh)};
        for (int j = 0; j < 16; j++) {
            const int gn = n0 + j;
            if (gn >= N) break;
            const int ci = gm * c_rs + C_COL(gn);
            Cb[ci] = epilogue(t[j], alpha, beta, Cb, ci, biasb, BIAS == 1 ? gm : gn);
        }
    }
}

// Sums the ksplit partial products P[(b*ksplit + s)](m, n), stored densely (M x N each), in order s = 0, 1, ...,
// and applies the epilogue into C. One work-item per (n, m, b).
__kernel void gemm_reduce(const int M, const int N, const int ksplit, const float alpha, const float beta,
                          __global const float* restrict P,
                          __global float* C, const int c_off, const int c_bs, const int c_rs, const int c_cs,
                          const int c_cdiv, const int c_cso,
                          __global const float* restrict bias, const int bias_bs) {
    const int n = get_global_id(0), m = get_global_id(1), b = get_global_id(2);
    if (n >= N || m >= M) return;
    __global const float* p = P + (size_t)b * ksplit * M * N + m * N + n;
    float acc = 0.0f;
    for (int s = 0; s < ksplit; s++) acc += p[(size_t)s * M * N];
    __global float* Cb = C + c_off + b * c_bs;
    const int ci = m * c_rs + C_COL(n);
    Cb[ci] = epilogue(acc, alpha, beta, Cb, ci, bias + b * bias_bs, BIAS == 1 ? m : n);
}
