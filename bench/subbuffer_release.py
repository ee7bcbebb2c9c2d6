"""Which release of a sub-buffer NVIDIA's driver (580) cannot take (bench/NOTES.md v33: the arena's segments'
sub-buffers crashed the process at clReleaseMemObject on an H100). Each case runs in a process of its own, since a
crash ends it; the exit status says how it went (-11: a segmentation fault).

    python3 bench/subbuffer_release.py --device gpu
"""
import subprocess
import sys

import numpy as np

CASES = {
    "made, released": "sub = parent.get_sub_region(OFF, N); del sub",
    "launched (pyopencl kernel kept), released": "sub = parent.get_sub_region(OFF, N); fill(sub); q.finish(); del sub",
    "launched, kernel released first": "sub = parent.get_sub_region(OFF, N); fill(sub); q.finish(); del k[:]; del sub",
    "launched, parent released first": "sub = parent.get_sub_region(OFF, N); fill(sub); q.finish(); parent.release(); "
                                       "del sub",
    "two overlapping, both launched, released in turn": "a = parent.get_sub_region(OFF, N); "
                                                        "b = parent.get_sub_region(OFF, 2 * N); fill(a); fill(b); "
                                                        "q.finish(); del k[:]; del a; del b",
    "500 made at other offsets, each launched, released in turn": "subs = [parent.get_sub_region(OFF + 4096 * i, N) "
                                                                   "for i in range(500)]; [fill(s) for s in subs]; "
                                                                   "q.finish(); del subs[:]",
    "launched, released before the queue finished": "sub = parent.get_sub_region(OFF, N); fill(sub); del sub; "
                                                    "q.finish()",
    "clnet: a tensor in the arena freed, the cache released": "ARENA",
    "clnet: resnet18 b8 steps in the arena, the cache released": "ARENA_STEPS",
}

PRELUDE = """
import numpy as np, pyopencl as cl, clnet
dev = clnet.device(DEVICE)
ctx, q = dev.context, dev.queue
OFF, N = 4096 * 512, 2 << 20
parent = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64 << 20)
prog = cl.Program(ctx, clnet.sources.source("probe.cl")).build()  # x[i] = 1
k = [cl.Kernel(prog, "clnet_probe")]
def fill(buf):
    k[0].set_args(buf)
    cl.enqueue_nd_range_kernel(q, k[0], (N // 4,), None)
"""

ARENA = """
from clnet import ops
import importlib
t = importlib.import_module("clnet.tensor")
p = t.pool(dev)
assert p.arena is not None
x = ops.full((N,), dev, 1.0)
y = (x * 2.0).numpy()
del x
p.release_cached()
"""

ARENA_STEPS = ARENA + """
from clnet import models
from clnet.bench.runner import ClnetRunner
r = ClnetRunner(models.build("resnet18"), dev, np.random.default_rng(0).standard_normal((8, 3, 224, 224)).astype(
    np.float32), np.arange(8, dtype=np.int32))
for _ in range(3):
    r.step()
dev.synchronize()
p.release_cached()
"""


def main():
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "auto"
    if "--case" in sys.argv:
        body = CASES[sys.argv[sys.argv.index("--case") + 1]]
        code = PRELUDE.replace("DEVICE", repr(device)) + {
            "ARENA": ARENA, "ARENA_STEPS": ARENA_STEPS}.get(body, body + "\n")
        exec(compile(code, "case", "exec"), {})
        print("done")
        return
    for name in CASES:
        r = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--device", device, "--case", name],
                           capture_output=True, text=True, timeout=60)
        print(f"{r.returncode:4d}  {name}" + ("" if r.returncode == 0 else "  | " + r.stderr.strip()[-300:]
                                                .replace("\n", " | ")))


if __name__ == "__main__":
    main()
