// RMSprop with PyTorch's update (torch.optim.RMSprop), for one parameter group in one launch (its parameters lie in
// one region of the optimizer's flat buffers, optim.py):
//   d = g + weight_decay * p;  sq = alpha * sq + (1 - alpha) * d^2
//   centered: ga = ga + (1 - alpha) * (d - ga);  avg = sqrt(sq - ga^2) + eps   (else avg = sqrt(sq) + eps)
//   momentum: buf = momentum * buf + d / avg;  p -= lr * buf                    (else p -= lr * d / avg)
// sq - ga^2 is a variance, >= 0 in exact arithmetic; float32 rounding can take it just below 0, where the square
// root would be NaN: it is clamped at 0. The states start at zero, as in PyTorch.
// VW elements per work-item (common.h). Defines: MOMENTUM 0/1 (whether buf exists), CENTERED 0/1 (whether ga does).
#ifndef MOMENTUM
#define MOMENTUM 0  // keep a momentum buffer
#endif
#ifndef CENTERED
#define CENTERED 0  // keep the running mean of the gradients and divide by the running standard deviation
#endif

#include "common.h"

#if CENTERED
#define RMS_AVG(T, SQ, GA) { const T a = (GA) + (1.0f - alpha) * (d - (GA)); GA = a; \
                             avg = sqrt(fmax((SQ) - a * a, 0.0f)) + eps; }
#else
#define RMS_AVG(T, SQ, GA) { avg = sqrt(SQ) + eps; }
#endif
#if MOMENTUM
#define RMS_STEP(T, BUF) { const T b = momentum * (BUF) + d / avg; BUF = b; w = w - lr * b; }
#else
#define RMS_STEP(T, BUF) { w = w - lr * (d / avg); }
#endif

// One update of VW elements (float4) or of one (float): the same expressions for both.
#define RMS_UPDATE(T, P, G, SQ, BUF, GA)                             \
    {                                                                \
        T w = P;                                                     \
        const T d = (G) + weight_decay * w;                          \
        const T s = alpha * (SQ) + (1.0f - alpha) * d * d;           \
        SQ = s;                                                      \
        T avg;                                                       \
        RMS_AVG(T, s, GA)                                            \
        RMS_STEP(T, BUF)                                             \
        P = w;                                                       \
    }

__kernel void rmsprop_step(__global float* restrict p, OFFSET_PARAM(p), __global const float* restrict g,
                           OFFSET_PARAM(g), __global float* restrict sq, OFFSET_PARAM(sq), __global float* restrict buf,
                           OFFSET_PARAM(buf), __global float* restrict ga, OFFSET_PARAM(ga), const int n,
                           const float lr, const float alpha, const float eps, const float weight_decay,
                           const float momentum) {
    AT_OFFSET(__global float*, p) AT_OFFSET(__global const float*, g) AT_OFFSET(__global float*, sq)
    AT_OFFSET(__global float*, buf) AT_OFFSET(__global float*, ga)
    const int i = get_global_id(0) * VW;
    if (i + VW <= n) {
        RMS_UPDATE(float4, VEC(p + i), CVEC(g + i), VEC(sq + i), VEC(buf + i), VEC(ga + i))
    } else {
        for (int j = i; j < n; j++) RMS_UPDATE(float, p[j], g[j], sq[j], buf[j], ga[j])
    }
}
