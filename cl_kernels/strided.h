// Strided reads for the general tensor ops (clnet/layout.py): a layout is an int32 array `meta` of NDIM sizes
// followed by NDIM strides (in elements) per operand; stride 0 along a dimension an operand broadcasts over.
// Defines: NDIM (1..8), the rank after coalescing.
#ifndef CLNET_STRIDED_H
#define CLNET_STRIDED_H

#ifndef NDIM
#define NDIM 1      // dimensions of the layout
#endif
#if NDIM < 1 || NDIM > 8
#error "NDIM must lie in 1..8"
#endif

// The element offset of operand `op` at the row-major index i of the layout's shape.
inline int strided_offset(__global const int* meta, const int op, int i) {
#if NDIM == 1
    return i * meta[1 + op];
#else
    int off = 0;
    for (int d = NDIM - 1; d > 0; d--) {
        const int size = meta[d];
        off += (i % size) * meta[NDIM * (1 + op) + d];
        i /= size;
    }
    return off + i * meta[NDIM * (1 + op)];
#endif
}

// strided_offset of operands 0 and 1 at once, added to *a and *b: i is the row-major index over the layout's first
// `lead` dimensions (1..NDIM), with one division per dimension for both operands.
inline void strided_offsets2(__global const int* meta, const int lead, int i, int* a, int* b) {
#pragma unroll
    for (int d = lead - 1; d > 0; d--) {
        const int size = meta[d], k = i % size;
        i /= size;
        *a += k * meta[NDIM + d];
        *b += k * meta[2 * NDIM + d];
    }
    *a += i * meta[NDIM];
    *b += i * meta[2 * NDIM];
}

#endif
