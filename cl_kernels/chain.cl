// A fused chain of element-wise launches (clnet/graph.py decides which; clnet/chain.py encodes them): one work-item
// per flat index i runs the recorded steps in order, each exactly as its own launch would have (pointwise.cl's
// unary_fwd, unary_bwd, binary_fwd, where_fwd, cast; elementwise.cl's axpby, affine, mul, act_fwd, act_bwd), through
// the same formula text (pointwise_formulas.h, pointwise_binary.h, elementwise_formulas.h), and stores every step's
// result, so a replay of the fused step writes what the unfused one wrote, bit for bit.
//   pointwise_chain  for each step s: read its operands (a buffer at i, or through a strided layout, or the value an
//                    earlier step of this work-item computed), compute, convert to the output type, store at out[i]
// Layout of `code` (int32): code[0] = the number of steps; then STEP_WORDS words a step:
//   kind (1 unary_fwd, 2 unary_bwd, 3 binary_fwd, 4 where_fwd, 5 cast, 6 axpby, 7 affine, 8 mul, 9 act_fwd,
//   10 act_bwd: float only; p0, p1 are alpha, beta), op number (the activation's kind for 9 and 10), output type,
//   output slot,
//   working type (binary_fwd's TW), p0 and p1 (float bits), then MAX_OPERANDS triples (source, type, layout):
//   source >= 0 a buffer slot, source < 0 the value of step -source-1; layout 0 reads at i, else the word at which
//   [ndim, sizes..., strides...] of that operand start (strided.h's arithmetic, its rank a run-time value).
// Types: 0 float, 1 int, 2 uchar (bool). Buffers b0..b11 are untyped (one build serves every type set); a slot not
// used is any buffer. No defines.
#include "common.h"
#include "pointwise_formulas.h"
#include "elementwise_formulas.h"

#define BW float
#define BW_FLOAT 1
#define BW_NAME(f) f##_float
#include "pointwise_binary.h"
#undef BW
#undef BW_FLOAT
#undef BW_NAME
#define BW int
#define BW_FLOAT 0
#define BW_NAME(f) f##_int
#include "pointwise_binary.h"
#undef BW
#undef BW_FLOAT
#undef BW_NAME
#define BW uchar
#define BW_FLOAT 0
#define BW_NAME(f) f##_uchar
#include "pointwise_binary.h"

#define MAX_STEPS 16      // clnet/pointwise.py CHAIN_STEPS
#define MAX_OPERANDS 3
#define STEP_WORDS 16     // clnet/pointwise.py STEP_WORDS

// A value of one of the types: a float in f, an int or a uchar in i.
typedef struct { float f; int i; } val;

inline val load(__global const uchar* p, const int t, const int k) {
    val v = {0.0f, 0};
    if (t == 0) v.f = ((__global const float*)p)[k];
    else if (t == 1) v.i = ((__global const int*)p)[k];
    else v.i = p[k];
    return v;
}

inline void store(__global uchar* p, const int t, const int k, const val v) {
    if (t == 0) ((__global float*)p)[k] = v.f;
    else if (t == 1) ((__global int*)p)[k] = v.i;
    else p[k] = (uchar)v.i;
}

// The conversions a launch makes from its operands' element type t to the type it computes in ((float)x, (TW)a)
inline float to_f(const val v, const int t) { return t == 0 ? v.f : (float)v.i; }
inline int to_i(const val v, const int t) { return t == 0 ? (int)v.f : v.i; }
inline uchar to_u(const val v, const int t) { return t == 0 ? (uchar)v.f : (uchar)v.i; }

// ... and from the computed value to the output type t ((TO)r)
inline val from_f(const float r, const int t) {
    val v = {0.0f, 0};
    if (t == 0) v.f = r;
    else if (t == 1) v.i = (int)r;
    else v.i = (uchar)r;
    return v;
}

inline val from_i(const int r, const int t) {
    val v = {0.0f, 0};
    if (t == 0) v.f = (float)r;
    else if (t == 1) v.i = r;
    else v.i = (uchar)r;
    return v;
}

inline val from_u(const uchar r, const int t) {
    val v = {0.0f, 0};
    if (t == 0) v.f = (float)r;
    else v.i = r;
    return v;
}

// strided_offset (strided.h) with the rank read from the layout
inline int chain_offset(__global const int* lay, int i) {
    const int nd = lay[0];
    int off = 0;
    for (int d = nd - 1; d > 0; d--) {
        const int size = lay[1 + d];
        off += (i % size) * lay[1 + nd + d];
        i /= size;
    }
    return off + i * lay[1 + nd];
}

__kernel void pointwise_chain(__global uchar* b0, OFFSET_PARAM(b0), __global uchar* b1, OFFSET_PARAM(b1),
                              __global uchar* b2, OFFSET_PARAM(b2), __global uchar* b3, OFFSET_PARAM(b3),
                              __global uchar* b4, OFFSET_PARAM(b4), __global uchar* b5, OFFSET_PARAM(b5),
                              __global uchar* b6, OFFSET_PARAM(b6), __global uchar* b7, OFFSET_PARAM(b7),
                              __global uchar* b8, OFFSET_PARAM(b8), __global uchar* b9, OFFSET_PARAM(b9),
                              __global uchar* b10, OFFSET_PARAM(b10), __global uchar* b11, OFFSET_PARAM(b11),
                              __global const int* restrict code, OFFSET_PARAM(code), const int n) {
    AT_OFFSET(__global uchar*, b0) AT_OFFSET(__global uchar*, b1) AT_OFFSET(__global uchar*, b2)
    AT_OFFSET(__global uchar*, b3) AT_OFFSET(__global uchar*, b4) AT_OFFSET(__global uchar*, b5)
    AT_OFFSET(__global uchar*, b6) AT_OFFSET(__global uchar*, b7) AT_OFFSET(__global uchar*, b8)
    AT_OFFSET(__global uchar*, b9) AT_OFFSET(__global uchar*, b10) AT_OFFSET(__global uchar*, b11)
    AT_OFFSET(__global const int*, code)
    const int i = get_global_id(0);
    if (i >= n) return;
    __global uchar* buf[12] = {b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11};
    val reg[MAX_STEPS];
    const int steps = code[0];
    for (int s = 0; s < steps && s < MAX_STEPS; s++) {
        __global const int* w = code + 1 + s * STEP_WORDS;
        const int kind = w[0], op = w[1], tout = w[2], work = w[4];
        const float p0 = as_float(w[5]), p1 = as_float(w[6]);
        val x[MAX_OPERANDS];
        int tx[MAX_OPERANDS];
        const int nops = kind == 4 ? 3 : (kind == 1 || kind == 5 || kind == 7 || kind == 9 ? 1 : 2);
        for (int j = 0; j < nops; j++) {
            const int src = w[7 + 3 * j], lay = w[9 + 3 * j];
            tx[j] = w[8 + 3 * j];
            x[j] = src < 0 ? reg[-src - 1] : load(buf[src], tx[j], lay ? chain_offset(code + lay, i) : i);
        }
        val r;
        if (kind == 1) {
            r = from_f(uf(op, to_f(x[0], tx[0]), p0, p1), tout);
        } else if (kind == 2) {
            r = from_f(ug(op, to_f(x[0], tx[0]), to_f(x[1], tx[1]), p0, p1), tout);
        } else if (kind == 3) {
            if (work == 0) r = from_f(bf_float(op, to_f(x[0], tx[0]), to_f(x[1], tx[1])), tout);
            else if (work == 1) r = from_i(bf_int(op, to_i(x[0], tx[0]), to_i(x[1], tx[1])), tout);
            else r = from_u(bf_uchar(op, to_u(x[0], tx[0]), to_u(x[1], tx[1])), tout);
        } else if (kind == 4) {
            const int keep = tx[0] == 0 ? x[0].f != 0.0f : x[0].i != 0;
            r = keep ? x[1] : x[2];
        } else if (kind == 5) {
            r = tout == 0 ? from_f(to_f(x[0], tx[0]), 0) : (tout == 1 ? from_i(to_i(x[0], tx[0]), 1) :
                                                              from_u(to_u(x[0], tx[0]), 2));
        } else if (kind == 6) {
            r = from_f(axpby_of(p0, x[0].f, p1, x[1].f), 0);
        } else if (kind == 7) {
            r = from_f(affine_of(p0, x[0].f, p1), 0);
        } else if (kind == 8) {
            r = from_f(x[0].f * x[1].f, 0);
        } else if (kind == 9) {
            r = from_f(act_of(op, x[0].f), 0);
        } else {
            r = from_f(act_grad_of(op, x[0].f, x[1].f), 0);
        }
        store(buf[w[3]], tout, i, r);
        reg[s] = r;
    }
}
