// CPU-shaped matrix product (see gemm_common.h for the operand layout, split-K and the run-time epilogue).
//   gemm_block  each work-item computes RM rows x 16 columns of C straight from global memory: no local memory, no
//               barriers, so PoCL turns each work-item into one loop body. The core is a register block of MR rows
//               x 16 columns (2 * MR float8 accumulators) that broadcasts one element of A per row and k.
//               KC > 0: K is walked in slices of KC; per slice the work-item copies its KC x 16 sliver of B into
//               private memory (contiguous, so it stays in L1 whatever B's layout: rows of B a multiple of 4 KiB
//               apart would all fall in one L1 set), then runs the register block over it once per MR rows.
//               Where B is k-fast (b_rs == 1: weight gradients, Linear's forward), the copy loads 8 consecutive k of
//               each of 8 columns as vectors and transposes them in registers, instead of gathering 16 scalars per k
//               from 16 columns (often a multiple of 4 KiB apart, so their 16 cache lines share one L1 set).
//               Each slice's sums start from zero in registers and are then added to the totals, which wait in
//               private memory between slices: a two-level sum, whose float32 error grows with KC + K/KC terms
//               instead of K (a Linear layer of 36,864 inputs: 2.4e-6 -> 3.0e-7 from float64, NumPy's 3.2e-7;
//               bench/NOTES_cpu_gemm.md, v4).
//               KC == 0: each register block reads B in place over the whole k range (no private slivers).
//               Global: (ceil(N/16), ceil(M/RM), batch * ksplit); work-group (WG, 1, 1), or the driver's if WG 0.
// Defines (besides gemm_common.h's):
//   RM        rows per work-item; a multiple of MR
//   MR        rows per register block, 1..6 (AVX2 has 16 ymm registers: 2*MR accumulators, 2 of B, 1 of A)
//   KC        depth of one slice of K (the sliver is KC * 64 bytes); 0: no slices
//   WG        work-group size the host launches; KC > 0 needs 1..16, since PoCL keeps a copy of every work-item's
//             private arrays on its stack (its own choice, up to 4096 work-items, overflows it)
//   B_CONTIG  0/1: B's rows are contiguous (column stride 1, no split), so full rows load as float8 pairs
#include "gemm_common.h"
#if B_KSPLIT
#error "gemm_block reads B by rows: a row split of B is gemm_tiled's alone"
#endif

#ifndef RM
#define RM 4        // rows per work-item
#endif
#ifndef MR
#if RM % 6 == 0
#define MR 6        // rows per register block
#elif RM % 4 == 0
#define MR 4
#elif RM % 2 == 0
#define MR 2
#else
#define MR 1
#endif
#endif
#ifndef KC
#define KC 0        // depth of a K slice; 0: no slices, B read in place
#endif
#ifndef WG
#define WG 0        // work-items per work-group (along n) the host launches; 0: the driver picks
#endif
#ifndef B_CONTIG
#define B_CONTIG 0  // B rows contiguous
#endif
#if B_CONTIG && B_SPLIT
#error "B_CONTIG needs an unsplit B"
#endif
#if KC > 0 && (WG < 1 || WG > 16)
#error "KC > 0 needs an explicit small work-group (WG 1..16): PoCL keeps every work-item's private arrays on its stack"
#endif
#if MR < 1 || MR > 6 || RM % MR != 0
#error "MR must be 1..6 and divide RM"
#endif

// PoCL's builtins (min, fma, vload8) are calls it does not inline on this CPU, so the hot paths avoid them.
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define VEC8_AT(p, o) (float8)(p[o], p[o + 1], p[o + 2], p[o + 3], p[o + 4], p[o + 5], p[o + 6], p[o + 7])

// X(i) once per row of the register block.
#if MR == 1
#define FOR_ROWS(X) X(0)
#elif MR == 2
#define FOR_ROWS(X) X(0) X(1)
#elif MR == 3
#define FOR_ROWS(X) X(0) X(1) X(2)
#elif MR == 4
#define FOR_ROWS(X) X(0) X(1) X(2) X(3)
#elif MR == 5
#define FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4)
#else
#define FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#endif

// 16 columns as two float8 halves: float8 is one AVX2 register, and PoCL miscompiles float16 on CPUs without
// AVX-512 (the upper half comes back as zeros).
#define GATHER8(r, o) (float8)(r[bcol[o]], r[bcol[o + 1]], r[bcol[o + 2]], r[bcol[o + 3]], \
                               r[bcol[o + 4]], r[bcol[o + 5]], r[bcol[o + 6]], r[bcol[o + 7]])

// An unaligned float8 load from global memory (p + o is only float-aligned): LLVM sees one vector load, which it
// keeps as one (vmovups) and can shuffle; VEC8_AT's 8 scalar loads would be re-gathered through the shuffles below.
typedef float8 __attribute__((aligned(4))) float8_unaligned;
#define LOAD8(p, o) (*(__global const float8_unaligned*)((p) + (o)))

// 8x8 transpose: R0..R7 hold 8 consecutive k of 8 columns; OUT[0], OUT[2], .., OUT[14] get row k, k + 1, .., k + 7
// of those columns (every other float8, as the sliver interleaves two halves of 16 columns). Three rounds of
// two-source shuffles that AVX does in one instruction each: interleave pairs within each 128-bit half (unpcklps,
// unpckhps), pick pairs of pairs (shufps), join 128-bit halves (vperm2f128 / vinsertf128).
#define UNPACK_LO(x, y) (float8)(x.s0, y.s0, x.s1, y.s1, x.s4, y.s4, x.s5, y.s5)
#define UNPACK_HI(x, y) (float8)(x.s2, y.s2, x.s3, y.s3, x.s6, y.s6, x.s7, y.s7)
#define PAIR_LO(x, y) (float8)(x.s0, x.s1, y.s0, y.s1, x.s4, x.s5, y.s4, y.s5)
#define PAIR_HI(x, y) (float8)(x.s2, x.s3, y.s2, y.s3, x.s6, x.s7, y.s6, y.s7)
#define TRANSPOSE8(R0, R1, R2, R3, R4, R5, R6, R7, OUT) { \
        const float8 r0 = R0, r1 = R1, r2 = R2, r3 = R3, r4 = R4, r5 = R5, r6 = R6, r7 = R7; \
        const float8 t0 = UNPACK_LO(r0, r1), t1 = UNPACK_HI(r0, r1), t2 = UNPACK_LO(r2, r3), t3 = UNPACK_HI(r2, r3); \
        const float8 t4 = UNPACK_LO(r4, r5), t5 = UNPACK_HI(r4, r5), t6 = UNPACK_LO(r6, r7), t7 = UNPACK_HI(r6, r7); \
        const float8 u0 = PAIR_LO(t0, t2), u1 = PAIR_HI(t0, t2), u2 = PAIR_LO(t1, t3), u3 = PAIR_HI(t1, t3); \
        const float8 u4 = PAIR_LO(t4, t6), u5 = PAIR_HI(t4, t6), u6 = PAIR_LO(t5, t7), u7 = PAIR_HI(t5, t7); \
        (OUT)[0] = (float8)(u0.s0123, u4.s0123); \
        (OUT)[2] = (float8)(u1.s0123, u5.s0123); \
        (OUT)[4] = (float8)(u2.s0123, u6.s0123); \
        (OUT)[6] = (float8)(u3.s0123, u7.s0123); \
        (OUT)[8] = (float8)(u0.s4567, u4.s4567); \
        (OUT)[10] = (float8)(u1.s4567, u5.s4567); \
        (OUT)[12] = (float8)(u2.s4567, u6.s4567); \
        (OUT)[14] = (float8)(u3.s4567, u7.s4567); \
    }

// The register block: rows m .. m + MR - 1 (clamped to M - 1: never stored), k in [KFROM, KTO), row k of the 16
// columns of B given as two float8 expressions of k; it sums the range from zero and adds that to acc.
#define ROW_BEGIN(i) \
    __global const float* a##i = Ab + MIN(m + i, M - 1) * a_rs; \
    float8 lo##i = (float8)(0.0f), hi##i = (float8)(0.0f);
#if KC > 0 && A_SPLIT
#define A_AT(i, k) a##i[acol[(k) - k0]]
#else
#define A_AT(i, k) a##i[A_COL(k)]
#endif
#define ROW_STEP(i) { \
        const float8 av = (float8)(A_AT(i, k)); \
        lo##i += av * bl; \
        hi##i += av * bh; \
    }
#define ROW_END(i) acc[(s + i) * 2] += lo##i; acc[(s + i) * 2 + 1] += hi##i;
#define REGISTER_BLOCK(KFROM, KTO, BL, BH) { \
        FOR_ROWS(ROW_BEGIN) \
        for (int k = KFROM; k < KTO; k++) { \
            const float8 bl = BL, bh = BH; \
            FOR_ROWS(ROW_STEP) \
        } \
        FOR_ROWS(ROW_END) \
    }

#if WG
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
#else
__kernel
#endif
void gemm_block(GEMM_ARGS) {
    GEMM_AT_OFFSETS
    const int n0 = get_global_id(0) * 16;
    const int m0 = get_global_id(1) * RM;
    const int z = get_global_id(2), b = z / ksplit;
    const int kbeg = (z % ksplit) * kc, kend = MIN(K, kbeg + kc);
    if (n0 >= N || m0 >= M) return;
    const int rows = MIN(RM, M - m0), cols = MIN(16, N - n0);
    const bool fast_b = B_CONTIG && cols == 16;  // 16 contiguous columns: plain vector loads
    __global const float* Ab = A + a_off + b * a_bs;
    __global const float* Bb = B + b_off + b * b_bs;

    float8 acc[2 * RM];   // row r's 16 sums are acc[2r], acc[2r + 1]
    for (int r = 0; r < 2 * MIN(RM, CEIL_DIV(rows, MR) * MR); r++) acc[r] = (float8)(0.0f);
    int bcol[16];         // B's column offsets; columns past N repeat the last one (never stored)
    for (int j = 0; j < 16; j++) bcol[j] = B_COL(n0 + MIN(j, cols - 1));

#if KC > 0
    float8 bp[2 * KC];    // the sliver of B: row k0 + k of the slice is bp[2k], bp[2k + 1]
#if A_SPLIT
    int acol[KC];         // A's column offsets for the slice
#endif
    for (int k0 = kbeg; k0 < kend; k0 += KC) {
        const int kn = MIN(KC, kend - k0);
        __global const float* Bk = Bb + k0 * b_rs;
        if (fast_b) {
            for (int k = 0; k < kn; k++) {
                __global const float* r = Bk + k * b_rs + n0;
                bp[2 * k] = VEC8_AT(r, 0);
                bp[2 * k + 1] = VEC8_AT(r, 8);
            }
        } else if (b_rs == 1) {  // B(k, n) at Bk[k + bcol[n]], split or not
            const int k8 = kn & ~7;
            for (int h = 0; h < 2; h++) {  // columns 8h .. 8h + 7
                __global const float* c0 = Bk + bcol[8 * h];
                __global const float* c1 = Bk + bcol[8 * h + 1];
                __global const float* c2 = Bk + bcol[8 * h + 2];
                __global const float* c3 = Bk + bcol[8 * h + 3];
                __global const float* c4 = Bk + bcol[8 * h + 4];
                __global const float* c5 = Bk + bcol[8 * h + 5];
                __global const float* c6 = Bk + bcol[8 * h + 6];
                __global const float* c7 = Bk + bcol[8 * h + 7];
                for (int k = 0; k < k8; k += 8) {
                    TRANSPOSE8(LOAD8(c0, k), LOAD8(c1, k), LOAD8(c2, k), LOAD8(c3, k),
                               LOAD8(c4, k), LOAD8(c5, k), LOAD8(c6, k), LOAD8(c7, k), bp + 2 * k + h)
                }
            }
            for (int k = k8; k < kn; k++) {
                bp[2 * k] = GATHER8((Bk + k), 0);
                bp[2 * k + 1] = GATHER8((Bk + k), 8);
            }
        } else {
            for (int k = 0; k < kn; k++) {
                __global const float* r = Bk + k * b_rs;
                bp[2 * k] = GATHER8(r, 0);
                bp[2 * k + 1] = GATHER8(r, 8);
            }
        }
#if A_SPLIT
        for (int k = 0; k < kn; k++) acol[k] = A_COL(k0 + k);
#endif
        for (int s = 0; s < rows; s += MR) {
            const int m = m0 + s;
            REGISTER_BLOCK(k0, k0 + kn, bp[2 * (k - k0)], bp[2 * (k - k0) + 1])
        }
    }
#else
    for (int s = 0; s < rows; s += MR) {
        const int m = m0 + s;
        if (fast_b) {
            REGISTER_BLOCK(kbeg, kend, VEC8_AT((Bb + k * b_rs + n0), 0), VEC8_AT((Bb + k * b_rs + n0), 8))
        } else {
            REGISTER_BLOCK(kbeg, kend, GATHER8((Bb + k * b_rs), 0), GATHER8((Bb + k * b_rs), 8))
        }
    }
#endif

    __global float* Cb = C + c_off + z * c_bs;
    __global const float* biasb = bias + b * bias_bs;
    const float* sums = (const float*)acc;
    for (int i = 0; i < rows; i++) {
        const int gm = m0 + i;
        for (int j = 0; j < cols; j++) {
            const int gn = n0 + j;
            const int ci = gm * c_rs + C_COL(gn);
            Cb[ci] = gemm_epilogue(sums[16 * i + j], alpha, beta, Cb, ci, biasb, bias_mode, gm, gn, relu);
        }
    }
}
