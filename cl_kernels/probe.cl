// The smallest kernel: clnet.devices.build_problem builds it once per device to find a compiler that cannot build
// anything on this machine (PyPI's PoCL 3.0 on a CPU its LLVM 14 does not know). No defines.
__kernel void clnet_probe(__global float* x) {
    x[get_global_id(0)] = 1.0f;
}
