// Adam and AdamW with PyTorch's update (torch.optim.Adam / AdamW, amsgrad off), for every parameter in one launch
// (they lie in one flat buffer, optim.py):
//   AdamW only: p *= 1 - lr * weight_decay;  Adam only: g += weight_decay * p
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
//   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps),  step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t)
// The bias corrections depend on the step count t, which the host keeps. m and v start at zero, as in PyTorch.
// Defines: DECOUPLED 0/1 (AdamW's weight decay).
#ifndef DECOUPLED
#define DECOUPLED 0  // 1: AdamW (decay applied to p), 0: Adam (decay added to the gradient)
#endif

__kernel void adam_step(__global float* restrict p, __global const float* restrict g, __global float* restrict m,
                        __global float* restrict v, const int n, const float lr, const float step_size,
                        const float bc2_sqrt, const float b1, const float b2, const float eps,
                        const float weight_decay) {
    const int i = get_global_id(0);
    if (i >= n) return;
    float w = p[i], d = g[i];
#if DECOUPLED
    w *= 1.0f - lr * weight_decay;
#else
    d += weight_decay * w;
#endif
    const float mi = b1 * m[i] + (1.0f - b1) * d;
    const float vi = b2 * v[i] + (1.0f - b2) * d * d;
    m[i] = mi;
    v[i] = vi;
    p[i] = w - step_size * mi / (sqrt(vi) / bc2_sqrt + eps);
}
