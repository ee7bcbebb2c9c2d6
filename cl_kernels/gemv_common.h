// What the batch-1 product kernels share (gemv.cl for GPUs, gemv_cpu.cl for CPUs), besides gemm_common.h (whose
// gemm_epilogue they apply, bias_mode and relu kernel arguments after bias, as the other products' are):
//   ROWSUM  the rank-1 kernels: 1 also writes alpha times A's values (after A_MASK) into D, added to D when d_add:
//           A's sum over its one column, a dense layer's bias gradient in its weight gradient's launch
//   A_MASK  1: A's elements are read through a ReLU's gradient, as zero where amask (the ReLU's output, one value per
//           element of A's one column or row) is <= 0 (a NaN passes, as act_bwd's): a ReLU fused into a dense layer
//           costs no launch of its own in the layer's backward. MASKED(v, i): element i of A, value v, masked.
#ifndef CLNET_GEMV_COMMON_H
#define CLNET_GEMV_COMMON_H
#include "gemm_common.h"

#ifndef ROWSUM
#define ROWSUM 0
#endif
#ifndef A_MASK
#define A_MASK 0
#endif
// The kernels always take amask, and the rank-1 ones D and d_add (NULL and 0 where unused): a kernel's parameters
// are its signature's alone, which the build's offset rewrite (sources.py) reads.
#if A_MASK
#define MASKED(v, i) (amask[i] <= 0.0f ? 0.0f : (v))
#else
#define MASKED(v, i) (v)
#endif

#endif
