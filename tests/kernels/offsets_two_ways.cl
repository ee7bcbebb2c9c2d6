// A parameter macro with a pointer defined two ways (tests/test_kernel_offsets.py): the rewrite cannot tell which
// the build takes, so it refuses the file.
#if A
#define P , __global float* y
#else
#define P
#endif
__kernel void g(const int n P) { }
