"""The package's shape: no import circles and no import from a lower layer into a higher one.

Every `import` and `from ... import` of dflash_trt is read from the source (lazy imports inside functions
included), so a circle hidden behind a function-level import fails here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_trt"

# Top to bottom. A module may import modules of its own layer and of the layers below it, never above.
LAYERS = [
    ("dflash_trt.cli", "dflash_trt.__main__", "dflash_trt.commands"),
    ("dflash_trt.benchmarks", "dflash_trt.gpu_check", "dflash_trt.training"),
    ("dflash_trt.gateway", "dflash_trt.deploy"),
    ("dflash_trt.serving",),
    ("dflash_trt.engine", "dflash_trt.testing"),
    ("dflash_trt.decoding.api", "dflash_trt.decoding.reference"),
    ("dflash_trt.decoding.scheduler",),
    ("dflash_trt.decoding.step",),
    ("dflash_trt.decoding.model",),
    ("dflash_trt.decoding.kernels",),
    ("dflash_trt.data", "dflash_trt.errors", "dflash_trt.decoding", "dflash_trt"),
]
MAX_ROOT_MODULES = 8


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The dflash_trt modules `name` imports, anywhere in its source."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            # `from pkg import module` names a module; `from module import name` names the module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def layer_of(name: str) -> int:
    """Index in LAYERS of the longest prefix that names `name`'s layer."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{name} belongs to no layer: add it to LAYERS in tests/test_layers.py")
    return best


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in graph.get(node, ()):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circles():
    assert import_circles(import_graph()) == []


def test_imports_run_down_the_layers():
    upward = [f"{name} -> {target}" for name, targets in sorted(import_graph().items())
              for target in sorted(targets) if layer_of(target) < layer_of(name)]
    assert upward == []


def test_package_root_stays_small():
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_the_checks_see_a_lazy_upward_import_and_a_circle(tmp_path):
    lazy = tmp_path / "target.py"
    lazy.write_text("def f():\n    from dflash_trt.decoding import api\n")
    assert imported("dflash_trt.decoding.model.target", lazy, modules()) == {"dflash_trt.decoding.api"}
    assert layer_of("dflash_trt.decoding.api") < layer_of("dflash_trt.decoding.model.target")
    graph = {"dflash_trt.decoding.model.target": {"dflash_trt.decoding.api"},
             "dflash_trt.decoding.api": {"dflash_trt.decoding.model.target"}}
    assert import_circles(graph) == [["dflash_trt.decoding.api", "dflash_trt.decoding.model.target"]]
