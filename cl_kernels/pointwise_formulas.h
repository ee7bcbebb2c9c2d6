// The unary formulas of the pointwise family (clnet/pointwise.py UNARY): uf(op, x, p0, p1) = F(x) and
// ug(op, x, g, p0, p1) = g * F'(x), selected by the op number at run time. Included by pointwise.cl (one launch an
// op) and chain.cl (a fused chain of them), so both compute every value from the same text. No defines.
#ifndef CLNET_POINTWISE_FORMULAS_H
#define CLNET_POINTWISE_FORMULAS_H

#define SQRT1_2 0.70710678118654752f
#define SQRT2_PI 0.79788456080286536f   // sqrt(2 / pi)
#define INV_SQRT_2PI 0.39894228040143268f

inline float softplus_f(const float x, const float beta, const float threshold) {
    const float bx = beta * x;
    return bx > threshold ? x : log1p(exp(bx)) / beta;
}

inline float sigm(const float x) { return 1.0f / (1.0f + exp(-x)); }
// The tanh GELU, x (1 + tanh u) / 2 with u = sqrt(2/pi) (x + 0.044715 x^3), as x sigmoid(2u), and tanh's
// derivative sech^2 u from exp(-2|u|): 1 + tanh u and 1 - tanh^2 u cancel where tanh saturates, and a tanh an ulp
// short of -1 there (PoCL's) gave -2.4e-6 for -0 at x = -80, and -3e-3 for its gradient of 0
inline float gelu_u(const float x) { return SQRT2_PI * (x + 0.044715f * x * x * x); }
inline float gelu_half(const float x) { return 1.0f / (1.0f + exp(-2.0f * gelu_u(x))); }  // (1 + tanh u) / 2
inline float gelu_sech2(const float x) {
    const float e = exp(-2.0f * fabs(gelu_u(x)));
    return 4.0f * e / ((1.0f + e) * (1.0f + e));
}
inline float mish_t(const float x) { return tanh(softplus_f(x, 1.0f, 20.0f)); }
#define SELU_A 1.6732632423543772f
#define SELU_S 1.0507009873554805f

// ---- unary formulas: the op number `op` (clnet/pointwise.py UNARY), a run-time switch the whole launch takes
// alike, so one build serves every op of a type combination
inline float uf(const int op, const float x, const float p0, const float p1) {
    switch (op) {
        case 1: return (-x);                                                        // neg
        case 2: return exp(x);                                                      // exp
        case 3: return log(x);                                                      // log
        case 4: return log1p(x);                                                    // log1p
        case 5: return sqrt(x);                                                     // sqrt
        case 6: return rsqrt(x);                                                    // rsqrt
        case 7: return fabs(x);  // abs (gradient 0 at 0, as PyTorch's sign)
        case 8: return (x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f));               // sign (gradient 0)
        case 9: return erf(x);                                                      // erf
        case 10: return sin(x);                                                     // sin
        case 11: return cos(x);                                                     // cos
        case 12: return tanh(x);                                                    // tanh
        case 13: return sigm(x);                                                    // sigmoid
        case 14: return (x < 0.0f ? 0.0f : x);                                      // relu (NaN passes, as PyTorch)
        case 15: return (0.5f * x * (1.0f + erf(x * SQRT1_2)));                     // gelu, exact: x * Phix
        case 16: return (x * gelu_half(x));                                         // gelu, approximate="tanh"
        case 17: return (x * sigm(x));                                              // silu: x * sigmoidx
        case 18: return (x * mish_t(x));                                            // mish: x * tanh(softplusx)
        case 19: return (x * clamp(x + 3.0f, 0.0f, 6.0f) / 6.0f);  // hardswish (NaN * 0 stays NaN)
        case 20: return (isnan(x) ? x : clamp(x + 3.0f, 0.0f, 6.0f) / 6.0f);        // hardsigmoid: relu6(x + 3) / 6
        case 21: return (x > 0.0f ? x : x * p0);                                    // leaky_relu, slope p0
        case 22: return (x > 0.0f ? x : p0 * (exp(x) - 1.0f));                      // elu, alpha p0
        case 23: return softplus_f(x, p0, p1);                                      // softplus, beta p0, threshold p1
        case 24: return (isnan(x) ? x : fmin(fmax(x, p0), p1));  // clamp to [p0, p1] (fmin, fmax drop a NaN)
        case 25: return (p0 == 2.0f ? x * x : pow(x, p0));                          // x ** p0
        case 26: return pow(p0, x);                                                 // p0 ** x
        case 27: return (p0 / x);                                                   // p0 / x
        case 28: return (SELU_S * (x > 0.0f ? x : SELU_A * (exp(x) - 1.0f)));       // selu
        case 29: return (x > 0.0f ? x : p0 * (exp(x / p0) - 1.0f));                 // celu, alpha p0
        case 30: return (x < 0.0f ? 0.0f : (x > 6.0f ? 6.0f : x));                  // relu6
        case 31: return floor(x);                                                   // floor (gradient 0)
        case 32: return ceil(x);                                                    // ceil (gradient 0)
        case 33: return rint(x);  // round half to even, as PyTorch (gradient 0)
        case 34: return (1.0f / x);                                                 // reciprocal
        case 35: return (x == 0);                                                   // logical not (uchar in and out)
        case 36: return (isnan(x) ? x : fmin(fmax(x, p0), p1));                      // hardtanh to [p0, p1]
        default: return NAN;
    }
}

// g * f'(x)
inline float ug(const int op, const float x, const float g, const float p0, const float p1) {
    switch (op) {
        case 1: return (-g);
        case 2: return (g * exp(x));
        case 3: return (g / x);
        case 4: return (g / (1.0f + x));
        case 5: return (g * 0.5f / sqrt(x));
        case 6: return (g * -0.5f * rsqrt(x) / x);
        case 7: return (x > 0.0f ? g : (x < 0.0f ? -g : 0.0f));
        case 8: return 0.0f;
        case 9: return (g * 1.12837916709551257f * exp(-x * x));
        case 10: return (g * cos(x));
        case 11: return (-g * sin(x));
        case 12: return (g * (1.0f - tanh(x) * tanh(x)));
        case 13: return (g * sigm(x) * (1.0f - sigm(x)));
        case 14: return (x <= 0.0f ? 0.0f : g);
        case 15: return (g * (0.5f * (1.0f + erf(x * SQRT1_2)) + x * INV_SQRT_2PI * exp(-0.5f * x * x)));
        case 16: return (g * (gelu_half(x) + 0.5f * x * gelu_sech2(x) * SQRT2_PI *
                           (1.0f + 3.0f * 0.044715f * x * x)));
        case 17: return (g * sigm(x) * (1.0f + x * (1.0f - sigm(x))));
        case 18: return (g * (mish_t(x) + x * sigm(x) * (1.0f - mish_t(x) * mish_t(x))));
        case 19: return (x <= -3.0f ? 0.0f : (x < 3.0f ? g * (x / 3.0f + 0.5f) : g));  // PyTorch's: 0 at -3, 1 at 3
        case 20: return (x > -3.0f && x < 3.0f ? g / 6.0f : 0.0f);
        case 21: return (x > 0.0f ? g : g * p0);
        case 22: return (x > 0.0f ? g : g * p0 * exp(x));
        case 23: return (p0 * x > p1 ? g : g / (1.0f + exp(-p0 * x)));
        case 24: return (x >= p0 && x <= p1 ? g : 0.0f);
        case 25: return (p0 == 0.0f ? 0.0f : g * p0 * (p0 == 2.0f ? x : pow(x, p0 - 1.0f)));
        case 26: return (g * pow(p0, x) * log(p0));
        case 27: return (-g * p0 / (x * x));
        case 28: return (g * SELU_S * (x > 0.0f ? 1.0f : SELU_A * exp(x)));
        case 29: return (x > 0.0f ? g : g * exp(x / p0));
        case 30: return (x <= 0.0f || x >= 6.0f ? 0.0f : g);
        case 31: return 0.0f;
        case 32: return 0.0f;
        case 33: return 0.0f;
        case 34: return (-g / (x * x));
        case 35: return 0.0f;
        case 36: return (x <= p0 || x >= p1 ? 0.0f : g);  // PyTorch's hardtanh: 0 at the bounds (clamp's: g)
        default: return NAN;
    }
}

#endif
