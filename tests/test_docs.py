"""The API reference builds from the numpydoc docstrings (pdoc, the test extra) with no warning."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_api_reference_builds_without_warnings(tmp_path):
    if os.environ.get("CI") != "true":
        pytest.importorskip("pdoc", reason="pdoc (the test extra) builds the API reference")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "pdoc", "--docformat", "numpy", "-o", str(tmp_path), "clnet"],
                       capture_output=True, text=True, env=env, timeout=300)
    warnings = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    assert p.returncode == 0 and not warnings, "\n".join(warnings[-40:])
    pages = {os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs}
    for page in ("clnet.html", "clnet/nn.html", "clnet/optim.html", "clnet/tensor.html"):
        assert page in pages, f"the reference has no {page}"
