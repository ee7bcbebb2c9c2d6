// Shared helpers for clnet kernels. Tensors are float32, row-major (NCHW for images); every offset and stride is in
// elements, not bytes.
#ifndef CLNET_COMMON_H
#define CLNET_COMMON_H

// Round-up integer division for non-negative a and positive b.
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// Counter-based hash (a 32-bit integer mix): a reproducible random stream from (seed, index) with no state.
inline uint clnet_hash(uint x) {
    x ^= x >> 16; x *= 0x7feb352dU;
    x ^= x >> 15; x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

#endif
