// What every matrix-product kernel shares (gemm.cl for GPUs, gemm_cpu.cl for CPUs):
//   C[b](m, n) = act(alpha * sum_k A[b](m, k) * B[b](k, n) + beta * C[b](m, n) + bias)
// Each operand X in {A, B, C} is addressed through strides, so transposes and NCHW views need no copies:
//   X[b](r, c) = X[x_off + b*x_bs + r*x_rs + (c % x_cdiv)*x_cs + (c / x_cdiv)*x_cso]
// The column split (cdiv, cso) lets a column index run over (image, pixel) pairs of an NCHW tensor; it is compiled
// in only where needed (A_SPLIT, B_SPLIT, C_SPLIT). B_KSPLIT (gemm_tiled only) makes B's split cut its rows instead,
// B[b](k, n) = B[b_off + b*b_bs + (k % b_cdiv)*b_rs + (k / b_cdiv)*b_cso + n*b_cs]: k over (image, pixel), as x^T is
// in a 1x1 convolution's weight gradient. beta == 0 never reads C, so C may hold garbage.
// Split-K: with ksplit > 1 the third global index z runs over batch * ksplit; slice s = z % ksplit sums k in
// [s*kc, s*kc + kc) and writes its partial product to C[z] (plain, alpha 1, beta 0, no epilogue: the host passes a
// scratch buffer), then gemm_reduce (gemm.cl) sums the slices in a fixed order and applies the real epilogue. This
// keeps products with a small M x N and a huge K (convolution weight gradients) both parallel and accurate.
//
// The epilogue is chosen at run time by two arguments, not by defines: bias_mode (0 none, 1 one value per row m, 2 one
// value per column n; the bias pointer advanced by b*bias_bs) and relu (0/1: ReLU last, NaN kept). Both are the same
// for every work-item and are read once per output after the k loop, so a bias or ReLU costs no program of its own
// (one program serves a layer's forward with them and its gradients without; a split-K slice and the plain product).
// Where EPILOGUE_BIAS and EPILOGUE_RELU are defined (GPUs: clnet/tuning.py EPILOGUE_AT_BUILD), they fix the two at
// build time and the arguments go unread: on the H200 the run-time form took SGEMM at 1024 from 0.072 to 0.088 ms.
// Defines:
//   A_SPLIT, B_SPLIT, C_SPLIT  0/1: column split in use for that operand
//   B_KSPLIT   0/1: B's split cuts its rows (k), not its columns (not with B_SPLIT)
//   EPILOGUE_BIAS, EPILOGUE_RELU  (optional, both or neither) the epilogue's bias mode and ReLU fixed at build time
#ifndef CLNET_GEMM_COMMON_H
#define CLNET_GEMM_COMMON_H
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
#ifndef B_KSPLIT
#define B_KSPLIT 0  // row split on B
#endif
#if B_KSPLIT && B_SPLIT
#error "B's split cuts its rows or its columns, not both"
#endif
#ifdef EPILOGUE_BIAS
#ifndef EPILOGUE_RELU
#error "EPILOGUE_BIAS needs EPILOGUE_RELU"
#endif
#if EPILOGUE_BIAS < 0 || EPILOGUE_BIAS > 2
#error "EPILOGUE_BIAS must be 0, 1 or 2"
#endif
#define EPI_BIAS(run_time) EPILOGUE_BIAS
#define EPI_RELU(run_time) EPILOGUE_RELU
#else
#define EPI_BIAS(run_time) (run_time)
#define EPI_RELU(run_time) (run_time)
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
#if B_KSPLIT
#define B_ROW(k) (((k) % b_cdiv) * b_rs + ((k) / b_cdiv) * b_cso)
#else
#define B_ROW(k) ((k) * b_rs)
#endif
#if C_SPLIT
#define C_COL(c) (((c) % c_cdiv) * c_cs + ((c) / c_cdiv) * c_cso)
#else
#define C_COL(c) ((c) * c_cs)
#endif

#define GEMM_ARGS \
    const int M, const int N, const int K, const float alpha, const float beta, \
    __global const float* restrict A, OFFSET_PARAM(A), const int a_off, const int a_bs, const int a_rs, \
    const int a_cs, const int a_cdiv, const int a_cso, \
    __global const float* restrict B, OFFSET_PARAM(B), const int b_off, const int b_bs, const int b_rs, \
    const int b_cs, const int b_cdiv, const int b_cso, \
    __global float* C, OFFSET_PARAM(C), const int c_off, const int c_bs, const int c_rs, const int c_cs, \
    const int c_cdiv, const int c_cso, \
    __global const float* restrict bias, OFFSET_PARAM(bias), const int bias_bs, const int bias_mode, const int relu, \
    const int ksplit, const int kc
// The opening statement of a kernel taking GEMM_ARGS: its pointers moved to their byte offsets (common.h)
#define GEMM_AT_OFFSETS \
    AT_OFFSET(__global const float*, A) AT_OFFSET(__global const float*, B) AT_OFFSET(__global float*, C) \
    AT_OFFSET(__global const float*, bias)

// One output: alpha * acc + beta * C + the bias of its row m or column n, then the ReLU (gemv.cl and gemv_cpu.cl
// apply it too).
inline float gemm_epilogue(float acc, const float alpha, const float beta, __global const float* C, const int c_idx,
                           __global const float* restrict bias, const int bias_mode, const int m, const int n,
                           const int relu) {
    float v = alpha * acc;
    if (beta != 0.0f) v += beta * C[c_idx];
    if (EPI_BIAS(bias_mode)) v += bias[EPI_BIAS(bias_mode) == 1 ? m : n];
    if (EPI_RELU(relu)) v = v < 0.0f ? 0.0f : v;  // not fmax: NaN stays NaN, as in PyTorch's ReLU
    return v;
}

#endif
