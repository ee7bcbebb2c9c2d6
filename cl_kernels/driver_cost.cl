// Kernels of the bench/ scripts that time the driver's launches rather than clnet's kernels (bench/NOTES.md v34, v42),
// without common.h's byte offsets (the scripts set each argument themselves). Defines: EXTRA (copy_args: 0, 4 or 8
// int arguments more).
#ifndef EXTRA
#define EXTRA 0
#endif

// bench/subbuffer_launch.py: b = a + 1 over float4s, chained through buffers, whole or sub-buffers.
__kernel void copy4(__global const float4* a, __global float4* b) {
    const size_t i = get_global_id(0);
    b[i] = a[i] + (float4)(1.0f);
}

// bench/arg_cost.py: d = a + b + c, with EXTRA int arguments more, each added (so each is read).
#if EXTRA >= 4
#define PARAMS_4 , const int o0, const int o1, const int o2, const int o3
#define SUM_4 + o0 + o1 + o2 + o3
#else
#define PARAMS_4
#define SUM_4
#endif
#if EXTRA >= 8
#define PARAMS_8 , const int o4, const int o5, const int o6, const int o7
#define SUM_8 + o4 + o5 + o6 + o7
#else
#define PARAMS_8
#define SUM_8
#endif

__kernel void copy_args(__global const float* a, __global const float* b, __global const float* c,
                        __global float* d PARAMS_4 PARAMS_8) {
    const size_t i = get_global_id(0);
    d[i] = a[i] + b[i] + c[i] + (float)(0 SUM_4 SUM_8);
}
