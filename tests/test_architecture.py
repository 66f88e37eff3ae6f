"""The package's shape: every module imports, the module graph has no cycle (function-level imports
count: a cycle hidden inside a function is still a cycle), flwr is imported only by fedfew.flower, and
the public surface of ``import fedfew`` is what its ``__all__`` says."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import fedfew

SRC = Path(fedfew.__file__).parent


def modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported_names(path: Path) -> list[str]:
    """Every module name an import statement of ``path`` names, at any depth, except those under
    ``if TYPE_CHECKING:`` (annotations only, never executed)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                   for child in block.body for node in ast.walk(child)}
    names = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def module_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = set()
        for target in imported_names(path):
            while target and target not in known:  # `from pkg import name`: the module, else the package
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert cycles(module_graph()) == []


def test_only_the_flower_package_imports_flwr() -> None:
    outside = [name for name, path in modules().items() if not name.startswith("fedfew.flower")
               and any(n == "flwr" or n.startswith("flwr.") for n in imported_names(path))]
    assert outside == []
    # and the flower package's entry points import it only when a Flower run starts
    for name in ("fedfew.flower", "fedfew.flower.launch", "fedfew.flower.errors"):
        assert not any(n.startswith("flwr") for n in imported_names(modules()[name])), name


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_imports(name: str) -> None:
    if name.startswith("fedfew.flower."):
        pytest.importorskip("flwr")
    if name == "fedfew.__main__":
        return  # runs the command line
    importlib.import_module(name)


def test_the_public_surface() -> None:
    assert fedfew.__all__ == sorted(fedfew.__all__)
    for name in fedfew.__all__:
        assert getattr(fedfew, name) is not None, name
    assert isinstance(fedfew.__version__, str) and fedfew.__version__
    assert "fl-maml" in fedfew.ALGORITHMS and {"inprocess", "workers", "flower"} <= set(fedfew.ENGINES.names())
    assert issubclass(fedfew.ConfigError, fedfew.UsageError) and fedfew.UsageError.exit_code == 2
    assert fedfew.RunFailedError.exit_code == 1 and fedfew.RunInterrupted.exit_code == 130
    assert (SRC / "py.typed").is_file()


def test_python_dash_m_fedfew_version() -> None:
    done = subprocess.run([sys.executable, "-m", "fedfew", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"fedfew {fedfew.__version__}"


#: torch's factory draws: without ``device=`` they make their tensor on the default device, which is
#: the GPU inside an engine's compute scope, where a CPU generator is an error (found on an H100).
FACTORY_DRAWS = {"rand", "randn", "randint", "randperm"}  # the draws that are always factories


def undeviced_draws(source: str) -> list[int]:
    """Lines of ``torch.<draw>(..., generator=...)`` calls that name no ``device``."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORY_DRAWS
            and {"generator"} <= {k.arg for k in node.keywords} and "device" not in {k.arg for k in node.keywords}]


def test_the_draw_finder_finds_a_draw_without_a_device() -> None:
    assert undeviced_draws("torch.randperm(5, generator=g)\ntorch.randperm(5, generator=g, device=g.device)") == [1]


def test_every_seeded_draw_names_its_device() -> None:
    """Sampling draws on the CPU from the seeded generators on every device (fedfew.engine.compute): a
    draw that names no device would land on the GPU's default device there and fail."""
    found = [f"{path.relative_to(SRC)}:{line}" for path in sorted(SRC.rglob("*.py"))
             for line in undeviced_draws(path.read_text())]
    assert not found, found
