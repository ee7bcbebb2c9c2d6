// Batched transpose into a dense buffer: T[b][c][r] = S[b](r, c) for r < R, c < CC, where the source is addressed as
// a GEMM operand is (gemm_common.h): S[b](r, c) = S[off + b*bs + r*rs + (c % cdiv)*cs + (c / cdiv)*cso].
// The matrix product uses it to turn an operand whose k runs fastest in memory into one whose rows (m or n) do: wide,
// coalesced loads of a whole tile row per slice instead of a 64-byte piece of each of many rows.
// Tiles of TT x TT go through local memory, so that both the reads (along c) and the writes (along r) are coalesced.
// Work-group (TT, TT); global (ceil(CC/TT)*TT, ceil(R/TT)*TT, batch).
// Defines: TT tile side; SPLIT 0/1 column split in use.
#include "common.h"
#ifndef TT
#define TT 32       // tile side
#endif
#ifndef SPLIT
#define SPLIT 0     // column split on the source
#endif

#if SPLIT
#define S_COL(c) (((c) % cdiv) * cs + ((c) / cdiv) * cso)
#else
#define S_COL(c) ((c) * cs)
#endif

__kernel __attribute__((reqd_work_group_size(TT, TT, 1)))
void transpose(__global const float* restrict S, OFFSET_PARAM(S), const int off, const int bs, const int rs,
               const int cs, const int cdiv, const int cso, const int R, const int CC, __global float* restrict T,
               OFFSET_PARAM(T)) {
    AT_OFFSET(__global const float*, S) AT_OFFSET(__global float*, T)
    __local float tile[TT][TT + 1];
    const int tx = get_local_id(0), ty = get_local_id(1), b = get_global_id(2);
    const int c0 = get_group_id(0) * TT, r0 = get_group_id(1) * TT;
    {
        const int r = r0 + ty, c = c0 + tx;  // consecutive work-items along c: the source's fast direction
        if (r < R && c < CC) tile[ty][tx] = S[off + b * bs + r * rs + S_COL(c)];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    {
        const int c = c0 + ty, r = r0 + tx;  // consecutive work-items along r: the destination's fast direction
        if (r < R && c < CC) T[((size_t)b * CC + c) * R + r] = tile[tx][ty];
    }
}
