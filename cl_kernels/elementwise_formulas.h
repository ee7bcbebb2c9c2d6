// The formulas of elementwise.cl's flat kernels that a fused chain (chain.cl) runs as steps: an activation and its
// gradient from the saved output (kind: clnet/elementwise.py ACTIVATIONS, 1 ReLU, 2 Sigmoid, 3 Tanh, 4 ReLU6), and
// axpby's and affine's products. elementwise.cl passes its compile-time ACT as the kind (the switch folds away),
// chain.cl a run-time one, so both compute every value from the same text. No defines.
#ifndef CLNET_ELEMENTWISE_FORMULAS_H
#define CLNET_ELEMENTWISE_FORMULAS_H

inline float act_of(const int kind, const float v) {
    switch (kind) {
        case 1: return v < 0.0f ? 0.0f : v;
        case 2: return 1.0f / (1.0f + exp(-v));
        case 3: return tanh(v);
        case 4: return v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v);
        default: return NAN;
    }
}

// The gradient from the saved output y and the upstream gradient g.
inline float act_grad_of(const int kind, const float y, const float g) {
    switch (kind) {
        case 1: return y <= 0.0f ? 0.0f : g;
        case 2: return g * y * (1.0f - y);
        case 3: return g * (1.0f - y * y);
        case 4: return y <= 0.0f || y >= 6.0f ? 0.0f : g;
        default: return NAN;
    }
}

// One expression each, as axpby's float4 path writes it, so a compiler contracts both alike
inline float axpby_of(const float alpha, const float a, const float beta, const float b) {
    return alpha * a + beta * b;
}

inline float affine_of(const float alpha, const float x, const float beta) { return alpha * x + beta; }

#endif
