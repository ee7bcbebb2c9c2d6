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
// rank serves every op. The formulas live in pointwise_formulas.h (uf, ug) and pointwise_binary.h (bf), which
// chain.cl includes too, so a fused graph chain computes every value from the same text. Defines: NDIM (strided.h), TA, TB, TO, TW, TC,
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

#include "pointwise_formulas.h"

__kernel void unary_fwd(__global const TA* restrict x, OFFSET_PARAM(x), __global TO* restrict y, OFFSET_PARAM(y),
                        const int n, const int op, const float p0, const float p1) {
    AT_OFFSET(__global const TA*, x) AT_OFFSET(__global TO*, y)
    const int i = get_global_id(0);
    if (i < n) y[i] = (TO)uf(op, (float)x[i], p0, p1);
}

__kernel void unary_bwd(__global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict dy,
                        OFFSET_PARAM(dy), __global float* restrict dx, OFFSET_PARAM(dx), const int n, const int op,
                        const float p0, const float p1) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int i = get_global_id(0);
    if (i < n) dx[i] = ug(op, x[i], dy[i], p0, p1);
}

// ---- binary formulas: bf in the working type TW (pointwise_binary.h); bda, bdb the gradients of a and b times
// g (float only).
#define BW TW
#define BW_FLOAT TW_FLOAT
#define BW_NAME(f) f
#include "pointwise_binary.h"

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

__kernel void binary_fwd(__global const TA* restrict a, OFFSET_PARAM(a), __global const TB* restrict b, OFFSET_PARAM(b),
                         __global TO* restrict out, OFFSET_PARAM(out), __global const int* restrict meta,
                         OFFSET_PARAM(meta), const int n, const int op) {
    AT_OFFSET(__global const TA*, a) AT_OFFSET(__global const TB*, b) AT_OFFSET(__global TO*, out)
    AT_OFFSET(__global const int*, meta)
    const int i = get_global_id(0);
    if (i < n) out[i] = (TO)bf(op, (TW)a[strided_offset(meta, 0, i)], (TW)b[strided_offset(meta, 1, i)]);
}

__kernel void binary_bwd(__global const float* restrict a, OFFSET_PARAM(a), __global const float* restrict b,
                         OFFSET_PARAM(b), __global const float* restrict dy, OFFSET_PARAM(dy),
                         __global float* restrict da, OFFSET_PARAM(da), __global float* restrict db, OFFSET_PARAM(db),
                         __global const int* restrict meta, OFFSET_PARAM(meta), const int n, const int op) {
    AT_OFFSET(__global const float*, a) AT_OFFSET(__global const float*, b) AT_OFFSET(__global const float*, dy)
    AT_OFFSET(__global float*, da) AT_OFFSET(__global float*, db) AT_OFFSET(__global const int*, meta)
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

__kernel void where_fwd(__global const TC* restrict c, OFFSET_PARAM(c), __global const TA* restrict a, OFFSET_PARAM(a),
                        __global const TB* restrict b, OFFSET_PARAM(b), __global TO* restrict out, OFFSET_PARAM(out),
                        __global const int* restrict meta, OFFSET_PARAM(meta), const int n) {
    AT_OFFSET(__global const TC*, c) AT_OFFSET(__global const TA*, a) AT_OFFSET(__global const TB*, b)
    AT_OFFSET(__global TO*, out) AT_OFFSET(__global const int*, meta)
    const int i = get_global_id(0);
    if (i < n) {
        out[i] = c[strided_offset(meta, 0, i)] ? (TO)a[strided_offset(meta, 1, i)] : (TO)b[strided_offset(meta, 2, i)];
    }
}

__kernel void where_bwd(__global const TC* restrict c, OFFSET_PARAM(c), __global const float* restrict dy,
                        OFFSET_PARAM(dy), __global float* restrict da, OFFSET_PARAM(da), __global float* restrict db,
                        OFFSET_PARAM(db), __global const int* restrict meta, OFFSET_PARAM(meta), const int n) {
    AT_OFFSET(__global const TC*, c) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, da)
    AT_OFFSET(__global float*, db) AT_OFFSET(__global const int*, meta)
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
__kernel void cast(__global const TA* restrict x, OFFSET_PARAM(x), __global TO* restrict y, OFFSET_PARAM(y),
                   const int n) {
    AT_OFFSET(__global const TA*, x) AT_OFFSET(__global TO*, y)
    const int i = get_global_id(0);
    if (i < n) y[i] = (TO)x[i];
}
