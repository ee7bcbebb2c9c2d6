"""The onnx and onnxruntime modules for the ONNX tests, or a skip only where they are genuinely absent.

The tests fail (an error at collection, not a skip) where the onnx extra is meant to be there: in CI (CI set to
anything but "", "0" or "false"), under CLNET_TEST_ONNX=1, or where a package of the extra is installed (its
distribution metadata present) but cannot be imported. A plain skip remains only where the packages are missing and
nothing says they should be installed."""
import importlib
import importlib.metadata
import os

import pytest

# The onnx extra of setup.cfg: import name -> distribution name.
EXTRA = {"onnx": "onnx", "onnxruntime": "onnxruntime"}


def _expected():
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false")
    return ci or os.environ.get("CLNET_TEST_ONNX", "").strip() not in ("", "0")


def _installed(dist):
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def require(module):
    """The imported module; a collection error where it should be importable, else a module-level skip."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        dist = EXTRA.get(module, module)
        if _installed(dist):
            raise ImportError(f"{dist} is installed but does not import ({e}); reinstall it: "
                              "pip install --force-reinstall 'clnet[onnx]'") from e
        if _expected():
            raise ImportError(f"{module} is not installed, but the ONNX tests must run here (CI or CLNET_TEST_ONNX "
                              "is set): pip install 'clnet[onnx]'") from e
        pytest.skip(f"{module} is not installed (pip install 'clnet[onnx]')", allow_module_level=True)
