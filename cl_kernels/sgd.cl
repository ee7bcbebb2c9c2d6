// Stochastic gradient descent with PyTorch's semantics (dampening 0):
//   d = g + weight_decay * p;  buf = momentum * buf + d;  d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// One launch for all parameters: they lie in one flat buffer (optim.py). The momentum buffer starts at zero, which
// makes the first step's buf = d, as in PyTorch.
// VW elements per work-item (common.h). Defines: MOMENTUM 0/1 (whether buf exists), NESTEROV 0/1.
#ifndef MOMENTUM
#define MOMENTUM 1  // keep a momentum buffer
#endif
#ifndef NESTEROV
#define NESTEROV 0  // Nesterov momentum
#endif

#include "common.h"

// One update of VW elements (float4) or of one (float): the same expressions for both.
#define SGD_UPDATE(T, P, G, BUF)                                     \
    {                                                                \
        const T w = P;                                               \
        T d = (G) + weight_decay * w;                                \
        SGD_MOMENTUM(T, BUF)                                         \
        P = w - lr * d;                                              \
    }
#if MOMENTUM && NESTEROV
#define SGD_MOMENTUM(T, BUF) { const T b = momentum * (BUF) + d; BUF = b; d = d + momentum * b; }
#elif MOMENTUM
#define SGD_MOMENTUM(T, BUF) { const T b = momentum * (BUF) + d; BUF = b; d = b; }
#else
#define SGD_MOMENTUM(T, BUF)
#endif

__kernel void sgd_step(__global float* restrict p, __global const float* restrict g, __global float* restrict buf,
                       const int n, const float lr, const float momentum, const float weight_decay) {
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        SGD_UPDATE(float4, VEC(p + i), CVEC(g + i), VEC(buf + i))
    } else {
        for (int j = i; j < n; j++) SGD_UPDATE(float, p[j], g[j], buf[j])
    }
}
