// Adam and AdamW with PyTorch's update (torch.optim.Adam / AdamW, amsgrad off), for every parameter in one launch
// (they lie in one flat buffer, optim.py):
//   AdamW only: p *= 1 - lr * weight_decay;  Adam only: g += weight_decay * p
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
//   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps),  step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t)
// The bias corrections depend on the step count t, which the host keeps. m and v start at zero, as in PyTorch.
// VW elements per work-item (common.h). Defines: DECOUPLED 0/1 (AdamW's weight decay).
#ifndef DECOUPLED
#define DECOUPLED 0  // 1: AdamW (decay applied to p), 0: Adam (decay added to the gradient)
#endif

#include "common.h"

// One update of VW elements (float4) or of one (float): the same expressions for both.
#if DECOUPLED
#define ADAM_DECAY(w, d) w *= 1.0f - lr * weight_decay;
#else
#define ADAM_DECAY(w, d) d += weight_decay * w;
#endif
#define ADAM_UPDATE(T, P, G, M, V)                                    \
    {                                                                 \
        T w = P, d = G;                                               \
        ADAM_DECAY(w, d)                                              \
        const T mi = b1 * (M) + (1.0f - b1) * d;                      \
        const T vi = b2 * (V) + (1.0f - b2) * d * d;                  \
        M = mi;                                                       \
        V = vi;                                                       \
        P = w - step_size * mi / (sqrt(vi) / bc2_sqrt + eps);         \
    }

__kernel void adam_step(__global float* restrict p, OFFSET_PARAM(p), __global const float* restrict g, OFFSET_PARAM(g),
                        __global float* restrict m, OFFSET_PARAM(m), __global float* restrict v, OFFSET_PARAM(v),
                        const int n, const float lr, const float step_size, const float bc2_sqrt, const float b1,
                        const float b2, const float eps, const float weight_decay) {
    AT_OFFSET(__global float*, p) AT_OFFSET(__global const float*, g) AT_OFFSET(__global float*, m)
    AT_OFFSET(__global float*, v)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        ADAM_UPDATE(float4, VEC(p + i), CVEC(g + i), VEC(m + i), VEC(v + i))
    } else {
        for (int j = i; j < n; j++) ADAM_UPDATE(float, p[j], g[j], m[j], v[j])
    }
}
