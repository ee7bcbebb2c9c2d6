// Softmax family over one axis of a tensor viewed as (outer, C, inner), and the cross-entropy loss.
//   softmax_fwd / softmax_bwd  one work-item per (outer, inner) position; LOG selects log-softmax
//   cross_entropy  logits (N, C), int labels (N): loss = mean_i (logsumexp(z_i) - z_i[label_i]) written to loss[0],
//                  grad = (softmax(z) - onehot) / N, and metrics = (loss, rows whose first argmax is the label), so a
//                  training loop reads one 8-byte buffer per step instead of the logits; one work-group of LSIZE
//                  does the whole batch in one launch, `lanes` work-items a row
//   cross_entropy_part  the same over one run of rows of a batch too large for one launch, adding into loss and
//                  metrics after the first run
// Defines: LOG 0/1, LSIZE (a power of two).
#include "common.h"

#ifndef LOG
#define LOG 0       // log-softmax instead of softmax
#endif
#ifndef LSIZE
#define LSIZE 256   // cross_entropy work-group size
#endif

__kernel void softmax_fwd(__global const float* restrict x, OFFSET_PARAM(x), __global float* restrict y,
                          OFFSET_PARAM(y), const int outer, const int C, const int inner) {
    AT_OFFSET(__global const float*, x) AT_OFFSET(__global float*, y)
    const int e = get_global_id(0);
    if (e >= outer * inner) return;
    const int base = (e / inner) * C * inner + e % inner;
    float mx = -INFINITY;
    for (int c = 0; c < C; c++) mx = fmax(mx, x[base + c * inner]);
    float s = 0.0f;
    for (int c = 0; c < C; c++) s += exp(x[base + c * inner] - mx);
#if LOG
    const float lse = mx + log(s);
    for (int c = 0; c < C; c++) y[base + c * inner] = x[base + c * inner] - lse;
#else
    const float inv = 1.0f / s;
    for (int c = 0; c < C; c++) y[base + c * inner] = exp(x[base + c * inner] - mx) * inv;
#endif
}

__kernel void softmax_bwd(__global const float* restrict y, OFFSET_PARAM(y), __global const float* restrict dy,
                          OFFSET_PARAM(dy), __global float* restrict dx, OFFSET_PARAM(dx), const int outer, const int C,
                          const int inner) {
    AT_OFFSET(__global const float*, y) AT_OFFSET(__global const float*, dy) AT_OFFSET(__global float*, dx)
    const int e = get_global_id(0);
    if (e >= outer * inner) return;
    const int base = (e / inner) * C * inner + e % inner;
    float s = 0.0f;
#if LOG
    for (int c = 0; c < C; c++) s += dy[base + c * inner];
    for (int c = 0; c < C; c++) dx[base + c * inner] = dy[base + c * inner] - exp(y[base + c * inner]) * s;
#else
    for (int c = 0; c < C; c++) s += dy[base + c * inner] * y[base + c * inner];
    for (int c = 0; c < C; c++) dx[base + c * inner] = y[base + c * inner] * (dy[base + c * inner] - s);
#endif
}

// The work-group's sums of every work-item's v, in work-item 0's result (a pairwise tree in local memory).
inline float2 group_sum2(float2 v, __local float2* part, const int lid) {
    part[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = LSIZE / 2; w > 0; w >>= 1) {
        if (lid < w) part[lid] += part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}

// v summed over the `lanes` work-items that share a row (lid's run of lanes in part), returned to each of them.
inline float lanes_sum(const float v, __local float* part, const int lid, const int lanes) {
    const int lane = lid % lanes;
    part[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = lanes / 2; w > 0; w >>= 1) {
        if (lane < w) part[lid] += part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float s = part[lid - lane];
    barrier(CLK_LOCAL_MEM_FENCE);  // part is written again by the next use
    return s;
}

// Rows of cross_entropy, `lanes` work-items a row (a power of two dividing LSIZE), LSIZE / lanes rows at a time:
// lane l reads columns l, l + lanes, ... (neighbouring work-items read neighbouring floats), and a row's maximum,
// first argmax and sum are combined across its lanes in local memory. Writes the gradient rows, scaled by invN, and
// returns (the loss summed over this work-item's rows, rows whose first argmax is the label) in lane 0, zeros in
// the other lanes.
inline float2 cross_entropy_rows(__global const float* restrict z, __global const int* restrict labels, const int N,
                                 const int C, const float invN, __global float* restrict grad, const int lid,
                                 const int lanes, __local float* part, __local int* part_arg) {
    const int lane = lid % lanes;
    float total = 0.0f, correct = 0.0f;
    for (int first = 0; first < N; first += LSIZE / lanes) {  // the same trip count in every work-item (barriers)
        const int i = first + lid / lanes;
        const bool live = i < N;
        __global const float* row = z + (live ? i : 0) * C;
        // Each lane's first maximum (a NaN never is one), then the lanes' maximum, a tie going to the lower column:
        // the row's first argmax, as a scan of the row finds it.
        float mx = -INFINITY;
        int arg = lane;
        for (int c = lane; live && c < C; c += lanes)
            if (row[c] > mx) { mx = row[c]; arg = c; }
        part[lid] = mx;
        part_arg[lid] = arg;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int w = lanes / 2; w > 0; w >>= 1) {
            if (lane < w) {
                const float m2 = part[lid + w];
                const int a2 = part_arg[lid + w];
                if (m2 > part[lid] || (m2 == part[lid] && a2 < part_arg[lid])) {
                    part[lid] = m2;
                    part_arg[lid] = a2;
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        mx = part[lid - lane];
        arg = part_arg[lid - lane];
        barrier(CLK_LOCAL_MEM_FENCE);
        const int label = live ? labels[i] : 0;
        // The label's gradient, p - 1, is computed as -(sum of the other classes' terms) / s: the direct form
        // cancels when p is close to 1 and loses most of its float32 digits.
        float mine = 0.0f;
        for (int c = lane; live && c < C; c += lanes)
            if (c != label) mine += exp(row[c] - mx);
        const float others = lanes_sum(mine, part, lid, lanes);
        if (!live) continue;
        if (label < 0 || label >= C) {  // a label the host could not check: poison the row, never read past it
            if (lane == 0) total += NAN;
            for (int c = lane; c < C; c += lanes) grad[i * C + c] = NAN;
            continue;
        }
        const float s = others + exp(row[label] - mx);
        if (lane == 0) {
            total += mx + log(s) - row[label];
            correct += (arg == label) ? 1.0f : 0.0f;
        }
        const float inv = 1.0f / s;
        for (int c = lane; c < C; c += lanes)
            grad[i * C + c] = (c == label ? -others : exp(row[c] - mx)) * inv * invN;
    }
    return (float2)(total, correct);
}

__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void cross_entropy(__global const float* restrict z, OFFSET_PARAM(z), __global const int* restrict labels,
                   OFFSET_PARAM(labels), const int N, const int C, const int lanes, __global float* restrict grad,
                   OFFSET_PARAM(grad), __global float* restrict loss, OFFSET_PARAM(loss),
                   __global float* restrict metrics, OFFSET_PARAM(metrics)) {
    AT_OFFSET(__global const float*, z) AT_OFFSET(__global const int*, labels) AT_OFFSET(__global float*, grad)
    AT_OFFSET(__global float*, loss) AT_OFFSET(__global float*, metrics)
    const int lid = get_local_id(0);
    __local float2 part[LSIZE];
    __local float row_part[LSIZE];
    __local int row_arg[LSIZE];
    const float invN = 1.0f / (float)N;
    const float2 sums = group_sum2(cross_entropy_rows(z, labels, N, C, invN, grad, lid, lanes, row_part, row_arg),
                                   part, lid);
    if (lid == 0) {
        loss[0] = sums.x * invN;
        metrics[0] = sums.x * invN;
        metrics[1] = sums.y;
    }
}

// cross_entropy over rows past clnet's index limit, a launch per run of N of them: invN is 1 / all the rows, and
// every launch but the first (first == 0) adds to loss and metrics.
__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void cross_entropy_part(__global const float* restrict z, OFFSET_PARAM(z), __global const int* restrict labels,
                        OFFSET_PARAM(labels), const int N, const int C, const int lanes, const float invN,
                        const int first, __global float* restrict grad, OFFSET_PARAM(grad),
                        __global float* restrict loss, OFFSET_PARAM(loss), __global float* restrict metrics,
                        OFFSET_PARAM(metrics)) {
    AT_OFFSET(__global const float*, z) AT_OFFSET(__global const int*, labels) AT_OFFSET(__global float*, grad)
    AT_OFFSET(__global float*, loss) AT_OFFSET(__global float*, metrics)
    const int lid = get_local_id(0);
    __local float2 part[LSIZE];
    __local float row_part[LSIZE];
    __local int row_arg[LSIZE];
    const float2 sums = group_sum2(cross_entropy_rows(z, labels, N, C, invN, grad, lid, lanes, row_part, row_arg),
                                   part, lid);
    if (lid == 0) {
        const float mean = sums.x * invN;
        loss[0] = first ? mean : loss[0] + mean;
        metrics[0] = first ? mean : metrics[0] + mean;
        metrics[1] = first ? sums.y : metrics[1] + sums.y;
    }
}
