// Products with one row of C or a depth of one: a dense layer at batch 1, where a tiled product (gemm.cl,
// gemm_cpu.cl) computes a whole tile to keep one row of it, and split-K adds a second launch.
//   gemv        C(0, n) = epilogue(alpha * sum_k A(0, k) B(k, n))   (M == 1: the layer's output, its input gradient)
//   gemm_rank1  C(m, n) = epilogue(alpha * A(m, 0) B(0, n))         (K == 1: its weight gradient; beta 0 or 1)
//               with ROWSUM, also D(m) (+)= alpha * A(m, 0): A's sum over its one column (the bias gradient), added
//               to D when d_add, else written
//   gemv_rank1  the layer's whole batch-1 backward in one launch: gemv's C(0, n) = sum_k A(0, k) B(k, n) (its input
//               gradient, B the weight) and, at each (k, n) of B it reads, W(k, n) = A(0, k) X(n) (+ W(k, n) when
//               w_beta is 1): gemm_rank1's product of A's one row as a column with X (its weight gradient, W laid
//               out as B), with ROWSUM its bias gradient D(k). Every (k, n) is visited by one work-item, once.
// One product (batch 1), operands without column splits; addressing and epilogue as gemm_common.h (the host passes
// each operand's offset and the strides it uses).
//
// gemv: a work-group of LN x LK work-items computes LN outputs. Work-item (i, j) sums k = j, j + LK, j + 2 LK, ...
// in stages of KS terms, each stage's sum started from zero and then added to the total (a two-level sum, as
// gemm_block's: its float32 error grows with KS + K / (KS LK) terms, not K). The LK totals of each output are then
// added in a fixed tree order, so results repeat bit for bit (LK == 1: no local memory and no barrier). The host
// picks LN and LK so that consecutive work-items read consecutive addresses of B: LK across k where B's k stride is
// 1, LN across n where its n stride is 1 (tuning.gemv_shape). GPUs only: on PoCL one output per work-item streamed a
// 2048 x 2048 weight 3-6x slower than gemm_block; CPUs run gemv_cpu.cl.
//
// Defines (besides gemv_common.h's ROWSUM and A_MASK):
//   LN  outputs per work-group (a power of two)
//   LK  work-items per output, along k (a power of two; LN * LK <= 256)
//   KS  terms per stage of a work-item's sum
#include "gemv_common.h"

#ifndef LN
#define LN 4        // outputs per work-group
#endif
#ifndef LK
#define LK 64       // work-items per output
#endif
#ifndef KS
#define KS 64       // terms per stage
#endif

#if (LN & (LN - 1)) || (LK & (LK - 1)) || LN * LK > 256
#error "LN and LK must be powers of two with LN * LK <= 256"
#endif

#if LK > 1
// The LK partial sums of each of a work-group's LN outputs (work-item (i, j) holds output i's j-th), added in a fixed
// tree order, so results repeat bit for bit; every work-item gets its output's total. part: LK * LN floats, [j][i].
inline float group_total(const float total, __local float* part, const int i, const int j) {
    part[j * LN + i] = total;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = LK / 2; h > 0; h >>= 1) {
        if (j < h) part[j * LN + i] += part[(j + h) * LN + i];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[i];
}
#endif

__kernel __attribute__((reqd_work_group_size(LN, LK, 1)))
void gemv(const int N, const int K, const float alpha, const float beta, __global const float* restrict A,
          OFFSET_PARAM(A), const int a_off, const int a_cs, __global const float* restrict B, OFFSET_PARAM(B),
          const int b_off, const int b_rs, const int b_cs, __global float* C, OFFSET_PARAM(C), const int c_off,
          const int c_cs, __global const float* restrict bias, OFFSET_PARAM(bias), const int bias_mode, const int relu,
          __global const float* restrict amask, OFFSET_PARAM(amask)) {
    AT_OFFSET(__global const float*, A) AT_OFFSET(__global const float*, B) AT_OFFSET(__global float*, C)
    AT_OFFSET(__global const float*, bias) AT_OFFSET(__global const float*, amask)
    const int i = get_local_id(0), j = get_local_id(1);
    const int n = get_group_id(0) * LN + i;
    float total = 0.0f;
    if (n < N) {
        __global const float* a = A + a_off;
        __global const float* b = B + b_off + n * b_cs;
        for (int k0 = j; k0 < K; k0 += KS * LK) {
            const int end = min(K, k0 + KS * LK);
            float stage = 0.0f;
            for (int k = k0; k < end; k += LK) stage += MASKED(a[k * a_cs], k) * b[k * b_rs];
            total += stage;
        }
    }
#if LK > 1
    __local float part[LK * LN];
    total = group_total(total, part, i, j);
#endif
    if (j == 0 && n < N) {
        C[c_off + n * c_cs] = gemm_epilogue(total, alpha, beta, C + c_off, n * c_cs, bias, bias_mode, 0, n, relu);
    }
}

__kernel void gemm_rank1(const int M, const int N, const float alpha, const float beta,
                         __global const float* restrict A, OFFSET_PARAM(A), const int a_off, const int a_rs,
                         __global const float* restrict B, OFFSET_PARAM(B), const int b_off, const int b_cs,
                         __global float* C, OFFSET_PARAM(C), const int c_off, const int c_rs, const int c_cs,
                         __global const float* restrict bias, OFFSET_PARAM(bias), const int bias_mode, const int relu,
                         __global float* restrict D, OFFSET_PARAM(D), const int d_add,
                         __global const float* restrict amask, OFFSET_PARAM(amask)) {
    AT_OFFSET(__global const float*, A) AT_OFFSET(__global const float*, B) AT_OFFSET(__global float*, C)
    AT_OFFSET(__global const float*, bias) AT_OFFSET(__global float*, D) AT_OFFSET(__global const float*, amask)
    const int n = get_global_id(0), m = get_global_id(1);
    if (n >= N || m >= M) return;
    const int ci = m * c_rs + n * c_cs;
    const float a = MASKED(A[a_off + m * a_rs], m);
    C[c_off + ci] = gemm_epilogue(a * B[b_off + n * b_cs], alpha, beta, C + c_off, ci, bias, bias_mode, m, n,
                                  relu);
#if ROWSUM
    if (n == 0) D[m] = d_add ? D[m] + alpha * a : alpha * a;
#endif
}

__kernel __attribute__((reqd_work_group_size(LN, LK, 1)))
void gemv_rank1(const int N, const int K, __global const float* restrict A, OFFSET_PARAM(A), const int a_off,
                const int a_cs, __global const float* restrict B, OFFSET_PARAM(B), const int b_off, const int b_rs,
                const int b_cs, __global float* restrict C, OFFSET_PARAM(C), const int c_off, const int c_cs,
                __global const float* restrict X, OFFSET_PARAM(X), const int x_off, const int x_cs,
                __global float* restrict W, OFFSET_PARAM(W), const int w_off, const float w_beta,
                __global float* restrict D, OFFSET_PARAM(D), const int d_add, __global const float* restrict amask,
                OFFSET_PARAM(amask)) {
    AT_OFFSET(__global const float*, A) AT_OFFSET(__global const float*, B) AT_OFFSET(__global float*, C)
    AT_OFFSET(__global const float*, X) AT_OFFSET(__global float*, W) AT_OFFSET(__global float*, D)
    AT_OFFSET(__global const float*, amask)
    const int i = get_local_id(0), j = get_local_id(1);
    const int n = get_group_id(0) * LN + i;
    float total = 0.0f;
    if (n < N) {
        __global const float* a = A + a_off;
        __global const float* b = B + b_off + n * b_cs;
        __global float* w = W + w_off + n * b_cs;
        const float xn = X[x_off + n * x_cs];
        for (int k0 = j; k0 < K; k0 += KS * LK) {
            const int end = min(K, k0 + KS * LK);
            float stage = 0.0f;
            for (int k = k0; k < end; k += LK) {
                const float ak = MASKED(a[k * a_cs], k);
                stage += ak * b[k * b_rs];
                w[k * b_rs] = gemm_epilogue(ak * xn, 1.0f, w_beta, w, k * b_rs, C, 0, 0, 0, 0);
#if ROWSUM
                if (n == 0) D[k] = d_add ? D[k] + ak : ak;
#endif
            }
            total += stage;
        }
    }
#if LK > 1
    __local float part[LK * LN];
    total = group_total(total, part, i, j);
#endif
    if (j == 0 && n < N) C[c_off + n * c_cs] = total;
}
