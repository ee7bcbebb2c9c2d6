// Stochastic gradient descent with PyTorch's semantics (dampening 0):
//   d = g + weight_decay * p;  buf = momentum * buf + d;  d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// One launch for all parameters: they lie in one flat buffer (optim.py). The momentum buffer starts at zero, which
// makes the first step's buf = d, as in PyTorch.
// Defines: MOMENTUM 0/1 (whether buf exists), NESTEROV 0/1.
#ifndef MOMENTUM
#define MOMENTUM 1  // keep a momentum buffer
#endif
#ifndef NESTEROV
#define NESTEROV 0  // Nesterov momentum
#endif

__kernel void sgd_step(__global float* restrict p, __global const float* restrict g, __global float* restrict buf,
                       const int n, const float lr, const float momentum, const float weight_decay) {
    const int i = get_global_id(0);
    if (i >= n) return;
    float d = g[i] + weight_decay * p[i];
#if MOMENTUM
    const float b = momentum * buf[i] + d;
    buf[i] = b;
#if NESTEROV
    d = d + momentum * b;
#else
    d = b;
#endif
#endif
    p[i] -= lr * d;
}
