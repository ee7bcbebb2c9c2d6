// Stochastic gradient descent with PyTorch's semantics (dampening 0):
//   d = g + weight_decay * p;  buf = momentum * buf + d;  d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// One launch for all parameters: they lie in one flat buffer (optim.py). The momentum buffer starts at zero, which
// makes the first step's buf = d, as in PyTorch.
// VW elements per work-item (common.h). Defines: MOMENTUM 0/1 (whether buf exists), NESTEROV 0/1.
// Without MOMENTUM, buf is not read or written (the host passes another buffer, g or p).
#ifndef MOMENTUM
#define MOMENTUM 1  // keep a momentum buffer
#endif
#ifndef NESTEROV
#define NESTEROV 0  // Nesterov momentum
#endif

#include "common.h"

// One update: w, g, buf are values of type T (float4 or float); w and, with MOMENTUM, buf are updated in place.
#define SGD_UPDATE(T, w, g, buf)                                     \
    {                                                                \
        T d = (g) + weight_decay * (w);                              \
        SGD_MOMENTUM(T, buf)                                         \
        w = (w) - lr * d;                                            \
    }
#if MOMENTUM && NESTEROV
#define SGD_MOMENTUM(T, BUF) { const T next_buf = momentum * (BUF) + d; BUF = next_buf; d = d + momentum * next_buf; }
#elif MOMENTUM
#define SGD_MOMENTUM(T, BUF) { const T next_buf = momentum * (BUF) + d; BUF = next_buf; d = next_buf; }
#else
#define SGD_MOMENTUM(T, BUF)
#endif

__kernel void sgd_step(__global float* restrict p, OFFSET_PARAM(p), __global const float* restrict g, OFFSET_PARAM(g),
                       __global float* restrict buf, OFFSET_PARAM(buf), const int n, const float lr,
                       const float momentum, const float weight_decay) {
    AT_OFFSET(__global float*, p) AT_OFFSET(__global const float*, g) AT_OFFSET(__global float*, buf)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        float4 w = VEC(p + i), b = MOMENTUM ? VEC(buf + i) : (float4)(0.0f);
        SGD_UPDATE(float4, w, CVEC(g + i), b)
        VEC(p + i) = w;
        if (MOMENTUM) VEC(buf + i) = b;
    } else {
        for (int j = i; j < n; j++) {
            float w = p[j], b = MOMENTUM ? buf[j] : 0.0f;
            SGD_UPDATE(float, w, g[j], b)
            p[j] = w;
            if (MOMENTUM) buf[j] = b;
        }
    }
}

// The batch-1 weight gradient of a dense layer taken at once by this update (PyTorch's optimizer-in-backward pattern,
// clnet/optim.py): g(m, n) = alpha * (a(m) * x(n)), gemv_cpu.cl rank1_rows's arithmetic, is never stored; the weight
// p (M x N, rows contiguous) and its momentum buffer are read and written once. A row per work-item (CPUs).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void rank1_sgd_rows(const int M, const int N, const float alpha, __global const float* restrict A, OFFSET_PARAM(A),
                    const int a_off, const int a_rs, __global const float* restrict X, OFFSET_PARAM(X), const int x_off,
                    __global float* restrict p, OFFSET_PARAM(p), __global float* restrict buf, OFFSET_PARAM(buf),
                    const float lr, const float momentum, const float weight_decay) {
    AT_OFFSET(__global const float*, A) AT_OFFSET(__global const float*, X) AT_OFFSET(__global float*, p)
    AT_OFFSET(__global float*, buf)
    const int m = get_global_id(0);
    if (m >= M) return;
    const float a = A[a_off + m * a_rs];
    __global const float* x = X + x_off;
    __global float* w_row = p + m * N;
    __global float* b_row = buf + m * N;
    const int N8 = N & ~7;
    for (int n = 0; n < N8; n += 8) {
        float8 w = vload8(0, w_row + n), b = MOMENTUM ? vload8(0, b_row + n) : (float8)(0.0f);
        SGD_UPDATE(float8, w, alpha * (a * vload8(0, x + n)), b)
        vstore8(w, 0, w_row + n);
        if (MOMENTUM) vstore8(b, 0, b_row + n);
    }
    for (int n = N8; n < N; n++) {
        float w = w_row[n], b = MOMENTUM ? b_row[n] : 0.0f;
        SGD_UPDATE(float, w, alpha * (a * x[n]), b)
        w_row[n] = w;
        if (MOMENTUM) b_row[n] = b;
    }
}
