// The pointwise family (clnet/pointwise.py): every unary and binary element-wise op, its formula chosen by its op
// number, its operands read through strided.h layouts so that binary ops broadcast as NumPy and PyTorch do.
//   unary_fwd   y[i] = F(x[i]) for the unary op `op`, with its scalar parameters p0, p1 (a slope, bounds, an exponent)
//   unary_bwd   dx[i] = dy[i] * F'(x[i]) (from the saved input x; none of these needs the output)
//   binary_fwd  out[i] = G(a[off_a(i)], b[off_b(i)]) for the binary op `op`, i over the broadcast output shape
//   binary_bwd  da[i] = dy[i] * dG/da, db[i] = dy[i] * dG/db at the output shape (the caller sums each over the
//               dimensions its operand was broadcast along); either pointer may be unused (NEED_A, NEED_B)
//   where_fwd   out[i] = c[off_c(i)] ? a[off_a(i)] : b[off_b(i)]
//   where_bwd   da[i] = c ? dy[i] : 0, db[i] = c ? 0 : dy[i] at the output shape
// Layouts: meta (strided.h) holds the output's sizes, then the strides of each read operand (a, b; c, a, b for
// where); outputs and dy are contiguous at the output shape. Element types: TA, TB (operands), TO (output), TC (where's
// condition); a binary op computes in TW (the promoted type, as PyTorch promotes). Comparisons give uchar 0/1 (bool).
// The op is a run-time argument (the numbers of clnet/pointwise.py's tables): one build per type combination and
// rank serves every op. Defines: NDIM (strided.h), TA, TB, TO, TW, TC,
// TW_FLOAT (0/1: TW is float), NEED_A, NEED_B (0/1).
#include "common.h"
#include "strided.h"

#ifndef TA
#define TA float    // operand a's element type
#endif
#ifndef TB
#define TB float    // operand b's element type
#endif
#ifndef TO
#define TO float    // output's element type
#endif
#ifndef TW
#define TW float    // the type a binary op computes in
#endif
#ifndef TW_FLOAT
#define TW_FLOAT 1  // TW is float (else an integer type)
#endif
#ifndef TC
#define TC uchar    // where's condition type
#endif
#ifndef NEED_A
#define NEED_A 1    // binary_bwd writes da
#endif
#ifndef NEED_B
#define NEED_B 1    // binary_bwd writes db
#endif

#define SQRT1_2 0.70710678118654752f
#define SQRT2_PI 0.79788456080286536f   // sqrt(2 / pi)
#define INV_SQRT_2PI 0.39894228040143268f

inline float softplus_f(const float x, const float beta, const float threshold) {
    const float bx = beta * x;
    return bx > threshold ? x : log1p(exp(bx)) / beta;
}

inline float sigm(const float x) { return 1.0f / (1.0f + exp(-x)); }
inline float gelu_t(const float x) { return tanh(SQRT2_PI * (x + 0.044715f * x * x * x)); }
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
        case 16: return (0.5f * x * (1.0f + gelu_t(x)));                            // gelu, approximate="tanh"
        case 17: return (x * sigm(x));                                              // silu: x * sigmoidx
        case 18: return (x * mish_t(x));                                            // mish: x * tanh(softplusx)
        case 19: return (x * clamp(x + 3.0f, 0.0f, 6.0f) / 6.0f);  // hardswish (gradient PyTorch's: 0 below -3, 1 above 3)
        case 20: return (clamp(x + 3.0f, 0.0f, 6.0f) / 6.0f);                       // hardsigmoid: relu6(x + 3) / 6
        case 21: return (x > 0.0f ? x : x * p0);                                    // leaky_relu, slope p0
        case 22: return (x > 0.0f ? x : p0 * (exp(x) - 1.0f));                      // elu, alpha p0
        case 23: return softplus_f(x, p0, p1);                                      // softplus, beta p0, threshold p1
        case 24: return fmin(fmax(x, p0), p1);                                      // clamp to [p0, p1]
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
        case 16: return (g * (0.5f * (1.0f + gelu_t(x)) + 0.5f * x * (1.0f - gelu_t(x) * gelu_t(x)) * SQRT2_PI *
                           (1.0f + 3.0f * 0.044715f * x * x)));
        case 17: return (g * sigm(x) * (1.0f + x * (1.0f - sigm(x))));
        case 18: return (g * (mish_t(x) + x * sigm(x) * (1.0f - mish_t(x) * mish_t(x))));
        case 19: return (x < -3.0f ? 0.0f : (x <= 3.0f ? g * (x / 3.0f + 0.5f) : g));
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
        default: return NAN;
    }
}

__kernel void unary_fwd(__global const TA* restrict x, __global TO* restrict y, const int n, const int op,
                        const float p0, const float p1) {
    const int i = get_global_id(0);
    if (i < n) y[i] = (TO)uf(op, (float)x[i], p0, p1);
}

__kernel void unary_bwd(__global const float* restrict x, __global const float* restrict dy,
                        __global float* restrict dx, const int n, const int op, const float p0, const float p1) {
    const int i = get_global_id(0);
    if (i < n) dx[i] = ug(op, x[i], dy[i], p0, p1);
}

// ---- binary formulas (clnet/pointwise.py BINARY): bf in the working type TW; bda, bdb the gradients of a and b times
// g (float only). Comparisons and logical ops give 0 or 1.
inline TW floor_div(const TW a, const TW b);
inline TW py_rem(const TW a, const TW b);

inline TW bf(const int op, const TW a, const TW b) {
    switch (op) {
        case 1: return a + b;
        case 2: return a - b;
        case 3: return a * b;
        case 4: return a / b;
#if TW_FLOAT
        case 5: return pow(a, b);
#endif
        case 6: return a != a || a > b ? a : b;                                     // maximum: NaN propagates
        case 7: return a != a || a < b ? a : b;                                     // minimum
        case 8: return a < b;
        case 9: return a <= b;
        case 10: return a > b;
        case 11: return a >= b;
        case 12: return a == b;
        case 13: return a != b;
        case 14: return a != 0 && b != 0;
        case 15: return a != 0 || b != 0;
        case 16: return floor_div(a, b);
        case 17: return py_rem(a, b);
        default: return 0;
    }
}

inline float bda(const int op, const float a, const float b, const float g) {
    switch (op) {
        case 1: case 2: case 17: return g;
        case 3: return g * b;
        case 4: return g / b;
        case 5: return b == 0.0f ? 0.0f : g * b * pow(a, b - 1.0f);
        case 6: return a > b ? g : (a == b ? 0.5f * g : 0.0f);  // a tie splits the gradient, as PyTorch's
        case 7: return a < b ? g : (a == b ? 0.5f * g : 0.0f);
        default: return 0.0f;
    }
}

inline float bdb(const int op, const float a, const float b, const float g) {
    switch (op) {
        case 1: return g;
        case 2: return -g;
        case 3: return g * a;
        case 4: return -g * a / (b * b);
        case 5: return a == 0.0f && b >= 0.0f ? 0.0f : g * pow(a, b) * log(a);
        case 6: return b > a ? g : (a == b ? 0.5f * g : 0.0f);
        case 7: return b < a ? g : (a == b ? 0.5f * g : 0.0f);
        case 17: return -g * floor(a / b);
        default: return 0.0f;
    }
}

inline TW floor_div(const TW a, const TW b) {
#if TW_FLOAT
    return floor(a / b);
#else
    const TW q = a / b;
    return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
#endif
}

inline TW py_rem(const TW a, const TW b) {
#if TW_FLOAT
    const TW r = fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
#else
    const TW r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
#endif
}

__kernel void binary_fwd(__global const TA* restrict a, __global const TB* restrict b, __global TO* restrict out,
                         __global const int* restrict meta, const int n, const int op) {
    const int i = get_global_id(0);
    if (i < n) out[i] = (TO)bf(op, (TW)a[strided_offset(meta, 0, i)], (TW)b[strided_offset(meta, 1, i)]);
}

__kernel void binary_bwd(__global const float* restrict a, __global const float* restrict b,
                         __global const float* restrict dy, __global float* restrict da, __global float* restrict db,
                         __global const int* restrict meta, const int n, const int op) {
    const int i = get_global_id(0);
    if (i < n) {
        const float x = a[strided_offset(meta, 0, i)], y = b[strided_offset(meta, 1, i)], g = dy[i];
#if NEED_A
        da[i] = bda(op, x, y, g);
#endif
#if NEED_B
        db[i] = bdb(op, x, y, g);
#endif
    }
}

__kernel void where_fwd(__global const TC* restrict c, __global const TA* restrict a, __global const TB* restrict b,
                        __global TO* restrict out, __global const int* restrict meta, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        out[i] = c[strided_offset(meta, 0, i)] ? (TO)a[strided_offset(meta, 1, i)] : (TO)b[strided_offset(meta, 2, i)];
    }
}

__kernel void where_bwd(__global const TC* restrict c, __global const float* restrict dy, __global float* restrict da,
                        __global float* restrict db, __global const int* restrict meta, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const int keep = c[strided_offset(meta, 0, i)] != 0;
        const float g = dy[i];
#if NEED_A
        da[i] = keep ? g : 0.0f;
#endif
#if NEED_B
        db[i] = keep ? 0.0f : g;
#endif
    }
}

// Casts between the element types clnet holds (float to integer truncates toward zero, as PyTorch).
__kernel void cast(__global const TA* restrict x, __global TO* restrict y, const int n) {
    const int i = get_global_id(0);
    if (i < n) y[i] = (TO)x[i];
}
