// Reductions over any dimensions of a contiguous tensor, their gradients, and cumulative sums (clnet/reduce.py).
//
// Layout of reduce_tree and reduce_loop: the input seen as (kept dimensions..., reduced dimensions...), each part
// coalesced on its own (layout.py), in layout.py's `meta` format: the nd = kd + rd sizes, then the input's strides
// for them. Output o (row-major over the kept part) reduces the R values at offset(kept part, o) +
// offset(reduced part, r), r < R. Both split each output's elements into parts of `chunk`: part p covers
// r in [p chunk, (p + 1) chunk) and writes out[o parts + p]; with parts > 1 that is an unfinished partial (fin 0,
// scale 1) that a second launch over the (outputs, parts) partials reduces. With `indexed`, the candidate index of
// each value is xi[its offset] (the partial indices of a first pass), else r; ARG writes the index of the chosen
// value to out_i (the first one on ties, a NaN before any number, as PyTorch). Each value is mapped (map, see MAPS)
// before it is combined; `c` is a per-output value (a mean, a maximum) that map and fin read. The result is then
// fin: 0 v * scale, 1 sqrt(v * scale), 2 log(v) + c (c taken as 0 where it is infinite, as map 4 does),
// 3 pow(v, scale), 4 v != 0, 5 v == 0 (any, all: counts of maps 10 and 9 into a bool).
//   reduce_tree  (a GPU's, for contiguous elements) work-groups of LSIZE work-items (always that size: PoCL
//                compiles a kernel again for each local size): `lanes` neighbours (a runtime power of two) share
//                one output, each taking every lanes-th element, then a pairwise tree in local memory; LSIZE / lanes
//                outputs per group along the launch's second dimension, the parts along its first.
//   reduce_loop  a work-item per COLS neighbouring outputs and part (a GPU's COLS is 1: neighbouring work-items
//                read neighbouring outputs' elements; a CPU's 16, a cache line of each row it reads).
//   reduce_bwd   dx[i] = scale * dy[o(i)] * a formula (grad) of x[i], y[o], aux[o]; o(i) is the output element input
//                element i reduced into, read through strided.h (the output's strides broadcast over x's shape).
//   index_bwd    max/min over one dimension (x seen as (outer, size, inner)): dx = dy at the index kept, else 0.
//   softmax_rows_fwd, softmax_rows_bwd  softmax and log-softmax over a last dimension, lanes of a work-group per
//                row (a GPU's; softmax.cl's kernels serve every other case).
//   cumsum       x seen as (outer, size, inner), one work-item per (outer, inner) line; reverse: from the end (the
//                gradient of a cumulative sum is the reverse cumulative sum of its gradient).
// Defines: INTEGER (0/1: int values instead of float; T is the values' type), BOOLS (0/1: bool input), BOOL_OUT
// (0/1: bool output), COMB (1 sum, 2 prod, 3 max, 4 min), ARG (0/1: max or min also give the index), LSIZE (the
// work-group size, a power of two), COLS (reduce_loop's outputs per work-item), NDIM (strided.h: reduce_bwd's
// rank). What is combined (map), the finishing step (fin) and the gradient's formula (grad) are runtime arguments,
// so that a few builds serve every reduction.
#include "common.h"
#include "strided.h"

#ifndef INTEGER
#define INTEGER 0   // int values instead of float
#endif
#ifndef BOOLS
#define BOOLS 0     // reduce_tree, reduce_loop: the input is bool (one byte, 0 or 1) values, combined as int
#endif
#ifndef BOOL_OUT
#define BOOL_OUT 0  // reduce_tree, reduce_loop: the output is bool (fin 4 or 5 gives 0 or 1)
#endif
#if BOOLS
#define IN uchar
#else
#define IN T
#endif
#if BOOL_OUT
#define OUT uchar
#else
#define OUT T
#endif
#ifndef COMB
#define COMB 1      // 1 sum, 2 product, 3 maximum, 4 minimum
#endif
#ifndef ARG
#define ARG 0       // with COMB 3/4: also the index of the maximum/minimum
#endif
#ifndef LSIZE
#define LSIZE 256   // reduce_tree's and reduce_loop's work-group size
#endif
#ifndef COLS
#define COLS 1      // reduce_loop: neighbouring outputs per work-item
#endif
#if LSIZE & (LSIZE - 1)
#error "LSIZE must be a power of two"
#endif
#if ARG && COMB != 3 && COMB != 4
#error "ARG needs COMB 3 (max) or 4 (min)"
#endif

#if BOOLS && !INTEGER
#error "BOOLS needs INTEGER"
#endif
#if INTEGER
#define T int
#define IS_FLOAT 0
#else
#define T float
#define IS_FLOAT 1
#endif

#if IS_FLOAT
#define ISNAN(v) isnan(v)
#define LOWEST (-INFINITY)
#define HIGHEST INFINITY
#else
#define ISNAN(v) 0
#define LOWEST INT_MIN
#define HIGHEST INT_MAX
#endif

#if COMB == 1
#define IDENTITY ((T)0)
#elif COMB == 2
#define IDENTITY ((T)1)
#elif COMB == 3
#define IDENTITY LOWEST
#elif COMB == 4
#define IDENTITY HIGHEST
#else
#error "COMB must be 1..4"
#endif

// A per-output shift for exp(): the maximum, or 0 where the maximum is infinite (all -inf, or a +inf present), so
// that no inf - inf appears.
inline float shift_of(const float m) { return isinf(m) ? 0.0f : m; }

// The value combined for an element v, by `map`: 0 v, 1 |v|, 2 v^2, 3 (v - c)^2, 4 exp(v - shift(c)), 5 |v|^p,
// 6 v == c, 7 |v| == c, 8 v (1 where v is 0), 9 v == 0, 10 v != 0 (a NaN too). A runtime argument, the same
// for every work-item, so that one build serves every map: REDUCE_RUN switches on it outside its loops (a switch
// inside, compiled as selects, evaluated every map's exp and pow for each element: 10x slower on PoCL). int values
// take maps 0, 9 and 10.
#if IS_FLOAT
#define MAPS(RUN) \
    switch (map) { \
    case 1: RUN(fabs(v)); break; \
    case 2: RUN(v * v); break; \
    case 3: RUN((v - cc) * (v - cc)); break; \
    case 4: RUN(exp(v - shift_of(cc))); break; \
    case 5: RUN(pow(fabs(v), p)); break; \
    case 6: RUN(v == cc ? 1.0f : 0.0f); break; \
    case 7: RUN(fabs(v) == cc ? 1.0f : 0.0f); break; \
    case 8: RUN(v == 0.0f ? 1.0f : v); break; \
    case 9: RUN(v == 0.0f ? 1.0f : 0.0f); break; \
    case 10: RUN(v != 0.0f ? 1.0f : 0.0f); break; \
    default: RUN(v); break; \
    }
#else
#define MAPS(RUN) \
    switch (map) { \
    case 9: RUN(v == 0 ? 1 : 0); break; \
    case 10: RUN(v != 0 ? 1 : 0); break; \
    default: RUN(v); break; \
    }
#endif

// v replaces best (max/min): a larger (smaller) value, or a NaN over a number (PyTorch's max propagates NaN).
#if COMB == 3
#define BETTER(v, best) ((v) > (best) || (ISNAN(v) && !ISNAN(best)))
#else
#define BETTER(v, best) ((v) < (best) || (ISNAN(v) && !ISNAN(best)))
#endif
#define SAME(v, best) ((v) == (best) || (ISNAN(v) && ISNAN(best)))

inline T combine(const T a, const T b) {
#if COMB == 1
    return a + b;
#elif COMB == 2
    return a * b;
#elif COMB == 3
    return b > a || ISNAN(b) ? b : a;  // a NaN in a stays: nothing is > NaN
#else
    return b < a || ISNAN(b) ? b : a;
#endif
}

// The offset of row-major index i over dimensions [first, first + count) of the layout (count >= 1).
inline int part_offset(__global const int* meta, const int nd, const int first, const int count, int i) {
    int off = 0;
    for (int d = first + count - 1; d > first; d--) {
        const int size = meta[d];
        off += (i % size) * meta[nd + d];
        i /= size;
    }
    return off + i * meta[nd + first];
}

#if ARG
#define ACCUMULATE(q, m) { const T w = (m); const int j = indexed ? xi[off] : r; \
                           if (BETTER(w, acc[q]) || (SAME(w, acc[q]) && j < j0[q])) { acc[q] = w; j0[q] = j; } }
#else
#define ACCUMULATE(q, m) acc[q] = combine(acc[q], (m))
#endif
// The loops over the elements [r0, r1), every `step`-th, of NQ outputs at once (bases base[q], per-output values
// cc[q]), combining the map expression m of v (the element) into acc[q]: one loop for a single reduced dimension
// (offsets by multiplication) and one for several (strided.h's divisions, once per r for all NQ outputs).
#define RUN(m) \
    if (rd == 1) { \
        for (int r = r0; r < r1; r += step) { \
            const int roff = r * stride; \
            for (int q = 0; q < nq; q++) { \
                const int off = base[q] + roff; const T v = x[off]; const float cc = ccs[q]; ACCUMULATE(q, m); \
            } \
        } \
    } else { \
        for (int r = r0; r < r1; r += step) { \
            const int roff = part_offset(meta, nd, kd, rd, r); \
            for (int q = 0; q < nq; q++) { \
                const int off = base[q] + roff; const T v = x[off]; const float cc = ccs[q]; ACCUMULATE(q, m); \
            } \
        } \
    }

// acc[q] (and with ARG j0[q], its index) of the elements [r0, r1) of each of NQ outputs, every `step`-th.
#define REDUCE_RUN(NQ) \
    const int nd = kd + rd; \
    const int stride = meta[2 * nd - 1]; /* the innermost reduced dimension's */ \
    const int nq = NQ; \
    for (int q = 0; q < nq; q++) { acc[q] = IDENTITY; j0[q] = INT_MAX; } \
    MAPS(RUN)

// What an output holds: fin of the combined value (see the header).
inline T finish(T acc, const int fin, const float scale, const float cc) {
#if IS_FLOAT
    if (fin == 0) acc *= scale;
    else if (fin == 1) acc = sqrt(acc * scale);
    else if (fin == 2) acc = log(acc) + shift_of(cc);
    else if (fin == 3) acc = pow(acc, scale);
#endif
    if (fin == 4) acc = acc != 0 ? 1 : 0;
    else if (fin == 5) acc = acc == 0 ? 1 : 0;
    return acc;
}

__kernel void reduce_tree(__global const IN* restrict x, OFFSET_PARAM(x), __global const int* restrict xi,
                          OFFSET_PARAM(xi), const int indexed, __global const float* restrict c, OFFSET_PARAM(c),
                          __global OUT* restrict out, OFFSET_PARAM(out), __global int* restrict out_i,
                          OFFSET_PARAM(out_i), __global const int* restrict meta, OFFSET_PARAM(meta), const int kd,
                          const int rd, const int R, const int outputs, const int lanes, const int chunk, const int map,
                          const int fin, const float scale, const float p) {
    AT_OFFSET(__global const IN*, x) AT_OFFSET(__global const int*, xi) AT_OFFSET(__global const float*, c)
    AT_OFFSET(__global OUT*, out) AT_OFFSET(__global int*, out_i) AT_OFFSET(__global const int*, meta)
    __local T vals[LSIZE];
#if ARG
    __local int ats[LSIZE];
#endif
    const int lid = get_local_id(0), lane = lid & (lanes - 1), part = get_group_id(0), parts = get_num_groups(0);
    const int o = get_group_id(1) * (LSIZE / lanes) + lid / lanes;
    T acc[1];
    int j0[1], base[1];
    float ccs[1];
    base[0] = part_offset(meta, kd + rd, 0, kd, min(o, outputs - 1));
    ccs[0] = c ? c[min(o, outputs - 1)] : 0.0f;
    const int r0 = part * chunk + lane, r1 = o < outputs ? min(R, (part + 1) * chunk) : 0, step = lanes;
    REDUCE_RUN(1)
    const float cc = ccs[0];
    vals[lid] = acc[0];
#if ARG
    ats[lid] = j0[0];
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = lanes >> 1; w > 0; w >>= 1) {
        if (lane < w) {
#if ARG
            const T v = vals[lid + w];
            const int j = ats[lid + w];
            if (BETTER(v, vals[lid]) || (SAME(v, vals[lid]) && j < ats[lid])) { vals[lid] = v; ats[lid] = j; }
#else
            vals[lid] = combine(vals[lid], vals[lid + w]);
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lane != 0 || o >= outputs) return;
    out[o * parts + part] = finish(vals[lid], fin, scale, cc);
#if ARG
    out_i[o * parts + part] = ats[lid];
#endif
}

__kernel void reduce_loop(__global const IN* restrict x, OFFSET_PARAM(x), __global const int* restrict xi,
                          OFFSET_PARAM(xi), const int indexed, __global const float* restrict c, OFFSET_PARAM(c),
                          __global OUT* restrict out, OFFSET_PARAM(out), __global int* restrict out_i,
                          OFFSET_PARAM(out_i), __global const int* restrict meta, OFFSET_PARAM(meta), const int kd,
                          const int rd, const int R, const int outputs, const int parts, const int chunk, const int map,
                          const int fin, const float scale, const float p) {
    AT_OFFSET(__global const IN*, x) AT_OFFSET(__global const int*, xi) AT_OFFSET(__global const float*, c)
    AT_OFFSET(__global OUT*, out) AT_OFFSET(__global int*, out_i) AT_OFFSET(__global const int*, meta)
    const int e = get_global_id(0), runs = (outputs + COLS - 1) / COLS;
    if (e >= runs * parts) return;
    const int o0 = e % runs * COLS, part = e / runs;
    T acc[COLS];
    int j0[COLS], base[COLS];
    float ccs[COLS];
    for (int q = 0; q < COLS; q++) {  // the outputs past the last read the last one's elements, and are not written
        const int o = min(o0 + q, outputs - 1);
        base[q] = part_offset(meta, kd + rd, 0, kd, o);
        ccs[q] = c ? c[o] : 0.0f;
    }
    const int r0 = part * chunk, r1 = min(R, (part + 1) * chunk), step = 1;
    REDUCE_RUN(COLS)
    for (int q = 0; q < COLS && o0 + q < outputs; q++) {
        const int o = o0 + q;
        out[o * parts + part] = finish(acc[q], fin, scale, ccs[q]);
#if ARG
        out_i[o * parts + part] = j0[q];
#endif
    }
}

// The gradient of element i of x, from its output o's upstream gradient g = scale dy[o] (scale: 1 for a sum,
// 1 / R for a mean, 2 / (R - correction) for a variance, 1 / (R - correction) for a standard deviation), by `grad`
// (a runtime argument, as map): 0 g (sum, mean); 1 g (x - aux) (variance, aux the mean); 2 g (x - aux) / y, 0 where
// y is 0 (standard deviation); 3 g / aux where x == y, else 0 (amax, amin: aux the count of ties); 4 sign(x) g / aux
// where |x| == y (the infinity norms); 5 sign(x) g (1-norm); 6 g x / y, 0 where y is 0 (2-norm);
// 7 g x |x|^(p-2) / y^(p-1), 0 where y is 0 (p-norm); 8 g exp(x - y) (logsumexp); 9 the product of the others:
// g y / x without zeros (aux 0), the product of the nonzero values y at the one zero (aux 1), else 0 (prod; y the
// product of the nonzero values).
// One loop over a work-item's elements for each formula, the switch outside it (as MAPS).
#define EACH(d) for (int k = 0; k < len; k++) { const int i = i0 + k, o = o0 + k * ostep; dx[i] = (d); }

__kernel void reduce_bwd(__global const float* restrict x, OFFSET_PARAM(x), __global const float* restrict y,
                         OFFSET_PARAM(y), __global const float* restrict dy, OFFSET_PARAM(dy),
                         __global const float* restrict aux, OFFSET_PARAM(aux), __global float* restrict dx,
                         OFFSET_PARAM(dx), __global const int* restrict meta, OFFSET_PARAM(meta), const int n,
                         const int run, const int grad, const float scale, const float p) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global const float*, y) AT_OFFSET(__global const float*, dy)
    AT_OFFSET(__global const float*, aux) AT_OFFSET(__global float*, dx) AT_OFFSET(__global const int*, meta)
    // A run of `run` neighbouring elements of one line of the layout's last dimension per work-item (a CPU's
    // vector loop; a GPU's run is 1), whose outputs step by that dimension's output stride.
    const int inner = meta[NDIM - 1], per_line = (inner + run - 1) / run, e = get_global_id(0);
    if (e >= n / inner * per_line) return;
    const int k0 = e % per_line * run, i0 = e / per_line * inner + k0, len = min(run, inner - k0);
    const int o0 = strided_offset(meta, 0, i0), ostep = meta[2 * NDIM - 1];
    switch (grad) {
    case 1: EACH(dy[o] * scale * (x[i] - aux[o])); break;
    case 2: EACH(y[o] == 0.0f ? 0.0f : dy[o] * scale * (x[i] - aux[o]) / y[o]); break;
    case 3: EACH(x[i] == y[o] ? dy[o] * scale / aux[o] : 0.0f); break;
    case 4: EACH(fabs(x[i]) == y[o] ? sign(x[i]) * dy[o] * scale / aux[o] : 0.0f); break;
    case 5: EACH(sign(x[i]) * dy[o] * scale); break;
    case 6: EACH(y[o] == 0.0f ? 0.0f : dy[o] * scale * x[i] / y[o]); break;
    case 7: EACH(y[o] == 0.0f ? 0.0f : dy[o] * scale * x[i] * pow(fabs(x[i]), p - 2.0f) / pow(y[o], p - 1.0f));
            break;
    case 8: EACH(dy[o] * scale * exp(x[i] - y[o])); break;
    case 9: EACH(aux[o] == 0.0f ? dy[o] * scale * y[o] / x[i]
                 : (aux[o] == 1.0f && x[i] == 0.0f ? dy[o] * scale * y[o] : 0.0f)); break;
    default: EACH(dy[o] * scale); break;
    }
}

__kernel void index_bwd(__global const int* restrict idx, OFFSET_PARAM(idx), __global const float* restrict dy,
                        OFFSET_PARAM(dy), __global float* restrict dx, OFFSET_PARAM(dx), const int n, const int size,
                        const int inner) {
    AT_OFFSET(__global const int*, idx) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int i = get_global_id(0);
    if (i >= n) return;
    const int o = i / (inner * size) * inner + i % inner;
    dx[i] = (i / inner) % size == idx[o] ? dy[o] : 0.0f;
}

__kernel void cumsum(__global const T* restrict x, OFFSET_PARAM(x), __global T* restrict y, OFFSET_PARAM(y),
                     const int lines, const int size, const int inner, const int reverse) {
    AT_OFFSET(__global const T*, x) AT_OFFSET(__global T*, y)
    const int e = get_global_id(0);
    if (e >= lines) return;
    const int base = e / inner * size * inner + e % inner;
    T s = (T)0;
    for (int k = 0; k < size; k++) {
        const int off = base + (reverse ? size - 1 - k : k) * inner;
        s += x[off];
        y[off] = s;
    }
}

// The sum (or, with is_max, the maximum) of v over each run of `lanes` neighbouring work-items of the group (a
// pairwise tree in part[]), returned to all of them; every work-item of the group must call it.
inline float lanes_combine(float v, __local float* part, const int lid, const int lane, const int lanes,
                           const int is_max) {
    part[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = lanes >> 1; w > 0; w >>= 1) {
        if (lane < w) part[lid] = is_max ? fmax(part[lid], part[lid + w]) : part[lid] + part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    v = part[lid - lane];
    barrier(CLK_LOCAL_MEM_FENCE);  // part[] is written again by the next call
    return v;
}

// softmax_rows_fwd / softmax_rows_bwd: softmax (log: log-softmax) over the last dimension of (rows, C), GPU-shaped:
// `lanes` neighbouring work-items of a group of LSIZE share a row (softmax.cl's kernels give a row to one
// work-item, whose neighbours then read C elements apart), LSIZE / lanes rows a group. Forward y from x; backward
// dx from the output y and its gradient dy: y (dy - sum(dy y)), or for log-softmax dy - exp(y) sum(dy).
__kernel void softmax_rows_fwd(__global const float* restrict x, OFFSET_PARAM(x), __global float* restrict y,
                               OFFSET_PARAM(y), const int rows, const int C, const int lanes, const int log_softmax) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y)
    __local float part[LSIZE];
    const int lid = get_local_id(0), lane = lid & (lanes - 1);
    const int row = get_group_id(0) * (LSIZE / lanes) + lid / lanes;
    const int n = row < rows ? C : 0, base = row * C;
    float m = -INFINITY;
    for (int c = lane; c < n; c += lanes) m = fmax(m, x[base + c]);
    m = lanes_combine(m, part, lid, lane, lanes, 1);
    float s = 0.0f;
    for (int c = lane; c < n; c += lanes) s += exp(x[base + c] - m);
    s = lanes_combine(s, part, lid, lane, lanes, 0);
    if (log_softmax) {
        const float lse = m + log(s);
        for (int c = lane; c < n; c += lanes) y[base + c] = x[base + c] - lse;
    } else {
        const float inv = 1.0f / s;
        for (int c = lane; c < n; c += lanes) y[base + c] = exp(x[base + c] - m) * inv;
    }
}

__kernel void softmax_rows_bwd(__global const float* restrict y, OFFSET_PARAM(y), __global const float* restrict dy,
                               OFFSET_PARAM(dy), __global float* restrict dx, OFFSET_PARAM(dx), const int rows,
                               const int C, const int lanes, const int log_softmax) {
    AT_OFFSET(__global const float*, y) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    __local float part[LSIZE];
    const int lid = get_local_id(0), lane = lid & (lanes - 1);
    const int row = get_group_id(0) * (LSIZE / lanes) + lid / lanes;
    const int n = row < rows ? C : 0, base = row * C;
    float s = 0.0f;
    for (int c = lane; c < n; c += lanes) s += log_softmax ? dy[base + c] : dy[base + c] * y[base + c];
    s = lanes_combine(s, part, lid, lane, lanes, 0);
    for (int c = lane; c < n; c += lanes)
        dx[base + c] = log_softmax ? dy[base + c] - exp(y[base + c]) * s : y[base + c] * (dy[base + c] - s);
}
