"""ONNX in and out: `load` turns an ONNX file into a clnet module that runs and trains on any OpenCL device, `export`
writes a clnet module (the zoo's included) as an ONNX file.

Import. The graph becomes an `OnnxModule` whose forward walks the file's nodes in order, running each through the
import table (handlers.OPS: one entry per ONNX operator, holding how the tensor engine runs it -- pointwise, reduce,
views, products, nn.functional --, what load checks of it, which inputs must be known on the host and which float
initializers it trains), so autograd records it as it records any clnet network and `loss.backward()` trains it. The
elementwise entries come from the engine's own tables (pointwise.UNARY and BINARY name each op's ONNX counterpart).
Float initializers that are weights (a convolution's or a Gemm's, a normalisation's scale and bias, a tensor added or
multiplied in, a weight reshaped or joined before use) become Parameters named by their initializer names, which
PyTorch's exporters take from the state_dict keys; batch norm's mean and variance become buffers. So `state_dict()`
has the file's names and values, unchanged, and `load_state_dict` takes a PyTorch state_dict. One exception, on names
only: PyTorch's TorchScript exporter leaves some weights unnamed ("onnx::Conv_193", a convolution's weight with its
eval-mode batch norm folded in); such an initializer, read by one node whose name carries the module's scope
("/layer1/layer1.0/conv1/Conv"), is named after that module and PyTorch's name of the input
("layer1.0.conv1.weight"), its values the file's; `OnnxModule.file_names` maps each new name to the file's. Nodes
whose inputs are all constants are evaluated once at load; Shape-driven subgraphs (`x.view(x.size(0), -1)`) run in
NumPy on the host from the shapes of each call's tensors, without a kernel or a copy, so a file exported at batch 1
also runs at batch 64. Batch normalization runs with the batch's statistics in train() and the stored ones in eval(),
as in PyTorch; the module starts in the mode the file was exported in. `fuse=True` (an inference-only optimisation,
off by default) folds each inference-mode batch norm that follows a convolution into the convolution's weights and
bias at load; such a module refuses train().

ONNX's semantics where they differ from PyTorch's: training-mode BatchNormalization moves running_var towards the
batch's population variance (ONNX's BatchNormalization-14/15), not PyTorch's unbiased one (_d_batchnorm corrects
clnet's update); Gemm and MatMul multiply as ONNX says whatever B is (a file's weight, a constant, a computed
tensor); integer Div truncates; Clip with min > max gives max; Resize samples as ONNX's coordinate modes say (its
matrices are built from the specification's formulas, not PyTorch's interpolate); Dropout follows its training_mode
input where the file gives one (a file with it true loads in train()).

Refusals come at load, before any kernel runs. Every node is checked twice: its operator and attributes
(_check_node), then, following the graph from its inputs, what each table entry needs of its inputs (_check_flow:
which values are constants, which are computed on the host from shapes, which are computed tensors, and their shapes
as ONNX's shape inference finds them; a computed tensor that would be empty is refused, clnet holds none). What
clnet cannot run raises `OnnxImportError` naming the node, the operator, the opset and the reason; a damaged or
truncated file raises it naming the file. Only what depends on a dimension unknown at load (a free batch size) is
decided by the call, with the same error naming the node. An opset newer than NEWEST_OPSET loads with an
OnnxOpsetWarning. Constant folding materialises at most host.FOLD_LIMIT elements for one ConstantOfShape, Expand,
Range or Tile: a file asking for more is refused at load, naming the node and the size.

Files. External data is read only from files inside the model's folder (no absolute paths, no "..", no symbolic link
leading out), and the initializers' declared sizes are checked against the device's memory (the host's when no device
is named) before anything is read or allocated.

Export. `export(model, path, example_input)` runs the model once in eval mode on the example with every op recorded
(autograd's Function.apply, wrapped for the duration), and writes each recorded op as its ONNX nodes (the engine's
strided views as Slice, Transpose, Reshape and Expand); parameters and buffers become initializers named by their
state_dict keys, so the file loads back into the same names. The batch dimension stays free through reshapes that
merge it with others (attention's batch and heads) and broadcasts along it (ViT's class token).

The `onnx` package is optional (`pip install 'clnet[onnx]'`); without it `load` and `export` say so.

The package, by job: common (the error, the warning, attributes), module (OnnxModule), host (NumPy evaluation of
constants and shapes), handlers (the import table: each operator on computed tensors with its load checks), checks
(the load-time walk over the graph), reader (reading a file safely), load, export, tools (the command line's work),
backend (the onnx.backend.base.Backend adapter ONNX's own node tests drive).
"""

from ..nn import functional as F  # noqa: F401  (tests replace F.dropout, which the handlers call)
from .common import INSTALL_HINT, EXPORT_OPSET, NEWEST_OPSET, OnnxImportError, OnnxOpsetWarning  # noqa: F401
from .module import OnnxModule  # noqa: F401
from .host import HOST_OPS  # noqa: F401
from .handlers import DEVICE_OPS  # noqa: F401
from .load import load  # noqa: F401
from .export import export  # noqa: F401
from .tools import run_file, input_shape, onnxruntime_outputs, bench_setup, onnxruntime_agreement  # noqa: F401

__all__ = ["OnnxImportError", "OnnxModule", "OnnxOpsetWarning", "bench_setup", "export", "input_shape", "load",
           "onnxruntime_agreement", "onnxruntime_outputs", "run_file"]
