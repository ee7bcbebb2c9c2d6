// A dense layer's batch-1 products on a CPU (gemv.cl's GPU kernels and gemm_block both read the weight in runs too
// short for a CPU's prefetchers at batch 1; these read it row by row, as one contiguous stream per work-item).
//   gemv_dot    C(0, n) = epilogue(alpha * sum_k A(0, k) B(k, n)), B's k stride 1: each output is the dot product of
//               one contiguous row of B (a dense layer's output: rows of its weight)
//   gemv_axpy   P partial rows: part[p](n) = sum_{k in slice p} A(0, k) B(k, n), B's n stride 1: each work-item adds
//               a slice of B's contiguous rows, scaled, into its own row of partial sums (8 KB for 2048 outputs:
//               it stays in the core's L1 cache) (a dense layer's input gradient: rows of its weight again)
//   gemv_sum    C(0, n) = epilogue(alpha * sum_p part[p](n)), the P partials added in order p = 0, 1, ...
//   rank1_rows  C(m, n) = epilogue(alpha * A(m, 0) B(0, n)), a row of C per work-item (the weight gradient); with
//               ROWSUM also D(m) (+)= alpha * A(m, 0) (the bias gradient)
// A's k stride and C's n stride are 1 (the host checks). One product, batch 1, operands without column splits.
// Each float8 lane of gemv_dot sums its terms in stages of 64 (then added to the lane's total), as gemm_block's
// two-level sums: float32 error grows with the stage and stage-count lengths, not K.
//
// Defines (besides gemv_common.h's ROWSUM and A_MASK):
//   ROWS    gemv_dot: outputs per work-item (fewer work-groups: PoCL pays for each)
#include "gemv_common.h"

#ifndef ROWS
#define ROWS 16
#endif
#if A_MASK
#define MASKED8(v, i) select((v), (float8)(0.0f), vload8(0, amask + (i)) <= (float8)(0.0f))
#else
#define MASKED8(v, i) (v)
#endif

#define STAGE 64  // float8 steps per stage of gemv_dot's sums

// Four outputs a pass (four rows of B streamed side by side, four independent sums); ROWS is a multiple of 4.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemv_dot(const int N, const int K, const float alpha, const float beta, __global const float* restrict A,
              OFFSET_PARAM(A), const int a_off, __global const float* restrict B, OFFSET_PARAM(B), const int b_off,
              const int b_cs, __global float* C, OFFSET_PARAM(C), const int c_off, __global const float* restrict bias,
              OFFSET_PARAM(bias), const int bias_mode, const int relu, __global const float* restrict amask,
              OFFSET_PARAM(amask)) {
    AT_OFFSET(__global const float*, A) AT_OFFSET(__global const float*, B) AT_OFFSET(__global float*, C)
    AT_OFFSET(__global const float*, bias) AT_OFFSET(__global const float*, amask)
    const int n0 = get_global_id(0) * ROWS;
    const int n1 = min(N, n0 + ROWS);
    __global const float* a = A + a_off;
    const int K8 = K & ~7;
    for (int n = n0; n < n1; n += 4) {
        // rows past N read row n again (their sums are not stored)
        __global const float* b0 = B + b_off + n * b_cs;
        __global const float* b1 = n + 1 < n1 ? b0 + b_cs : b0;
        __global const float* b2 = n + 2 < n1 ? b0 + 2 * b_cs : b0;
        __global const float* b3 = n + 3 < n1 ? b0 + 3 * b_cs : b0;
        float8 t0 = (float8)(0.0f), t1 = t0, t2 = t0, t3 = t0;
        for (int k0 = 0; k0 < K8; k0 += 8 * STAGE) {
            const int end = min(K8, k0 + 8 * STAGE);
            float8 s0 = (float8)(0.0f), s1 = s0, s2 = s0, s3 = s0;
            for (int k = k0; k < end; k += 8) {
                const float8 av = MASKED8(vload8(0, a + k), k);
                s0 += av * vload8(0, b0 + k);
                s1 += av * vload8(0, b1 + k);
                s2 += av * vload8(0, b2 + k);
                s3 += av * vload8(0, b3 + k);
            }
            t0 += s0; t1 += s1; t2 += s2; t3 += s3;
        }
        float sums[4];
        const float8 t[4] = {t0, t1, t2, t3};
        __global const float* bs[4] = {b0, b1, b2, b3};
        for (int r = 0; r < 4; r++) {
            float tail = 0.0f;
            for (int k = K8; k < K; k++) tail += MASKED(a[k], k) * bs[r][k];
            const float4 t4 = t[r].lo + t[r].hi;
            sums[r] = ((t4.x + t4.y) + (t4.z + t4.w)) + tail;
        }
        for (int r = 0; r < 4 && n + r < n1; r++)
            C[c_off + n + r] = gemm_epilogue(sums[r], alpha, beta, C + c_off, n + r, bias, bias_mode, 0, n + r, relu);
    }
}

// Work-item p of P sums the rows k in [p * kc, min(K, p * kc + kc)) into part + p * N, four rows a pass.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemv_axpy(const int N, const int K, const int kc, __global const float* restrict A, OFFSET_PARAM(A),
               const int a_off, __global const float* restrict B, OFFSET_PARAM(B), const int b_off, const int b_rs,
               __global float* restrict part, OFFSET_PARAM(part), __global const float* restrict amask,
               OFFSET_PARAM(amask)) {
    AT_OFFSET(__global const float*, A) AT_OFFSET(__global const float*, B) AT_OFFSET(__global float*, part)
    AT_OFFSET(__global const float*, amask)
    const int p = get_global_id(0);
    const int k0 = p * kc, k1 = min(K, k0 + kc);
    __global float* out = part + p * N;
    __global const float* a = A + a_off;
    const int N8 = N & ~7;
    for (int n = 0; n < N; n++) out[n] = 0.0f;
    int k = k0;
    for (; k + 4 <= k1; k += 4) {
        const float a0 = MASKED(a[k], k), a1 = MASKED(a[k + 1], k + 1);
        const float a2 = MASKED(a[k + 2], k + 2), a3 = MASKED(a[k + 3], k + 3);
        __global const float* b0 = B + b_off + k * b_rs;
        __global const float* b1 = b0 + b_rs;
        __global const float* b2 = b1 + b_rs;
        __global const float* b3 = b2 + b_rs;
        for (int n = 0; n < N8; n += 8) {
            const float8 v = (a0 * vload8(0, b0 + n) + a1 * vload8(0, b1 + n))
                           + (a2 * vload8(0, b2 + n) + a3 * vload8(0, b3 + n));
            vstore8(vload8(0, out + n) + v, 0, out + n);
        }
        for (int n = N8; n < N; n++) out[n] += (a0 * b0[n] + a1 * b1[n]) + (a2 * b2[n] + a3 * b3[n]);
    }
    for (; k < k1; k++) {
        const float ak = MASKED(a[k], k);
        __global const float* bk = B + b_off + k * b_rs;
        for (int n = 0; n < N; n++) out[n] += ak * bk[n];
    }
}

__kernel void gemv_sum(const int N, const int P, const float alpha, const float beta,
                       __global const float* restrict part, OFFSET_PARAM(part), __global float* C, OFFSET_PARAM(C),
                       const int c_off, __global const float* restrict bias, OFFSET_PARAM(bias), const int bias_mode,
                       const int relu) {
    AT_OFFSET(__global const float*, part) AT_OFFSET(__global float*, C) AT_OFFSET(__global const float*, bias)
    const int n = get_global_id(0);
    if (n >= N) return;
    float s = 0.0f;
    for (int p = 0; p < P; p++) s += part[p * N + n];
    C[c_off + n] = gemm_epilogue(s, alpha, beta, C + c_off, n, bias, bias_mode, 0, n, relu);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void rank1_rows(const int M, const int N, const float alpha, const float beta, __global const float* restrict A,
                OFFSET_PARAM(A), const int a_off, const int a_rs, __global const float* restrict B, OFFSET_PARAM(B),
                const int b_off, __global float* C, OFFSET_PARAM(C), const int c_off, const int c_rs,
                __global const float* restrict bias, OFFSET_PARAM(bias), const int bias_mode, const int relu,
                __global float* restrict D, OFFSET_PARAM(D), const int d_add, __global const float* restrict amask,
                OFFSET_PARAM(amask)) {
    AT_OFFSET(__global const float*, A) AT_OFFSET(__global const float*, B) AT_OFFSET(__global float*, C)
    AT_OFFSET(__global const float*, bias) AT_OFFSET(__global float*, D) AT_OFFSET(__global const float*, amask)
    const int m = get_global_id(0);
    if (m >= M) return;
    const float a = MASKED(A[a_off + m * a_rs], m);
    __global const float* b = B + b_off;
    __global float* c = C + c_off + m * c_rs;
    const int N8 = N & ~7;
    if (bias_mode == 0 && !relu) {  // the weight gradient: the epilogue's arithmetic, eight at a time
        for (int n = 0; n < N8; n += 8) {
            float8 v = alpha * (a * vload8(0, b + n));
            if (beta != 0.0f) v += beta * vload8(0, c + n);
            vstore8(v, 0, c + n);
        }
        for (int n = N8; n < N; n++) c[n] = gemm_epilogue(a * b[n], alpha, beta, c, n, bias, 0, m, n, 0);
    } else {
        for (int n = 0; n < N; n++) c[n] = gemm_epilogue(a * b[n], alpha, beta, c, n, bias, bias_mode, m, n, relu);
    }
#if ROWSUM
    D[m] = d_add ? D[m] + alpha * a : alpha * a;
#endif
}
