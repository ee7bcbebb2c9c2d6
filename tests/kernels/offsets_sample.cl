// The rewrite's cases (tests/test_kernel_offsets.py): a pointer parameter written through a macro, a kernel named in
// a comment, local memory (no offset), an attribute before the kernel's return type.
#define PARAMS __global const float* restrict x, const int n
// __kernel void in_a_comment(__global float* p) {
__kernel __attribute__((reqd_work_group_size(4, 1, 1)))
void f(PARAMS, __global float* out, __local float* scratch, const float alpha) {
    out[0] = x[0];
}
