// The pointwise family (clnet/pointwise.py): every unary and binary element-wise op, its formula chosen by a define,
// its operands read through strided.h layouts so that binary ops broadcast as NumPy and PyTorch do.
//   unary_fwd   y[i] = F(x[i]) for the unary op UOP, with its scalar parameters p0, p1 (a slope, bounds, an exponent)
//   unary_bwd   dx[i] = dy[i] * F'(x[i]) (from the saved input x; none of these needs the output)
//   binary_fwd  out[i] = G(a[off_a(i)], b[off_b(i)]) for the binary op BOP, i over the broadcast output shape
//   binary_bwd  da[i] = dy[i] * dG/da, db[i] = dy[i] * dG/db at the output shape (the caller sums each over the
//               dimensions its operand was broadcast along); either pointer may be unused (NEED_A, NEED_B)
//   where_fwd   out[i] = c[off_c(i)] ? a[off_a(i)] : b[off_b(i)]
//   where_bwd   da[i] = c ? dy[i] : 0, db[i] = c ? 0 : dy[i] at the output shape
// Layouts: meta (strided.h) holds the output's sizes, then the strides of each read operand (a, b; c, a, b for
// where); outputs and dy are contiguous at the output shape. Element types: TA, TB (operands), TO (output), TC (where's
// condition); a binary op computes in TW (the promoted type, as PyTorch promotes). Comparisons give uchar 0/1 (bool).
// Defines: UOP, BOP (op numbers, the tables in clnet/pointwise.py), NDIM (strided.h), TA, TB, TO, TW, TC,
// TW_FLOAT (0/1: TW is float), NEED_A, NEED_B (0/1).
#include "common.h"
#include "strided.h"

#ifndef UOP
#define UOP 1       // unary op number
#endif
#ifndef BOP
#define BOP 1       // binary op number
#endif
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

// ---- unary formulas: UF(x) forward, UG(x, g) = g * F'(x) --------------------------------------------------------
#if UOP == 1        // neg
#define UF(x) (-(x))
#define UG(x, g) (-(g))
#elif UOP == 2      // exp
#define UF(x) exp(x)
#define UG(x, g) ((g) * exp(x))
#elif UOP == 3      // log
#define UF(x) log(x)
#define UG(x, g) ((g) / (x))
#elif UOP == 4      // log1p
#define UF(x) log1p(x)
#define UG(x, g) ((g) / (1.0f + (x)))
#elif UOP == 5      // sqrt
#define UF(x) sqrt(x)
#define UG(x, g) ((g) * 0.5f / sqrt(x))
#elif UOP == 6      // rsqrt
#define UF(x) rsqrt(x)
#define UG(x, g) ((g) * -0.5f * rsqrt(x) / (x))
#elif UOP == 7      // abs (gradient 0 at 0, as PyTorch's sign)
#define UF(x) fabs(x)
#define UG(x, g) ((x) > 0.0f ? (g) : ((x) < 0.0f ? -(g) : 0.0f))
#elif UOP == 8      // sign (gradient 0)
#define UF(x) ((x) > 0.0f ? 1.0f : ((x) < 0.0f ? -1.0f : 0.0f))
#define UG(x, g) 0.0f
#elif UOP == 9      // erf
#define UF(x) erf(x)
#define UG(x, g) ((g) * 1.12837916709551257f * exp(-(x) * (x)))
#elif UOP == 10     // sin
#define UF(x) sin(x)
#define UG(x, g) ((g) * cos(x))
#elif UOP == 11     // cos
#define UF(x) cos(x)
#define UG(x, g) (-(g) * sin(x))
#elif UOP == 12     // tanh
#define UF(x) tanh(x)
#define UG(x, g) ((g) * (1.0f - tanh(x) * tanh(x)))
#elif UOP == 13     // sigmoid
inline float sigm(const float x) { return 1.0f / (1.0f + exp(-x)); }
#define UF(x) sigm(x)
#define UG(x, g) ((g) * sigm(x) * (1.0f - sigm(x)))
#elif UOP == 14     // relu (NaN passes, as PyTorch)
#define UF(x) ((x) < 0.0f ? 0.0f : (x))
#define UG(x, g) ((x) <= 0.0f ? 0.0f : (g))
#elif UOP == 15     // gelu, exact: x * Phi(x)
#define UF(x) (0.5f * (x) * (1.0f + erf((x) * SQRT1_2)))
#define UG(x, g) ((g) * (0.5f * (1.0f + erf((x) * SQRT1_2)) + (x) * INV_SQRT_2PI * exp(-0.5f * (x) * (x))))
#elif UOP == 16     // gelu, approximate="tanh"
inline float gelu_t(const float x) { return tanh(SQRT2_PI * (x + 0.044715f * x * x * x)); }
#define UF(x) (0.5f * (x) * (1.0f + gelu_t(x)))
#define UG(x, g) ((g) * (0.5f * (1.0f + gelu_t(x)) + 0.5f * (x) * (1.0f - gelu_t(x) * gelu_t(x)) * SQRT2_PI * \
                  (1.0f + 3.0f * 0.044715f * (x) * (x))))
#elif UOP == 17     // silu: x * sigmoid(x)
inline float sigm(const float x) { return 1.0f / (1.0f + exp(-x)); }
#define UF(x) ((x) * sigm(x))
#define UG(x, g) ((g) * sigm(x) * (1.0f + (x) * (1.0f - sigm(x))))
#elif UOP == 18     // mish: x * tanh(softplus(x))
inline float mish_t(const float x) { return tanh(softplus_f(x, 1.0f, 20.0f)); }
inline float sigm(const float x) { return 1.0f / (1.0f + exp(-x)); }
#define UF(x) ((x) * mish_t(x))
#define UG(x, g) ((g) * (mish_t(x) + (x) * sigm(x) * (1.0f - mish_t(x) * mish_t(x))))
#elif UOP == 19     // hardswish: x * relu6(x + 3) / 6 (gradient as PyTorch's: 0 below -3, 1 above 3)
#define UF(x) ((x) * clamp((x) + 3.0f, 0.0f, 6.0f) / 6.0f)
#define UG(x, g) ((x) < -3.0f ? 0.0f : ((x) <= 3.0f ? (g) * ((x) / 3.0f + 0.5f) : (g)))
#elif UOP == 20     // hardsigmoid: relu6(x + 3) / 6
#define UF(x) (clamp((x) + 3.0f, 0.0f, 6.0f) / 6.0f)
#define UG(x, g) ((x) > -3.0f && (x) < 3.0f ? (g) / 6.0f : 0.0f)
#elif UOP == 21     // leaky_relu, slope p0
#define UF(x) ((x) > 0.0f ? (x) : (x) * p0)
#define UG(x, g) ((x) > 0.0f ? (g) : (g) * p0)
#elif UOP == 22     // elu, alpha p0
#define UF(x) ((x) > 0.0f ? (x) : p0 * (exp(x) - 1.0f))
#define UG(x, g) ((x) > 0.0f ? (g) : (g) * p0 * exp(x))
#elif UOP == 23     // softplus, beta p0, threshold p1
#define UF(x) softplus_f(x, p0, p1)
#define UG(x, g) (p0 * (x) > p1 ? (g) : (g) / (1.0f + exp(-p0 * (x))))
#elif UOP == 24     // clamp to [p0, p1] (an open side: -inf or inf); gradient passes inside and on the bounds
#define UF(x) fmin(fmax(x, p0), p1)
#define UG(x, g) ((x) >= p0 && (x) <= p1 ? (g) : 0.0f)
#elif UOP == 25     // x ** p0
#define UF(x) (p0 == 2.0f ? (x) * (x) : pow(x, p0))
#define UG(x, g) (p0 == 0.0f ? 0.0f : (g) * p0 * (p0 == 2.0f ? (x) : pow(x, p0 - 1.0f)))
#elif UOP == 26     // p0 ** x
#define UF(x) pow(p0, x)
#define UG(x, g) ((g) * pow(p0, x) * log(p0))
#elif UOP == 27     // p0 / x
#define UF(x) (p0 / (x))
#define UG(x, g) (-(g) * p0 / ((x) * (x)))
#elif UOP == 28     // selu
#define SELU_A 1.6732632423543772f
#define SELU_S 1.0507009873554805f
#define UF(x) (SELU_S * ((x) > 0.0f ? (x) : SELU_A * (exp(x) - 1.0f)))
#define UG(x, g) ((g) * SELU_S * ((x) > 0.0f ? 1.0f : SELU_A * exp(x)))
#elif UOP == 29     // celu, alpha p0
#define UF(x) ((x) > 0.0f ? (x) : p0 * (exp((x) / p0) - 1.0f))
#define UG(x, g) ((x) > 0.0f ? (g) : (g) * exp((x) / p0))
#elif UOP == 30     // relu6
#define UF(x) ((x) < 0.0f ? 0.0f : ((x) > 6.0f ? 6.0f : (x)))
#define UG(x, g) ((x) <= 0.0f || (x) >= 6.0f ? 0.0f : (g))
#elif UOP == 31     // floor (gradient 0)
#define UF(x) floor(x)
#define UG(x, g) 0.0f
#elif UOP == 32     // ceil (gradient 0)
#define UF(x) ceil(x)
#define UG(x, g) 0.0f
#elif UOP == 33     // round half to even, as PyTorch (gradient 0)
#define UF(x) rint(x)
#define UG(x, g) 0.0f
#elif UOP == 34     // reciprocal
#define UF(x) (1.0f / (x))
#define UG(x, g) (-(g) / ((x) * (x)))
#elif UOP == 35     // logical not (uchar in and out)
#define UF(x) ((x) == 0)
#define UG(x, g) 0.0f
#else
#error "unknown UOP"
#endif

__kernel void unary_fwd(__global const TA* restrict x, __global TO* restrict y, const int n, const float p0,
                        const float p1) {
    const int i = get_global_id(0);
    if (i < n) y[i] = (TO)(UF(x[i]));
}

__kernel void unary_bwd(__global const float* restrict x, __global const float* restrict dy,
                        __global float* restrict dx, const int n, const float p0, const float p1) {
    const int i = get_global_id(0);
    if (i < n) {
        const float v = x[i], g = dy[i];
        dx[i] = UG(v, g);
    }
}

// ---- binary formulas: BF(a, b) forward in TW; BDA, BDB the gradients of a and b times g (floats) ------------------
#if BOP == 1        // add
#define BF(a, b) ((a) + (b))
#define BDA(a, b, g) (g)
#define BDB(a, b, g) (g)
#elif BOP == 2      // sub
#define BF(a, b) ((a) - (b))
#define BDA(a, b, g) (g)
#define BDB(a, b, g) (-(g))
#elif BOP == 3      // mul
#define BF(a, b) ((a) * (b))
#define BDA(a, b, g) ((g) * (b))
#define BDB(a, b, g) ((g) * (a))
#elif BOP == 4      // true division
#define BF(a, b) ((a) / (b))
#define BDA(a, b, g) ((g) / (b))
#define BDB(a, b, g) (-(g) * (a) / ((b) * (b)))
#elif BOP == 5      // pow (the exponent's gradient 0 where a is 0 and b positive, as PyTorch's)
#define BF(a, b) pow(a, b)
#define BDA(a, b, g) ((b) == 0.0f ? 0.0f : (g) * (b) * pow(a, (b) - 1.0f))
#define BDB(a, b, g) ((a) == 0.0f && (b) >= 0.0f ? 0.0f : (g) * pow(a, b) * log(a))
#elif BOP == 6      // maximum (NaN propagates; a tie splits the gradient in halves, as PyTorch's)
#define BF(a, b) ((a) != (a) || (a) > (b) ? (a) : (b))
#define BDA(a, b, g) ((a) > (b) ? (g) : ((a) == (b) ? 0.5f * (g) : 0.0f))
#define BDB(a, b, g) ((b) > (a) ? (g) : ((a) == (b) ? 0.5f * (g) : 0.0f))
#elif BOP == 7      // minimum
#define BF(a, b) ((a) != (a) || (a) < (b) ? (a) : (b))
#define BDA(a, b, g) ((a) < (b) ? (g) : ((a) == (b) ? 0.5f * (g) : 0.0f))
#define BDB(a, b, g) ((b) < (a) ? (g) : ((a) == (b) ? 0.5f * (g) : 0.0f))
#elif BOP == 8      // <
#define BF(a, b) ((a) < (b))
#elif BOP == 9      // <=
#define BF(a, b) ((a) <= (b))
#elif BOP == 10     // >
#define BF(a, b) ((a) > (b))
#elif BOP == 11     // >=
#define BF(a, b) ((a) >= (b))
#elif BOP == 12     // ==
#define BF(a, b) ((a) == (b))
#elif BOP == 13     // !=
#define BF(a, b) ((a) != (b))
#elif BOP == 14     // logical and
#define BF(a, b) ((a) != 0 && (b) != 0)
#elif BOP == 15     // logical or
#define BF(a, b) ((a) != 0 || (b) != 0)
#elif BOP == 16     // floor division (integers: rounds toward minus infinity, as Python and PyTorch)
#define BF(a, b) floor_div(a, b)
#elif BOP == 17     // remainder with the divisor's sign (Python's %, PyTorch's remainder)
#define BF(a, b) py_rem(a, b)
#define BDA(a, b, g) (g)
#define BDB(a, b, g) (-(g) * floor((a) / (b)))
#else
#error "unknown BOP"
#endif

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
                         __global const int* restrict meta, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const TW x = (TW)a[strided_offset(meta, 0, i)], y = (TW)b[strided_offset(meta, 1, i)];
        out[i] = (TO)(BF(x, y));
    }
}

#ifdef BDA
__kernel void binary_bwd(__global const float* restrict a, __global const float* restrict b,
                         __global const float* restrict dy, __global float* restrict da, __global float* restrict db,
                         __global const int* restrict meta, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float x = a[strided_offset(meta, 0, i)], y = b[strided_offset(meta, 1, i)], g = dy[i];
#if NEED_A
        da[i] = BDA(x, y, g);
#endif
#if NEED_B
        db[i] = BDB(x, y, g);
#endif
    }
}
#endif

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
