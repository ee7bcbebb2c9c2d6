// Views and indexing (clnet/views.py): every op that moves elements without arithmetic, for any element type, and
// the sums their backward passes need. Tensors are contiguous; a view (a permutation, a slice, an expansion) is
// described by strides (in elements) from a base element, through strided.h's layouts (`meta`).
//   strided_copy   dst[dst_base + off(meta, 0, i)] = src[src_base + off(meta, 1, i)] for i < n: permute, slicing,
//                  expand and repeat (dst contiguous), a slice's backward and cat (dst a window, src contiguous),
//                  x[...] = tensor (dst a window, src broadcast)
//   strided_copy_rows  the same in a 2-D launch (c, r): c the coordinate along the layout's last dimension, r the
//                  row over the others, so that a CPU's compiler finds the row's offsets (its divisions) uniform across
//                  the work-items it vectorises along c, and a GPU's neighbours along c touch neighbouring memory
//   strided_fill   dst[dst_base + off(meta, 0, i)] = value (its bits, as an int) for i < n: x[...] = number
//   strided_sum    dst[dst_base + off(keep, 0, i)] = sum over r < nred of src[off(keep, 1, i) + off(red, 0, r)]:
//                  the backward of expand and repeat, which sums the gradient over the broadcast dimensions (float)
//   index_select_fwd  out (outer, K, inner) = x (outer, D, inner) at index[k] along D (negative indices wrap); a
//                  2-D launch (inner, outer * K)
//   index_select_bwd  dx (outer, D, inner): each element sums dy over the k whose index[k] is its own (a loop over
//                  the K indices per element: deterministic and atomic-free, O(K) per element)
//   index_links    for each k < K: links[k] = the next k' > k with the same index (-1: none), links[K + k] = 1
//                  where no k' < k has it (k heads its chain); O(K) per k, comparisons of indices only
//   index_select_bwd_chain  dx (outer, D, inner), zero-filled first: the head k of each chain sums dy over its
//                  chain in order of k and writes the element its index names (O(K + D) per column in all: the
//                  backward of a large table, an embedding's, which index_select_bwd would scan K times per element)
//   gather_fwd     out[i] = x[x_base + off(meta, 0, i) + index[i] * dstride], i over index's shape (torch.gather)
//   gather_bwd     dx[j] = sum of dy[i] over the i whose gather read j: element j loops over index's extent along
//                  dim (atomic-free); its meta holds x's sizes, index's sizes and index's strides, not coalesced
//   pad_fwd        out (outer, A, B, C) from x (outer, a, b, c) padded by (pa, pb, pc) before each dimension: x's
//                  mirror image without the edge (MODE 1, reflect) or x's edge (2, replicate); a 3-D launch (C, B,
//                  outer * A) (a constant pad is a fill and a strided copy)
//   pad_fold       dx (outer, s, inner) = the sum of dy (outer, m, inner) over the positions along m that read each
//                  element of s, for one padded dimension (pad before it p); a padding's backward folds each of its
//                  dimensions in turn; a 3-D launch (inner, s, outer)
// An index outside [-D, D) reads `oob` (NaN's bits for floats) instead of memory outside x. Launches are of exactly
// the work-items there are (no padding), and the kernels that read a layout from `meta` have no bounds test: PoCL
// vectorises them only without one (a copy of 2.8M elements took 2-8 ms with a test against a size argument, 0.22 ms
// without; a plain copy 0.24 ms).
// Defines: ELEM (the element type moved: uint for 4-byte types, whose bits are copied unchanged, uchar for bool),
// NDIM (strided.h), MODE (pad: 1 reflect, 2 replicate).
#include "common.h"
#include "strided.h"

#ifndef ELEM
#define ELEM uint   // element type: its bits are moved, never converted
#endif
#ifndef MODE
#define MODE 1      // pad mode: 1 reflect, 2 replicate
#endif
#if MODE < 1 || MODE > 2
#error "MODE must be 1 (reflect) or 2 (replicate)"
#endif

__kernel void strided_copy(__global ELEM* restrict dst, OFFSET_PARAM(dst), const int dst_base,
                           __global const ELEM* restrict src, OFFSET_PARAM(src), const int src_base,
                           __global const int* restrict meta, OFFSET_PARAM(meta)) {
    AT_OFFSET(__global ELEM*, dst) AT_OFFSET(__global const ELEM*, src) AT_OFFSET(__global const int*, meta)
    int a = dst_base, b = src_base;
    strided_offsets2(meta, NDIM, get_global_id(0), &a, &b);
    dst[a] = src[b];
}

__kernel void strided_copy_rows(__global ELEM* restrict dst, OFFSET_PARAM(dst), const int dst_base,
                                __global const ELEM* restrict src, OFFSET_PARAM(src), const int src_base,
                                __global const int* restrict meta, OFFSET_PARAM(meta)) {
    AT_OFFSET(__global ELEM*, dst) AT_OFFSET(__global const ELEM*, src) AT_OFFSET(__global const int*, meta)
    const int c = get_global_id(0), r = get_global_id(1);
    int a = dst_base + c * meta[2 * NDIM - 1], b = src_base + c * meta[3 * NDIM - 1];
#if NDIM > 1
    strided_offsets2(meta, NDIM - 1, r, &a, &b);
#endif
    dst[a] = src[b];
}

__kernel void strided_fill(__global ELEM* restrict dst, OFFSET_PARAM(dst), const int dst_base,
                           __global const int* restrict meta, OFFSET_PARAM(meta), const int value) {
    AT_OFFSET(__global ELEM*, dst) AT_OFFSET(__global const int*, meta)
    dst[dst_base + strided_offset(meta, 0, get_global_id(0))] = (ELEM)value;
}

__kernel void strided_sum(__global float* restrict dst, OFFSET_PARAM(dst), const int dst_base,
                          __global const float* restrict src, OFFSET_PARAM(src), __global const int* restrict keep,
                          OFFSET_PARAM(keep), __global const int* restrict red, OFFSET_PARAM(red), const int nred) {
    AT_OFFSET(__global float*, dst) AT_OFFSET(__global const float*, src) AT_OFFSET(__global const int*, keep)
    AT_OFFSET(__global const int*, red)
    const int i = get_global_id(0);
    const int from = strided_offset(keep, 1, i);
    // Blocks of 64 added into the total: the chains of float32 additions stay short for long sums.
    float total = 0.0f;
    for (int r0 = 0; r0 < nred; r0 += 64) {
        const int r1 = min(r0 + 64, nred);
        float part = 0.0f;
        for (int r = r0; r < r1; r++) part += src[from + strided_offset(red, 0, r)];
        total += part;
    }
    dst[dst_base + strided_offset(keep, 0, i)] = total;
}

__kernel void index_select_fwd(__global const ELEM* restrict x, OFFSET_PARAM(x), __global const int* restrict index,
                               OFFSET_PARAM(index), __global ELEM* restrict out, OFFSET_PARAM(out), const int K,
                               const int D, const int inner, const int oob) {
    AT_OFFSET(__global const ELEM*, x) AT_OFFSET(__global const int*, index) AT_OFFSET(__global ELEM*, out)
    const int e = get_global_id(0), ok = get_global_id(1);  // (inner, outer * K)
    const int k = ok % K, o = ok / K;
    int j = index[k];
    j = j < 0 ? j + D : j;
    out[ok * inner + e] = (j >= 0 && j < D) ? x[(o * D + j) * inner + e] : (ELEM)oob;
}

__kernel void index_select_bwd(__global const float* restrict dy, OFFSET_PARAM(dy), __global const int* restrict index,
                               OFFSET_PARAM(index), __global float* restrict dx, OFFSET_PARAM(dx), const int K,
                               const int D, const int inner) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const int*, index) AT_OFFSET(__global float*, dx)
    const int e = get_global_id(0), oj = get_global_id(1);  // (inner, outer * D)
    const int j = oj % D, o = oj / D;
    __global const float* row = dy + o * K * inner + e;
    float total = 0.0f;
    for (int k = 0; k < K; k++) {
        const int t = index[k];
        if (t == j || t + D == j) total += row[k * inner];
    }
    dx[oj * inner + e] = total;
}

__kernel void index_links(__global const int* restrict index, OFFSET_PARAM(index), __global int* restrict links,
                          OFFSET_PARAM(links), const int K, const int D) {
    AT_OFFSET(__global const int*, index) AT_OFFSET(__global int*, links)
    const int k = get_global_id(0);
    if (k >= K) return;
    const int t = index[k] < 0 ? index[k] + D : index[k];
    int next = -1, head = 1;
    for (int m = 0; m < K; m++) {
        const int s = index[m] < 0 ? index[m] + D : index[m];
        if (s != t) continue;
        if (m < k) head = 0;
        else if (m > k && next < 0) next = m;
    }
    links[k] = next;
    links[K + k] = head;
}

__kernel void index_select_bwd_chain(__global const float* restrict dy, OFFSET_PARAM(dy),
                                     __global const int* restrict index, OFFSET_PARAM(index),
                                     __global const int* restrict links, OFFSET_PARAM(links),
                                     __global float* restrict dx, OFFSET_PARAM(dx), const int K, const int D,
                                     const int inner) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const int*, index) AT_OFFSET(__global const int*, links)
    AT_OFFSET(__global float*, dx)
    const int e = get_global_id(0), ok = get_global_id(1);  // (inner, outer * K), over dy
    const int k = ok % K, o = ok / K;
    const int j = index[k] < 0 ? index[k] + D : index[k];
    if (!links[K + k] || j < 0 || j >= D) return;
    __global const float* column = dy + o * K * inner + e;
    float total = 0.0f;
    for (int m = k; m >= 0; m = links[m]) total += column[m * inner];
    dx[(o * D + j) * inner + e] = total;
}

__kernel void gather_fwd(__global const ELEM* restrict x, OFFSET_PARAM(x), const int x_base,
                         __global const int* restrict index, OFFSET_PARAM(index), __global ELEM* restrict out,
                         OFFSET_PARAM(out), __global const int* restrict meta, OFFSET_PARAM(meta), const int dstride,
                         const int D, const int oob) {
    AT_OFFSET(__global const ELEM*, x) AT_OFFSET(__global const int*, index) AT_OFFSET(__global ELEM*, out)
    AT_OFFSET(__global const int*, meta)
    const int i = get_global_id(0);
    int j = index[i];
    j = j < 0 ? j + D : j;
    out[i] = (j >= 0 && j < D) ? x[x_base + strided_offset(meta, 0, i) + j * dstride] : (ELEM)oob;
}

// meta: x's NDIM sizes, index's NDIM sizes, index's NDIM strides (elements; index and dy share them).
__kernel void gather_bwd(__global const float* restrict dy, OFFSET_PARAM(dy), __global const int* restrict index,
                         OFFSET_PARAM(index), __global float* restrict dx, OFFSET_PARAM(dx),
                         __global const int* restrict meta, OFFSET_PARAM(meta), const int dim) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global const int*, index) AT_OFFSET(__global float*, dx)
    AT_OFFSET(__global const int*, meta)
    const int i = get_global_id(0);
    int rest = i, off = 0, t = 0;
    for (int d = NDIM - 1; d >= 0; d--) {
        const int c = rest % meta[d];
        rest /= meta[d];
        if (d == dim) {
            t = c;
        } else {
            if (c >= meta[NDIM + d]) {  // past index's extent: no gather read this element
                dx[i] = 0.0f;
                return;
            }
            off += c * meta[2 * NDIM + d];
        }
    }
    const int D = meta[dim], M = meta[NDIM + dim], step = meta[2 * NDIM + dim];
    float total = 0.0f;
    for (int m = 0; m < M; m++) {
        const int s = index[off + m * step];
        if (s == t || s + D == t) total += dy[off + m * step];
    }
    dx[i] = total;
}

// The input coordinate that output coordinate o reads along a dimension of input size s padded by p before it.
inline int pad_source(const int o, const int s, const int p) {
    const int j = o - p;
#if MODE == 1
    return j < 0 ? -j : (j >= s ? 2 * (s - 1) - j : j);
#else
    return clamp(j, 0, s - 1);
#endif
}

__kernel void pad_fwd(__global const ELEM* restrict x, OFFSET_PARAM(x), __global ELEM* restrict out, OFFSET_PARAM(out),
                      const int A, const int B, const int C, const int a, const int b, const int c, const int pa,
                      const int pb, const int pc) {
    AT_OFFSET(__global const ELEM*, x) AT_OFFSET(__global ELEM*, out)
    const int oc = get_global_id(0), ob = get_global_id(1), rest = get_global_id(2);  // (C, B, outer * A)
    if (ob >= B) return;  // the launch's rows are rounded up to its work-groups
    const int oa = rest % A, outer = rest / A;
    const int jc = pad_source(oc, c, pc), jb = pad_source(ob, b, pb), ja = pad_source(oa, a, pa);
    out[(rest * B + ob) * C + oc] = x[((outer * a + ja) * b + jb) * c + jc];
}

__kernel void pad_fold(__global const float* restrict dy, OFFSET_PARAM(dy), __global float* restrict dx,
                       OFFSET_PARAM(dx), const int m, const int s, const int p, const int inner, const int rows) {
    AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int e = get_global_id(0), j = get_global_id(1), o = get_global_id(2);  // (inner, s, outer)
    if (j >= rows) return;  // the launch's rows are rounded up to its work-groups
    __global const float* column = dy + o * m * inner + e;
#if MODE == 1
    // j itself, its mirror before the start, its mirror past the end
    float total = column[(j + p) * inner];
    if (j > 0 && p - j >= 0) total += column[(p - j) * inner];
    if (j < s - 1 && p + 2 * (s - 1) - j < m) total += column[(p + 2 * (s - 1) - j) * inner];
#else
    // j itself, and at an edge the padding beside it
    const int lo = j == 0 ? 0 : j + p, hi = j == s - 1 ? m - 1 : j + p;
    float total = 0.0f;
    for (int q = lo; q <= hi; q++) total += column[q * inner];
#endif
    dx[(o * s + j) * inner + e] = total;
}
