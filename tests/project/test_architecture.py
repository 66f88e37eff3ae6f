"""The package's shape: the layers docs/architecture.md declares hold, every module imports, flwr is
imported only by fedfew.flower, and the public surface of ``import fedfew`` is what its ``__all__`` says.

The layers are read from the ```` ```layers ```` block of docs/architecture.md, top layer first, and the
known violations from the table under its ``<!-- known layer violations -->`` marker. Every import
counts, of every kind (:data:`KINDS`): one that goes up a layer, or that closes a cycle, fails the test
unless that very import (importer, imported, kind) is in the table; and a row of the table that no
longer matches a violating import fails it too, so the table only shrinks."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import fedfew

SRC = Path(fedfew.__file__).parent
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

#: How an import happens. ``module``: when the importer is imported (its top level, a class body, a
#: try block); ``function``: inside a function, when it runs; ``type``: under ``if TYPE_CHECKING:``,
#: annotations only, never run (still a dependency of the code's meaning); ``dynamic``:
#: ``importlib.import_module`` with a literal name, or an f-string whose literal part names a package
#: (every module directly in it); ``by-name``: a ``"fedfew.module:attr"`` string, or, in a module that
#: calls ``import_module`` with a computed name, any string naming a fedfew module (its lazy table).
#: ``init``: what a parent package's ``__init__`` imports at its top level, which Python runs before the
#: imported module (``import a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first): the importer depends
#: on it at run time as much as on the module it named.
KINDS = ("module", "function", "type", "dynamic", "by-name", "init")


def modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str  # a name as written; resolved to a module by import_graph
    kind: str
    line: int


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_module_call(node: ast.AST) -> ast.expr | None:
    """The name argument of an ``import_module(...)`` / ``importlib.import_module(...)`` call."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name == "import_module":
            return node.args[0]
    return None


def _literal_prefix(arg: ast.expr, module: str) -> str | None:
    """A literal name's text, or an f-string's literal start (``{__name__}`` read as the module's name)
    up to its first other placeholder, ending in ``.*``; None for a computed name."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        prefix = ""
        for value in arg.values:
            if isinstance(value, ast.Constant):
                prefix += str(value.value)
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) \
                    and value.value.id == "__name__":
                prefix += module
            else:
                return prefix + "*" if prefix.endswith(".") else None
        return prefix
    return None


def imports_of(module: str, source: str, is_package: bool = False) -> list[Import]:
    """Every import ``source`` (the module named ``module``) makes, of every kind in :data:`KINDS`."""
    tree = ast.parse(source)
    found: list[Import] = []
    computed = False

    def visit(node: ast.AST, kind: str) -> None:
        nonlocal computed
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                visit(statement, "type")
            for statement in node.orelse:
                visit(statement, kind)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and kind == "module":
            body = [node.body] if isinstance(node, ast.Lambda) else node.body
            for child in ast.iter_child_nodes(node):  # decorators and defaults run at the definition
                if child not in body:
                    visit(child, kind)
            for statement in body:
                visit(statement, "function")
            return
        if isinstance(node, ast.Import):
            found.extend(Import(module, alias.name, kind, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            found.extend(Import(module, f"{base}.{alias.name}", kind, node.lineno) for alias in node.names)
        else:
            arg = _import_module_call(node)
            if arg is not None:
                name = _literal_prefix(arg, module)
                if name is None:
                    computed = True
                else:
                    found.append(Import(module, name, "type" if kind == "type" else "dynamic", node.lineno))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"fedfew(\.\w+)*:\w+", node.value):
                found.append(Import(module, node.value.partition(":")[0], "by-name", node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    visit(tree, "module")
    if computed:  # a lazy table: every string naming a fedfew module may be imported by name
        found.extend(Import(module, node.value, "by-name", node.lineno) for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     and re.fullmatch(r"fedfew(\.\w+)+", node.value))
    return found


def _resolve(name: str, known: dict[str, Path]) -> list[str]:
    """The modules an imported name stands for: ``pkg.*`` every module directly in ``pkg``; else the
    module itself, or for ``from module import name`` the module (else the package) it comes from."""
    if name.endswith(".*"):
        prefix = name[:-1]
        return [m for m in known if m.startswith(prefix) and "." not in m[len(prefix):]]
    while name and name not in known:
        name = name.rpartition(".")[0]
    return [name] if name else []


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    kind: str
    lines: tuple[int, ...]


#: The kinds that run when the importer runs (a type import never does): each also runs the imported
#: module's parent packages' ``__init__``.
RUNS = ("module", "function", "dynamic", "by-name")


def parents(module: str, known: dict[str, Path]) -> list[str]:
    """The packages Python initialises before ``module``, outermost first (``fedfew``, ``fedfew.a``)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in known]


def import_graph() -> list[Edge]:
    """Every import between fedfew's modules: one edge per (importer, imported, kind), with the ``init``
    edges of Python's rule: importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``, so the importer
    also depends on what those import at their top level."""
    known = modules()
    lines: dict[tuple[str, str, str], list[int]] = {}
    top_level: dict[str, set[str]] = {}
    found_by: dict[str, list[Import]] = {}
    for name, path in known.items():
        found_by[name] = imports_of(name, path.read_text(), path.name == "__init__.py")
        top_level[name] = {target for found in found_by[name] if found.kind == "module"
                           for target in _resolve(found.imported, known)}
    for name, found_here in found_by.items():
        for found in found_here:
            for target in _resolve(found.imported, known):
                if target != name:
                    lines.setdefault((name, target, found.kind), []).append(found.line)
                if found.kind not in RUNS:
                    continue
                for package in parents(target, known):
                    for ran in top_level[package] - {name, package}:
                        lines.setdefault((name, ran, "init"), []).append(found.line)
    return [Edge(a, b, kind, tuple(sorted(set(at)))) for (a, b, kind), at in sorted(lines.items())]


# -- the declaration ----------------------------------------------------------------------------------------
def path_of(module: str) -> str:
    """A module as the declaration names it: its file relative to src/fedfew (``engine/base.py``)."""
    path = modules()[module]
    return path.relative_to(SRC).as_posix()


def declared_layers(text: str) -> list[tuple[str, list[str]]]:
    """The ```` ```layers ```` block: ``name: entries`` lines, top layer first; a line that starts
    with a space continues the layer above it; ``#`` starts a comment."""
    block = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    assert block, f"{ARCHITECTURE} has no ```layers block"
    layers: list[tuple[str, list[str]]] = []
    for raw in block.group(1).splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if line[0].isspace():
            assert layers, f"a continuation line before any layer: {raw!r}"
            layers[-1][1].extend(line.split())
        else:
            name, sep, entries = line.partition(":")
            assert sep, f"a layer line is 'name: entries': {raw!r}"
            layers.append((name.strip(), entries.split()))
    return layers


def layer_of(layers: list[tuple[str, list[str]]], known: dict[str, Path]) -> dict[str, tuple[int, str]]:
    """Each module's (height, layer name): a file named in a layer is in it; else the layer naming the
    nearest folder above it (``engine/``). Fails on a module in no layer, a file named twice and an
    entry that names nothing."""
    files: dict[str, tuple[int, str]] = {}
    folders: dict[str, tuple[int, str]] = {}
    for index, (name, entries) in enumerate(layers):
        height = len(layers) - index
        for entry in entries:
            table = folders if entry.endswith("/") else files
            assert entry not in table, f"{entry} is declared in two layers"
            table[entry] = (height, name)
    placed, used = {}, set()
    for module, path in known.items():
        relative = path.relative_to(SRC).as_posix()
        if relative in files:
            placed[module] = files[relative]
            used.add(relative)
            continue
        parents = [p for p in folders if relative.startswith(p)]
        assert parents, f"{relative} is in no layer of {ARCHITECTURE.name}'s ```layers block"
        nearest = max(parents, key=len)
        placed[module] = folders[nearest]
        used.add(nearest)
    stale = (set(files) | set(folders)) - used
    assert not stale, f"{ARCHITECTURE.name}'s ```layers block names what is not there: {sorted(stale)}"
    return placed


@dataclass(frozen=True)
class Known:
    importer: str  # paths, as the table writes them
    imported: str
    kind: str
    why: str


def known_violations(text: str) -> list[Known]:
    """The table after ``<!-- known layer violations -->``: | `importer` | `imported` | kind | why |."""
    marker = "<!-- known layer violations -->"
    assert marker in text, f"{ARCHITECTURE} has no {marker} table"
    rows = []
    for line in text.split(marker, 1)[1].lstrip("\n").splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= {"-", ":", " "} or cells[0].lower() == "importer":
            continue
        assert len(cells) == 4 and cells[2] in KINDS and cells[3], f"a malformed row: {line!r}"
        rows.append(Known(cells[0].strip("`"), cells[1].strip("`"), cells[2], cells[3]))
    return rows


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
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
        for w in sorted(graph.get(v, ())):
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@dataclass
class Check:
    """The import graph against the declaration: what goes up, what closes a cycle, and the table's
    rows that match nothing."""

    up: list[str]
    cycles: list[str]
    stale: list[str]


def check(edges: list[Edge], placed: dict[str, tuple[int, str]], known: list[Known], paths: dict[str, str]) -> Check:
    listed = {(k.importer, k.imported, k.kind) for k in known}

    def key(e: Edge) -> tuple[str, str, str]:
        return paths[e.importer], paths[e.imported], e.kind

    def say(e: Edge) -> str:
        (low, low_name), (high, high_name) = placed[e.importer], placed[e.imported]
        where = f"{paths[e.importer]} -> {paths[e.imported]} ({e.kind} import, line {', '.join(map(str, e.lines))})"
        if high > low:
            return f"{where}: layer '{low_name}' imports layer '{high_name}' above it"
        return f"{where}: within layer '{low_name}'" if high == low else f"{where}: down to layer '{high_name}'"

    def within(e: Edge) -> bool:
        # A package's __init__ importing its own modules is Python's idiom, not a cycle of the code: the
        # ``init`` edges count for the layers (above), not for cycles inside one.
        return e.kind != "init" and placed[e.imported][0] == placed[e.importer][0]

    up = [say(e) for e in edges if placed[e.imported][0] > placed[e.importer][0] and key(e) not in listed]
    # A cycle goes up a layer somewhere (reported above) or stays in one layer: the cycles to report here.
    remaining: dict[str, set[str]] = {}
    for e in edges:
        if within(e) and key(e) not in listed:
            remaining.setdefault(e.importer, set()).add(e.imported)
    cycles = []
    for component in strongly_connected(remaining):
        inside = [say(e) for e in edges if within(e) and key(e) not in listed
                  and e.importer in component and e.imported in component]
        cycles.append(f"a cycle through {', '.join(paths[m] for m in component)}:\n    " + "\n    ".join(inside))
    full: dict[str, set[str]] = {}
    for e in edges:
        if within(e):
            full.setdefault(e.importer, set()).add(e.imported)
    in_cycle = {m: i for i, component in enumerate(strongly_connected(full)) for m in component}
    real = {key(e) for e in edges if placed[e.imported][0] > placed[e.importer][0]
            or (within(e) and e.importer in in_cycle and in_cycle[e.importer] == in_cycle.get(e.imported))}
    stale = [f"{k.importer} -> {k.imported} ({k.kind})" for k in known if (k.importer, k.imported, k.kind) not in real]
    return Check(up, cycles, stale)


@pytest.fixture(scope="module")
def checked() -> Check:
    text = ARCHITECTURE.read_text()
    known = modules()
    placed = layer_of(declared_layers(text), known)
    paths = {m: p.relative_to(SRC).as_posix() for m, p in known.items()}
    rows = known_violations(text)
    assert len({(r.importer, r.imported, r.kind) for r in rows}) == len(rows), "a row is in the table twice"
    return check(import_graph(), placed, rows, paths)


def test_no_import_goes_up_a_layer(checked: Check) -> None:
    """Each layer imports only the layers below it (docs/architecture.md), by any kind of import."""
    assert not checked.up, "imports up a layer (move the code, or invert the dependency; docs/architecture.md):\n  " + \
        "\n  ".join(checked.up)


def test_no_import_cycle(checked: Check) -> None:
    assert not checked.cycles, "\n".join(checked.cycles)


def room_of(path: str) -> str:
    """A module's folder relative to src/fedfew ("" for the package's own files): one room each."""
    return path.rpartition("/")[0]


def folder_cycles(edges: list[Edge], paths: dict[str, str]) -> list[str]:
    """The imports between folders (each folder one room, of every kind but ``init``) that close a cycle
    of rooms: two folders importing each other, or a longer ring."""
    rooms: dict[str, set[str]] = {}
    for e in edges:
        a, b = room_of(paths[e.importer]), room_of(paths[e.imported])
        if e.kind != "init" and a != b:
            rooms.setdefault(a, set()).add(b)
    found = []
    for component in strongly_connected(rooms):
        inside = sorted({f"{paths[e.importer]} -> {paths[e.imported]} ({e.kind})" for e in edges
                         if e.kind != "init" and room_of(paths[e.importer]) in component
                         and room_of(paths[e.imported]) in component
                         and room_of(paths[e.importer]) != room_of(paths[e.imported])})
        names = ", ".join(f"{room or 'fedfew'}/" for room in component)
        found.append(f"folders {names} import each other:\n    " + "\n    ".join(inside))
    return found


def test_no_two_folders_import_each_other() -> None:
    """Drawn with each folder as one room, src/ has no ring of rooms (docs/architecture.md)."""
    known = modules()
    paths = {m: p.relative_to(SRC).as_posix() for m, p in known.items()}
    found = folder_cycles(import_graph(), paths)
    assert not found, "\n".join(found)


def test_the_layers_are_folders() -> None:
    """Every entry of the layers block is a folder, but the package's own two files at the top."""
    files = [entry for _, entries in declared_layers(ARCHITECTURE.read_text()) for entry in entries
             if not entry.endswith("/")]
    assert sorted(files) == ["__init__.py", "__main__.py"]


def test_parent_packages_count_and_rooms_find_rings() -> None:
    """The checker's two newer rules on made-up graphs: ``init`` edges of a parent package whose
    ``__init__`` imports upward go up a layer; two folders importing each other are a ring."""
    placed = {"p": (2, "high"), "p.sub.low": (1, "low"), "p.top": (2, "high"), "q.x": (1, "low")}
    paths = {"p": "p/__init__.py", "p.sub.low": "p/sub/low.py", "p.top": "p/top.py", "q.x": "q/x.py"}
    edges = [Edge("q.x", "p.top", "init", (1,))]
    assert check(edges, placed, [], paths).up == [
        "q/x.py -> p/top.py (init import, line 1): layer 'low' imports layer 'high' above it"]
    ring = [Edge("p.sub.low", "q.x", "module", (1,)), Edge("q.x", "p.sub.low", "function", (5,))]
    assert len(folder_cycles(ring, paths)) == 1
    assert folder_cycles(ring[:1], paths) == []
    assert parents("fedfew.interface.algorithm", modules()) == ["fedfew", "fedfew.interface"]


def test_importing_the_interface_runs_nothing_above_it() -> None:
    """``import fedfew.interface`` (every module of the algorithm contract) in a fresh interpreter loads no
    module of the engine, privacy, data or algorithms packages (nor anything above them)."""
    names = sorted(m for m in modules() if m.startswith("fedfew.interface"))
    code = (f"import sys; import {', '.join(names)}; "
            "print(sorted(m for m in sys.modules if m.startswith('fedfew.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = eval(done.stdout)  # a printed list of names
    above = [m for m in loaded if m.split(".")[1] in {"engine", "privacy", "data", "algorithms", "flower", "config",
                                                      "run", "study", "cli"}]
    assert above == [] and "fedfew.interface.algorithm" in loaded


def test_the_known_violations_are_exact(checked: Check) -> None:
    """A row of the known-violations table whose import is gone (or no longer goes up or round a
    cycle) must leave the table: it only shrinks."""
    assert not checked.stale, "rows of the known-violations table that match no violating import (gone, or of another kind): update docs/architecture.md:\n  " + \
        "\n  ".join(checked.stale)


# -- the checker itself ---------------------------------------------------------------------------------------
def test_the_import_finder_sees_every_kind() -> None:
    source = '''
import importlib
from typing import TYPE_CHECKING
from fedfew import errors
from . import sibling
if TYPE_CHECKING:
    from fedfew.config.validation import ExperimentConfig
class A:
    import fedfew.core.seeding
    def method(self):
        from fedfew.run.runner import run_experiment
def f():
    importlib.import_module("fedfew.flower.simulation")
    importlib.import_module(f"{__name__}.{name}")
TABLE = {"x": "fedfew.flower.launch:FlowerLaunch"}
'''
    found = {(i.imported, i.kind) for i in imports_of("fedfew.pkg", source, is_package=True)}
    assert found == {("importlib", "module"), ("typing.TYPE_CHECKING", "module"), ("fedfew.errors", "module"),
                     ("fedfew.pkg.sibling", "module"), ("fedfew.config.validation.ExperimentConfig", "type"),
                     ("fedfew.core.seeding", "module"), ("fedfew.run.runner.run_experiment", "function"),
                     ("fedfew.flower.simulation", "dynamic"), ("fedfew.pkg.*", "dynamic"),
                     ("fedfew.flower.launch", "by-name")}
    lazy = imports_of("fedfew.x", 'import importlib\nT = {"a": ("fedfew.run.sweep", "f")}\n'
                                  'def get(n):\n    return importlib.import_module(T[n][0])\n')
    assert ("fedfew.run.sweep", "by-name") in {(i.imported, i.kind) for i in lazy}


def test_the_checker_finds_what_goes_up_and_round() -> None:
    placed = {"a": (1, "low"), "b": (2, "high"), "c": (1, "low"), "d": (1, "low")}
    paths = {m: f"{m}.py" for m in placed}
    edges = [Edge("a", "b", "type", (3,)), Edge("c", "d", "module", (1,)), Edge("d", "c", "function", (9,))]
    got = check(edges, placed, [], paths)
    assert got.up == ["a.py -> b.py (type import, line 3): layer 'low' imports layer 'high' above it"]
    assert len(got.cycles) == 1 and "c.py, d.py" in got.cycles[0]
    rows = [Known("a.py", "b.py", "type", "why"), Known("d.py", "c.py", "function", "why"),
            Known("c.py", "a.py", "module", "gone")]
    got = check(edges, placed, rows, paths)
    assert got.up == [] and got.cycles == [] and got.stale == ["c.py -> a.py (module)"]
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


# -- the rest of the package's shape --------------------------------------------------------------------------
def test_the_engine_registry_loads_the_engines_it_names_only_when_asked() -> None:
    """``fedfew.config.engines`` names the built-in engines ("module:class") instead of importing them: the config
    check and the experiment import it without Flower's package; asking for a name loads that one."""
    code = ("import sys; import fedfew.config.engines; from fedfew.config.validation import load_config; "
            "load_config({'task': 'fewshot', 'dataset': {'name': 'digits'}, 'algorithm': {'name': 'fedavg'}}); "
            "print(sorted(m for m in sys.modules if m.startswith(('fedfew.flower', 'fedfew.engine.workers'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    from fedfew.config.engines import BUILT_IN, ENGINES
    from fedfew.engine.base import ENGINES as REGISTERED

    for name, where in BUILT_IN.items():
        module, _, attribute = where.partition(":")
        assert ENGINES.get(name) is getattr(importlib.import_module(module), attribute) is REGISTERED.get(name)
        assert ENGINES.describe(name)
    assert set(BUILT_IN) | {"inprocess"} <= set(ENGINES.names()) == set(REGISTERED.names())


def test_only_the_flower_package_imports_flwr() -> None:
    runs = [e for name, path in modules().items()
            for e in imports_of(name, path.read_text(), path.name == "__init__.py")]
    outside = [(e.importer, e.imported) for e in runs if not e.importer.startswith("fedfew.flower")
               and (e.imported == "flwr" or e.imported.startswith("flwr."))]
    assert outside == []
    # and the flower package's entry points import it only when a Flower run starts
    for name in ("fedfew.flower", "fedfew.flower.launch", "fedfew.flower.errors"):
        assert not any(e.imported.startswith("flwr") for e in runs if e.importer == name and e.kind != "type"), name


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
    """Sampling draws on the CPU from the seeded generators on every device (fedfew.interface.compute): a
    draw that names no device would land on the GPU's default device there and fail."""
    found = [f"{path.relative_to(SRC)}:{line}" for path in sorted(SRC.rglob("*.py"))
             for line in undeviced_draws(path.read_text())]
    assert not found, found
