// GPU-shaped matrix product, plus the split-K reduction every GEMM kernel uses (see gemm_common.h for the operand
// layout, split-K and the run-time epilogue).
//   gemm_tiled  a TM x TN tile of C per work-group, staged through local memory in TK-deep slices. Each work-item
//               computes WM x WN outputs in groups of 4 consecutive rows and columns, so one float4 local read feeds
//               4 rows (or columns): 4x fewer local-memory instructions per multiply-add than scalar reads. The next
//               slice is fetched from global memory into registers while the current one is multiplied, and stored
//               into the other half of a double-buffered local array: one barrier per slice, and global latency
//               hidden behind arithmetic.
//               Work-group: (TN/WN, TM/WM, 1); global: (ceil(N/TN)*TN/WN, ceil(M/TM)*TM/WM, batch * ksplit).
//   gemm_reduce sums split-K partial products in a fixed order and applies the epilogue.
// Defines (besides gemm_common.h's):
//   TM TN TK  tile rows, columns and depth
//   WM WN     outputs per work-item along m and n (multiples of 4)
//   A_KFAST   0/1: consecutive work-items load A along k (set when A's k stride is 1), else along m
//   B_KFAST   0/1: likewise for B, else along n
//   LBUF      2: double-buffered local slices (one barrier per slice); 1: one buffer, two barriers per slice,
//             which leaves room in 48 KiB for deeper slices (128x128x32) whose rows of A span 128 bytes
//   A_VEC     0/1: A is fetched as float4s along its contiguous axis (k if A_KFAST, else m): 4x fewer load and
//             address instructions. The host sets it only where every such float4 is contiguous and 16-byte aligned
//             (the stride along that axis 1, all other strides and offsets multiples of 4, a column split's segments
//             too) and each slice splits into float4s evenly over the work-group; float4s crossing the matrix's
//             edges fall back to guarded scalar loads.
//   B_VEC     0/1: likewise for B
//   C_VEC     0/1: each work-item's 4 consecutive columns of C are stored as one float4 (C contiguous along n and
//             aligned, as for A_VEC); groups crossing the last column store element by element
//   C_STAGE   0/1 (only without C_VEC): C goes out through local memory a strip of rows at a time, consecutive
//             work-items on consecutive columns. Without it each scalar store of a warp writes every fourth float
//             (a work-item's columns are 4 consecutive ones): where planes are odd (squeezenet's 55x55, 13x13) a
//             thin product's stores took 3-4x the time of its bytes (bench/NOTES.md v57).
//   WARP_8X4  0/1: each 32 consecutive work-items cover 8 x 4 work-items' places along (n, m) rather than a row of 32
//             (TX a multiple of 8, TY of 4): a warp's float4 slice reads fetch 4 distinct float4s of A and 8 of B.
//             No tuning candidate takes it (bench/sgemm_variants.py measures it); tests keep it right.
#include "gemm_common.h"

#ifndef TM
#define TM 64       // tile rows
#endif
#ifndef TN
#define TN 64       // tile columns
#endif
#ifndef TK
#define TK 16       // tile depth
#endif
#ifndef WM
#define WM 4        // rows per work-item
#endif
#ifndef WN
#define WN 4        // columns per work-item
#endif
#ifndef A_KFAST
#define A_KFAST 0   // A loads run along k
#endif
#ifndef B_KFAST
#define B_KFAST 0   // B loads run along k
#endif
#ifndef LBUF
#define LBUF 2      // local buffers per operand
#endif
#ifndef A_VEC
#define A_VEC 0     // float4 fetches of A
#endif
#ifndef B_VEC
#define B_VEC 0     // float4 fetches of B
#endif
#ifndef C_VEC
#define C_VEC 0     // float4 stores of C
#endif
#ifndef WARP_8X4
#define WARP_8X4 0  // work-items in warps of 8 x 4 along (n, m)
#endif
#ifndef C_STAGE
#define C_STAGE 0   // C stored through local memory
#endif
#if LBUF != 1 && LBUF != 2
#error "LBUF must be 1 or 2"
#endif

#define TX (TN / WN)        // work-items along n
#define TY (TM / WM)        // work-items along m
#define NT (TX * TY)        // work-items per group
#define LA (TM * TK / NT)   // A elements each work-item fetches per slice
#define LB (TN * TK / NT)   // B elements each work-item fetches per slice

#if WM % 4 != 0 || WN % 4 != 0 || TM % WM != 0 || TN % WN != 0
#error "WM and WN must be multiples of 4 that divide TM and TN"
#endif
#if (TM * TK) % NT != 0 || (TN * TK) % NT != 0
#error "each tile slice must split evenly over the work-group"
#endif
#if WARP_8X4 && (TX % 8 != 0 || TY % 4 != 0)
#error "WARP_8X4 needs TX a multiple of 8 and TY of 4"
#endif
#if C_STAGE && (C_VEC || NT % TN != 0)
#error "C_STAGE is for C without float4 stores, with whole strips of TN columns per round of the work-group"
#endif
#if (A_VEC && (TM * TK) % (4 * NT) != 0) || (B_VEC && (TN * TK) % (4 * NT) != 0)
#error "float4 fetches need each slice to split into float4s evenly over the work-group"
#endif
#if ((A_VEC && A_KFAST) || (B_VEC && B_KFAST)) && TK % 4 != 0
#error "float4 fetches along k need a slice depth that is a multiple of 4"
#endif

// An operand fetched as float4s (X_VEC) moves 4 elements per step: its registers, loads and local stores.
#if A_VEC
#define A_GROUP 4
#define A_REG float4
#define A_LOAD LOAD4
#define A_PUT PUT4
#else
#define A_GROUP 1
#define A_REG float
#define A_LOAD LOAD1
#define A_PUT PUT1
#endif
#if B_VEC
#define B_GROUP 4
#define B_REG float4
#define B_LOAD LOAD4
#define B_PUT PUT4
#else
#define B_GROUP 1
#define B_REG float
#define B_LOAD LOAD1
#define B_PUT PUT1
#endif

// A k-fast fill writes a column of a local row per work-item; one float4 of padding per row spreads those writes
// over the banks.
#define PAD4 1

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void gemm_tiled(GEMM_ARGS) {
    GEMM_AT_OFFSETS
    const int tid = get_local_id(1) * TX + get_local_id(0);
#if WARP_8X4
    // each 32 consecutive work-items cover 8 x 4 of (tx, ty): a warp's float4 reads of a slice row then fetch 4
    // distinct float4s of A and 8 of B (128 bytes each) rather than 2 and 16
    const int w = tid / 32, lane = tid % 32;
    const int tx = w % (TX / 8) * 8 + lane % 8, ty = w / (TX / 8) * 4 + lane / 8;
#else
    const int tx = get_local_id(0), ty = get_local_id(1);
#endif
    const int z = get_global_id(2), b = z / ksplit;
    const int kbeg = (z % ksplit) * kc, kend = min(K, kbeg + kc);
    const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;
    __global const float* Ab = A + a_off + b * a_bs;
    __global const float* Bb = B + b_off + b * b_bs;

    __local float4 As[LBUF][TK][TM / 4 + PAD4];
    __local float4 Bs[LBUF][TK][TN / 4 + PAD4];
    A_REG ra[LA / A_GROUP];  // this work-item's share of the next slice, fetched while the current one is used
    B_REG rb[LB / B_GROUP];
    float acc[WM][WN];
    for (int i = 0; i < WM; i++)
        for (int j = 0; j < WN; j++) acc[i][j] = 0.0f;

// Where an operand's element (row of A or column of B, k) lies, and the tile position of element e of a slice in the
// order consecutive work-items load (with float4 fetches, e counts float4s and names the first of its four).
#define A_AT(gm, gk) ((gm) * a_rs + A_COL(gk))
#define B_AT(gn, gk) (B_ROW(gk) + B_COL(gn))
#if A_KFAST
#define A_POS(e, mm, kk) const int kk = (e) % (TK / A_GROUP) * A_GROUP, mm = (e) / (TK / A_GROUP)
#else
#define A_POS(e, mm, kk) const int mm = (e) % (TM / A_GROUP) * A_GROUP, kk = (e) / (TM / A_GROUP)
#endif
#if B_KFAST
#define B_POS(e, nn, kk) const int kk = (e) % (TK / B_GROUP) * B_GROUP, nn = (e) / (TK / B_GROUP)
#else
#define B_POS(e, nn, kk) const int nn = (e) % (TN / B_GROUP) * B_GROUP, kk = (e) / (TN / B_GROUP)
#endif
// Where each of this work-item's loads of a slice lies along the axis a column split cuts (B's n, A's k), kept from
// slice to slice: a split index costs a division, and a thin product's loads (squeezenet's planes of 55x55 and 13x13
// are odd, so scalar) took more of them than multiply-adds. B's columns stay put: their offsets are computed once.
// A's column runs along k: its offset and place in its segment step on by TK each slice, wrapping at a segment's end;
// so does B's row where its split cuts its rows (B_KSPLIT).
// An operand split along k: off[r], the offset along k (AT_K) of load r's k in the next fetch, and seg[r], that k's
// place in its segment of cdiv; stepped by TK each slice (k's stride `step`), wrapping at a segment's end (cso).
#define K_SPLIT_INIT(off, seg, n, POS, AT_K, cdiv) \
    int off[n], seg[n]; \
    for (int r = 0; r < (n); r++) { \
        POS(tid + r * NT, xx_, kk); \
        const int k = kbeg + kk; \
        seg[r] = k % (cdiv); \
        off[r] = AT_K(k); \
    }
#define K_SPLIT_STEP(off, seg, r, step, cdiv, cso) \
    seg[r] += TK; \
    off[r] += TK * (step); \
    while (seg[r] >= (cdiv)) { seg[r] -= (cdiv); off[r] += (cso) - (cdiv) * (step); }
#if B_SPLIT
    int b_col[LB / B_GROUP];
    for (int r = 0; r < LB / B_GROUP; r++) {
        B_POS(tid + r * NT, nn, kk);
        b_col[r] = B_COL(n0 + nn);
    }
#define B_AT_R(gn, gk, r) ((gk) * b_rs + b_col[r])
#elif B_KSPLIT
    K_SPLIT_INIT(b_row, b_seg, LB / B_GROUP, B_POS, B_ROW, b_cdiv)
#define B_AT_R(gn, gk, r) (b_row[r] + (gn) * b_cs)
#define B_STEP(r) K_SPLIT_STEP(b_row, b_seg, r, b_rs, b_cdiv, b_cso)
#else
#define B_AT_R(gn, gk, r) B_AT(gn, gk)
#endif
#if A_SPLIT
    K_SPLIT_INIT(a_col, a_seg, LA / A_GROUP, A_POS, A_COL, a_cdiv)
#define A_AT_R(gm, gk, r) ((gm) * a_rs + a_col[r])
#define A_STEP(r) K_SPLIT_STEP(a_col, a_seg, r, a_cs, a_cdiv, a_cso)
#else
#define A_AT_R(gm, gk, r) A_AT(gm, gk)
#define A_STEP(r)
#endif
#if !B_KSPLIT
#define B_STEP(r)
#endif
// One element of X at (gx, gk), zero outside the matrix or past the slice (AT: its index, valid inside); and its
// store into slice buffer buf.
#define LOAD1(v, Xb, X_AT, gx, gk, LIM, ALONG_K, AT) v = (gx) < LIM && (gk) < kend ? Xb[AT] : 0.0f
#define PUT1(Xs, buf, v, xx, kk, ALONG_K) ((__local float*)Xs[(buf)][kk])[xx] = v
// The float4 of X at (gx, gk) and the next three along k (ALONG_K) or along x: one aligned load inside the matrix,
// guarded scalar loads across its edges; stored as one float4 along x, or four scalars along k.
#define LOAD4(v, Xb, X_AT, gx, gk, LIM, ALONG_K, AT) \
    if ((ALONG_K) ? (gx) < LIM && (gk) + 3 < kend : (gx) + 3 < LIM && (gk) < kend) { \
        v = *(__global const float4*)(Xb + (AT)); \
    } else { \
        float e_[4]; \
        for (int i = 0; i < 4; i++) { \
            const int ex = (gx) + ((ALONG_K) ? 0 : i), ek = (gk) + ((ALONG_K) ? i : 0); \
            e_[i] = ex < LIM && ek < kend ? Xb[X_AT(ex, ek)] : 0.0f; \
        } \
        v = (float4)(e_[0], e_[1], e_[2], e_[3]); \
    }
#define PUT4(Xs, buf, v, xx, kk, ALONG_K) \
    if (ALONG_K) { \
        ((__local float*)Xs[(buf)][(kk)])[xx] = v.x; \
        ((__local float*)Xs[(buf)][(kk) + 1])[xx] = v.y; \
        ((__local float*)Xs[(buf)][(kk) + 2])[xx] = v.z; \
        ((__local float*)Xs[(buf)][(kk) + 3])[xx] = v.w; \
    } else { \
        Xs[(buf)][kk][(xx) / 4] = v; \
    }
// Each work-item's share of slice k0 of operand X into its registers regs; and from them into slice buffer buf.
#define FETCH_X(regs, n, POS, Xb, X_AT, X_AT_R, X_STEP, x0, LIM, KFAST, LOAD, k0) \
    for (int r = 0; r < (n); r++) { \
        POS(tid + r * NT, xx, kk); \
        LOAD(regs[r], Xb, X_AT, (x0) + xx, (k0) + kk, LIM, KFAST, X_AT_R((x0) + xx, (k0) + kk, r)); \
        X_STEP(r) \
    }
#define STORE_X(regs, n, POS, Xs, KFAST, PUT, buf) \
    for (int r = 0; r < (n); r++) { \
        POS(tid + r * NT, xx, kk); \
        PUT(Xs, buf, regs[r], xx, kk, KFAST); \
    }
#define FETCH(k0) \
    FETCH_X(ra, LA / A_GROUP, A_POS, Ab, A_AT, A_AT_R, A_STEP, m0, M, A_KFAST, A_LOAD, k0) \
    FETCH_X(rb, LB / B_GROUP, B_POS, Bb, B_AT, B_AT_R, B_STEP, n0, N, B_KFAST, B_LOAD, k0)
#define STORE(buf) \
    STORE_X(ra, LA / A_GROUP, A_POS, As, A_KFAST, A_PUT, buf) \
    STORE_X(rb, LB / B_GROUP, B_POS, Bs, B_KFAST, B_PUT, buf)

    FETCH(kbeg);
    STORE(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += TK) {
        const bool more = k0 + TK < kend;  // the same for the whole work-group
        if (more) { FETCH(k0 + TK); }
#pragma unroll
        for (int kk = 0; kk < TK; kk++) {
            float a[WM], bv[WN];
#pragma unroll
            for (int g = 0; g < WM / 4; g++) {
                const float4 v = As[buf][kk][g * TY + ty];
                a[4 * g] = v.x; a[4 * g + 1] = v.y; a[4 * g + 2] = v.z; a[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int g = 0; g < WN / 4; g++) {
                const float4 v = Bs[buf][kk][g * TX + tx];
                bv[4 * g] = v.x; bv[4 * g + 1] = v.y; bv[4 * g + 2] = v.z; bv[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < WM; i++)
#pragma unroll
                for (int j = 0; j < WN; j++) acc[i][j] = mad(a[i], bv[j], acc[i][j]);
        }
#if LBUF == 2
        if (more) { STORE(buf ^ 1); }
        barrier(CLK_LOCAL_MEM_FENCE);
        buf ^= 1;
#else
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done reading the slice before it is overwritten
        if (more) { STORE(0); }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

    __global float* Cb = C + c_off + z * c_bs;
    __global const float* biasb = bias + b * bias_bs;
#define OUT(i, j, gm, gn, ci) gemm_epilogue(acc[i][j], alpha, beta, Cb, ci, biasb, bias_mode, gm, gn, relu)
#if C_STAGE
    // One strip of TY rows at a time (row i of every work-item's block) goes through local memory, so that
    // consecutive work-items then store consecutive columns of C: one column each, its C_COL computed once.
    __local float4 stage[TY][TN / 4 + 1];  // float4s: a float array need not be 16-byte aligned
    const int sc = tid % TN, gsc = n0 + sc;
    const int csc = gsc < N ? C_COL(gsc) : 0;
#pragma unroll
    for (int i = 0; i < WM; i++) {
#pragma unroll
        for (int g = 0; g < WN / 4; g++)
            stage[ty][g * TX + tx] = (float4)(acc[i][4 * g], acc[i][4 * g + 1], acc[i][4 * g + 2], acc[i][4 * g + 3]);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = 0; s < WN; s++) {
            const int r = tid / TN + s * (NT / TN);  // the strip's row: ty of the work-item that computed it
            const int gm = m0 + (i / 4) * (TY * 4) + r * 4 + i % 4;
            if (gm < M && gsc < N) {
                const int ci = gm * c_rs + csc;
                const float v = ((__local float*)stage[r])[sc];
                Cb[ci] = gemm_epilogue(v, alpha, beta, Cb, ci, biasb, bias_mode, gm, gsc, relu);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#else
#if C_SPLIT
    // C_COL of this work-item's columns, a division for each group of 4 rather than one for each output
    int c_col[WN];
    for (int g = 0; g < WN / 4; g++) {
        const int gn = n0 + g * (TX * 4) + tx * 4;
        int seg = gn % c_cdiv, col = C_COL(gn);
        for (int j = 0; j < 4; j++) {
            c_col[4 * g + j] = col;
            col += c_cs;
            if (++seg == c_cdiv) { seg = 0; col += c_cso - c_cdiv * c_cs; }
        }
    }
#define C_COL_OF(g, j, gn) c_col[4 * (g) + (j)]
#else
#define C_COL_OF(g, j, gn) C_COL(gn)
#endif
    for (int i = 0; i < WM; i++) {
        const int gm = m0 + (i / 4) * (TY * 4) + ty * 4 + i % 4;
        if (gm >= M) continue;
        for (int g = 0; g < WN / 4; g++) {
            const int gn = n0 + g * (TX * 4) + tx * 4;
#if C_VEC
            if (gn + 3 < N) {
                const int ci = gm * c_rs + C_COL_OF(g, 0, gn);
                float4 v;
                v.x = OUT(i, 4 * g, gm, gn, ci);
                v.y = OUT(i, 4 * g + 1, gm, gn + 1, ci + 1);
                v.z = OUT(i, 4 * g + 2, gm, gn + 2, ci + 2);
                v.w = OUT(i, 4 * g + 3, gm, gn + 3, ci + 3);
                *(__global float4*)(Cb + ci) = v;
                continue;
            }
#endif
            for (int j = 0; j < 4 && gn + j < N; j++) {
                const int ci = gm * c_rs + C_COL_OF(g, j, gn + j);
                Cb[ci] = OUT(i, 4 * g + j, gm, gn + j, ci);
            }
        }
    }
#endif
}

// Sums the ksplit partial products P[(b*ksplit + s)](m, n), stored densely (M x N each), in order s = 0, 1, ...,
// and applies the epilogue into C. One work-item per (n, m, b).
__kernel void gemm_reduce(const int M, const int N, const int ksplit, const float alpha, const float beta,
                          __global const float* restrict P, OFFSET_PARAM(P), __global float* C, OFFSET_PARAM(C),
                          const int c_off, const int c_bs, const int c_rs, const int c_cs, const int c_cdiv,
                          const int c_cso, __global const float* restrict bias, OFFSET_PARAM(bias), const int bias_bs,
                          const int bias_mode, const int relu) {
    AT_OFFSET(__global const float*, P) AT_OFFSET(__global float*, C) AT_OFFSET(__global const float*, bias)
    const int n = get_global_id(0), m = get_global_id(1), b = get_global_id(2);
    if (n >= N || m >= M) return;
    __global const float* p = P + (size_t)b * ksplit * M * N + m * N + n;
    float acc = 0.0f;
    for (int s = 0; s < ksplit; s++) acc += p[(size_t)s * M * N];
    __global float* Cb = C + c_off + b * c_bs;
    const int ci = m * c_rs + C_COL(n);
    Cb[ci] = gemm_epilogue(acc, alpha, beta, Cb, ci, bias + b * bias_bs, bias_mode, m, n, relu);
}
