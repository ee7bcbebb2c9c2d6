// Tensors made on the device (clnet/creation.py): constants, ranges, identity matrices and random draws, each
// element computed from its index alone.
//   fill_value   x[i] = value (of the element type T; value passed as a float, exact for |int| < 2^24, or as int)
//   arange_fwd   x[i] = start + i * step (linspace: step = (end - start) / (n - 1), the last element end itself)
//   eye_fwd      x[r, c] = r == c, for a (rows, cols) matrix
//   rand_uniform x[i] in [low, high): a counter-based hash of (seed, i), 24 random bits a draw
//   rand_normal  x[i] ~ N(mean, std): Box-Muller of two such draws
//   randint_fwd  x[i] uniform in [low, high): the hash modulo the range (the bias is below 2^-31 for small ranges)
// Defines: T (the element type, float or int), INT_VALUE (fill_value takes an int), LAST_EXACT (arange: write end
// itself as the last element, linspace).
#include "common.h"

#ifndef T
#define T float       // element type
#endif
#ifndef INT_VALUE
#define INT_VALUE 0   // fill_value's value is an int
#endif
#ifndef LAST_EXACT
#define LAST_EXACT 0  // arange_fwd writes `end` as its last element (linspace)
#endif

#if INT_VALUE
__kernel void fill_value(__global T* x, OFFSET_PARAM(x), const int value, const int n) {
    AT_OFFSET(__global T*, x)
#else
__kernel void fill_value(__global T* x, OFFSET_PARAM(x), const float value, const int n) {
    AT_OFFSET(__global T*, x)
#endif
    const int i = get_global_id(0);
    if (i < n) x[i] = (T)value;
}

__kernel void arange_fwd(__global T* x, OFFSET_PARAM(x), const float start, const float step, const float end,
                         const int n) {
    AT_OFFSET(__global T*, x)
    const int i = get_global_id(0);
    if (i < n) {
#if LAST_EXACT
        x[i] = (T)(i == n - 1 && n > 1 ? end : start + i * step);
#else
        x[i] = (T)(start + i * step);
#endif
    }
}

__kernel void arange_int(__global int* x, OFFSET_PARAM(x), const int start, const int step, const int n) {
    AT_OFFSET(__global int*, x)
    const int i = get_global_id(0);
    if (i < n) x[i] = start + i * step;
}

__kernel void eye_fwd(__global T* x, OFFSET_PARAM(x), const int rows, const int cols) {
    AT_OFFSET(__global T*, x)
    const int i = get_global_id(0);
    if (i < rows * cols) x[i] = (T)(i / cols == i % cols);
}

inline float unit_draw(const uint seed, const uint i, const uint stream) {
    // 24 bits: every value k / 2^24 in [0, 1) exactly representable in float32
    return (float)(clnet_hash(clnet_hash(i * 2u + stream) ^ seed) >> 8) * (1.0f / 16777216.0f);
}

__kernel void rand_uniform(__global float* x, OFFSET_PARAM(x), const uint seed, const float low, const float high,
                           const int n) {
    AT_OFFSET(__global float*, x)
    const int i = get_global_id(0);
    if (i < n) x[i] = low + (high - low) * unit_draw(seed, (uint)i, 0u);
}

__kernel void rand_normal(__global float* x, OFFSET_PARAM(x), const uint seed, const float mean, const float std,
                          const int n) {
    AT_OFFSET(__global float*, x)
    const int i = get_global_id(0);
    if (i < n) {
        const float u1 = 1.0f - unit_draw(seed, (uint)i, 0u);  // in (0, 1]: log(u1) is finite
        const float u2 = unit_draw(seed, (uint)i, 1u);
        x[i] = mean + std * sqrt(-2.0f * log(u1)) * cos(6.2831853071795865f * u2);
    }
}

__kernel void randint_fwd(__global int* x, OFFSET_PARAM(x), const uint seed, const int low, const uint range,
                          const int n) {
    AT_OFFSET(__global int*, x)
    const int i = get_global_id(0);
    if (i < n) x[i] = low + (int)(clnet_hash(clnet_hash((uint)i * 2u) ^ seed) % range);
}
