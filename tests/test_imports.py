"""clnet's modules import one way (STYLE.md, "State and imports"): no import cycle, at the top of a module or hidden
in a function.

Three checks, all without a device: every module imports alone (in a fresh interpreter, with no other clnet module
loaded first, so that none works only because clnet/__init__ imported its dependencies in a lucky order); the
imports at the top of the modules form no cycle; and no function imports a clnet module, except the few listed in
ALLOWED with their reasons (an optional dependency, the CLI's start-up) -- a lazy import that only breaks a cycle is
a cycle, and this scan fails on a new one.
"""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "clnet")

# (importing module, imported module) -> why that import stays inside a function. "*": any clnet module.
ALLOWED = {
    ("clnet.cli", "*"): "the CLI imports what a command needs when it runs, so that `clnet --help` starts fast",
    ("clnet.train", "clnet.distributed"): "clnet.distributed needs mpi4py (optional: pip install 'clnet[mpi]')",
    ("clnet.bench.command", "clnet.distributed"): "clnet.distributed needs mpi4py (optional)",
}


def _modules():
    """{module name: file} for every .py file of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imported(node, module, is_package, modules):
    """The clnet modules an Import or ImportFrom node imports (`from . import x`: the module x where there is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == "clnet" or a.name.startswith("clnet.")]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target != "clnet" and not target.startswith("clnet."):
        return []
    return [target + "." + a.name if target + "." + a.name in modules else target for a in node.names]


def _scan():
    """({module: the clnet modules it imports at its top, with their parent packages}, [(module, line, imported)]
    for every import inside a function)."""
    top, inside = {}, []
    for module, path in MODULES.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_package = path.endswith("__init__.py")
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        nested = set()
        for fn in functions:
            for n in ast.walk(fn):
                if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in nested:
                    nested.add(id(n))
                    inside += [(module, n.lineno, t) for t in _imported(n, module, is_package, MODULES)]
        deps = set()
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in nested:
                for t in _imported(n, module, is_package, MODULES):
                    while t != "clnet":  # importing clnet.a.b runs clnet.a first
                        if t != module and not module.startswith(t + "."):
                            deps.add(t)
                        t = t.rsplit(".", 1)[0]
        top[module] = deps
    return top, inside


def _cycle(graph):
    """One import cycle of graph ({module: modules it imports}) as a list of modules, or None."""
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_scan_resolves_imports_and_finds_cycles():
    def imported(code, module, is_package=False):
        return _imported(ast.parse(code).body[0], module, is_package, MODULES)

    assert imported("from . import kernels", "clnet.ops") == ["clnet.kernels"]
    assert imported("from .. import ops, rng", "clnet.nn.layers") == ["clnet.ops", "clnet.rng"]
    assert imported("from ..tensor import Tensor, empty", "clnet.nn.layers") == ["clnet.tensor"] * 2
    assert imported("from . import layers", "clnet.nn", is_package=True) == ["clnet.nn.layers"]
    assert imported("from .module import Module", "clnet.nn.layers") == ["clnet.nn.module"]
    assert imported("import clnet.ops as o", "clnet.train") == ["clnet.ops"]
    assert imported("import numpy", "clnet.ops") == [] and imported("from numpy import float32", "clnet.ops") == []
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_top_level_imports_form_no_cycle():
    top, _ = _scan()
    cycle = _cycle(top)
    assert cycle is None, ("these modules import each other at their tops: " + " -> ".join(cycle)
                           + "; move what the lower one needs down (or invert it with a registration hook)")


def test_no_function_imports_a_clnet_module_except_the_allowed():
    _, inside = _scan()
    hidden = [f"{m}:{line} imports {t}" for m, line, t in inside
              if (m, "*") not in ALLOWED and (m, t) not in ALLOWED]
    assert not hidden, ("imports inside functions (a lazy import that breaks a cycle is a cycle; import at the top, "
                        "or add the pair to ALLOWED with its reason if it is for an optional dependency):\n"
                        + "\n".join(hidden))
    used = {(m, t) for m, _, t in inside} | {(m, "*") for m, _, t in inside}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"allowed but no longer imported inside a function (delete them from ALLOWED): {stale}"


# Run in a fresh interpreter: the third-party modules clnet uses are imported once, then each clnet module is
# imported in a fork of its own, under an empty `clnet` package (clnet/__init__.py not run), so that it gets only
# what it imports itself.
_IMPORT_EACH = r"""
import importlib, os, sys, traceback, types
import numpy, pyopencl, click  # noqa: F401  (shared by the forks: clnet's own modules are what is tested)
package, names = sys.argv[1], sys.argv[2:]
failed = []
for name in names:
    pid = os.fork()
    if pid == 0:
        root = types.ModuleType("clnet")
        root.__path__ = [package]
        sys.modules["clnet"] = root
        try:
            importlib.import_module(name)
        except BaseException:
            print(f"--- {name}\n{traceback.format_exc()}", flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(name)
print("FAILED", " ".join(failed))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="imports each module in a fork")
def test_every_module_imports_alone():
    names = sorted(MODULES)
    pytest.importorskip("mpi4py", reason="clnet.distributed (and what imports it) needs mpi4py")
    p = subprocess.run([sys.executable, "-c", _IMPORT_EACH, PACKAGE] + names, capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines and lines[-1].startswith("FAILED"), p.stdout[-4000:] + p.stderr[-4000:]
    failed = lines[-1].split()[1:]
    assert not failed, f"these modules fail to import alone: {failed}\n" + p.stdout[-8000:]
