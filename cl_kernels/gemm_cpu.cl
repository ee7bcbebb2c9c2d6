// CPU-shaped matrix product (see gemm_common.h for the operand layout, split-K and the epilogue defines).
//   gemm_block  each work-item computes RM rows x 16 columns straight from global memory (rows of B as two float8
//               where they are contiguous), no local memory and no barriers: PoCL turns each work-item into a loop
//               body, and a register block with wide vector loads is what a CPU core runs well.
//               Global: (ceil(N/16), ceil(M/RM), batch * ksplit); small work-groups.
// Defines (besides gemm_common.h's):
//   RM        rows per work-item
//   B_CONTIG  0/1: B rows may be loaded as float8 pairs (B's column stride is 1 and no split)
#include "gemm_common.h"

#ifndef RM
#define RM 4        // rows per work-item
#endif
#ifndef B_CONTIG
#define B_CONTIG 0  // B rows contiguous
#endif
#if B_CONTIG && B_SPLIT
#error "B_CONTIG needs an unsplit B"
#endif

// 16 columns as two float8 halves: float8 is one AVX2 register, and PoCL miscompiles float16 on CPUs without
// AVX-512 (the upper half comes back as zeros).
#define VEC8_FROM(t, o) (float8)(t[o], t[o + 1], t[o + 2], t[o + 3], t[o + 4], t[o + 5], t[o + 6], t[o + 7])
#define VEC8_PARTS(v) v.s0, v.s1, v.s2, v.s3, v.s4, v.s5, v.s6, v.s7

__kernel void gemm_block(GEMM_ARGS) {
    const int n0 = get_global_id(0) * 16;
    const int m0 = get_global_id(1) * RM;
    const int z = get_global_id(2), b = z / ksplit;
    const int kbeg = (z % ksplit) * kc, kend = min(K, kbeg + kc);
    if (n0 >= N || m0 >= M) return;
    __global const float* Ab = A + a_off + b * a_bs;
    __global const float* Bb = B + b_off + b * b_bs;
    const bool full_n = n0 + 16 <= N;

    float8 lo[RM], hi[RM];
    int arow[RM];
    for (int i = 0; i < RM; i++) {
        lo[i] = (float8)(0.0f);
        hi[i] = (float8)(0.0f);
        arow[i] = min(m0 + i, M - 1) * a_rs;  // rows past M repeat the last row; never stored
    }
    for (int k = kbeg; k < kend; k++) {
        float8 blo, bhi;
#if B_CONTIG
        if (full_n) {
            blo = vload8(0, Bb + k * b_rs + n0);
            bhi = vload8(1, Bb + k * b_rs + n0);
        } else
#endif
        {
            float t[16];
            for (int j = 0; j < 16; j++) t[j] = (n0 + j < N) ? Bb[k * b_rs + B_COL(n0 + j)] : 0.0f;
            blo = VEC8_FROM(t, 0);
            bhi = VEC8_FROM(t, 8);
        }
        const int acol = A_COL(k);
        for (int i = 0; i < RM; i++) {
            const float a = Ab[arow[i] + acol];
            lo[i] += a * blo;
            hi[i] += a * bhi;
        }
    }

    __global float* Cb = C + c_off + z * c_bs;
    __global const float* biasb = bias + b * bias_bs;
    for (int i = 0; i < RM; i++) {
        const int gm = m0 + i;
        if (gm >= M) break;
        const float8 vl = lo[i], vh = hi[i];
        const float t[16] = {VEC8_PARTS(vl), VEC8_PARTS(vh)};
        for (int j = 0; j < 16; j++) {
            const int gn = n0 + j;
            if (gn >= N) break;
            const int ci = gm * c_rs + C_COL(gn);
            Cb[ci] = epilogue(t[j], alpha, beta, Cb, ci, biasb, BIAS == 1 ? gm : gn);
        }
    }
}
