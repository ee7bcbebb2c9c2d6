"""`clnet bench`: time training iterations of a zoo model the way convnet-benchmarks did, optionally beside PyTorch.

Protocol: warm-up iterations first (kernel builds never counted), then N timed iterations. Each phase (forward,
backward, update) is timed by wall clock with the queue finished, and reported as the median; then the whole
iteration captured as a `clnet.Graph` and replayed; then a few profiled iterations give per-module kernel times.
Peak device memory is read for both engines: clnet's buffer pool, PyTorch's caching allocator.

Split by job: `runner` (clnet's side: modules, FLOPs, the timed and profiled iterations, memory), `twin` (PyTorch's
side: the twin model, the agreement check, the same protocol in PyTorch), `report` (the JSON record's parts and the
table) and `command` (the click command, which only sets up, calls the others in order, prints and exits).
"""
from .runner import (LOSS, OTHER, UPDATE, ClnetRunner, ModuleHooks, describe, median_phases,  # noqa: F401
                     module_flops, run_clnet, time_replays)
from .twin import (AGREEMENT_TOLERANCE, RANDOM_MODULES, check_agreement, disagreements, run_torch,  # noqa: F401
                   torch_graph_ms, torch_twin, without_random_layers)
from .report import memory_line, out_of_memory_message, profile_rows, render_table  # noqa: F401
from .command import bench  # noqa: F401
