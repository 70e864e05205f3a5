"""The layering rule, read from the code: the core never imports the experiment, and no module
imports itself back through others. Every import counts: module level, inside functions, and
module names written as strings (importlib, entry points)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
EXPERIMENT = "pivotrl_testbed"
PACKAGES = ("pivotrl", EXPERIMENT)


def module_files() -> dict[str, Path]:
    out = {}
    for path in (p for pkg in PACKAGES for p in (SRC / pkg).rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    """The module a dotted name lives in (`pivotrl.io.records.Turn` -> `pivotrl.io.records`)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    mods = module_files()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"pivotrl(_testbed)?(\.\w+)*(:\w+)?", node.value):
                    names = [node.value.split(":")[0]]
            for name in names:
                target = _owner(name, mods) if name.startswith("pivotrl") else None
                # A module importing an enclosing package of its own is not an edge (Python
                # initialises the package first anyway).
                if target and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def is_experiment(mod: str) -> bool:
    return mod == EXPERIMENT or mod.startswith(EXPERIMENT + ".")


def test_core_never_imports_the_experiment():
    graph = import_graph()
    leaks = sorted(f"{m} -> {t}" for m, targets in graph.items()
                   if not is_experiment(m) for t in targets if is_experiment(t))
    assert leaks == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checker_sees_what_it_must():
    # The checker itself must be able to fail: a two-module cycle and a function-level import.
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    graph = import_graph()
    assert "pivotrl.io.records" in graph["pivotrl.extract"]
    assert "pivotrl.cli.run_verb" in graph["pivotrl_testbed.cli"]  # imported inside functions


def test_no_core_file_over_500_lines():
    big = {m: n for m, p in module_files().items() if (n := len(p.read_text().splitlines())) > 500}
    assert big == {}


# Floors of the core, lowest first: files and records; parsing and the sandbox; the engines and the
# verifiers; the one scoring path (parse, then verify); the method's steps; the command line. An
# import goes down or sideways, never up, so each floor can be read (and tested) without the ones
# above it: a verifier never reaches for the scoring path that calls it.
FLOORS = {"io": 0, "formats": 1, "sandbox": 1, "verifiers": 2, "sampling": 2, "scoring": 3,
          "extract": 4, "profile": 4, "select": 4, "evaluate": 4, "train": 4, "export": 4,
          "cli": 5}
TESTBED_FLOOR = 6  # the experiment stands on the library's public API, the CLI's helpers included


def floor_of(module: str) -> int | None:
    if is_experiment(module):
        return TESTBED_FLOOR
    parts = module.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets)
            if floor_of(a) is not None and floor_of(b) is not None and floor_of(b) > floor_of(a)]


def test_every_top_level_entry_has_a_floor():
    entries = {p.stem for p in (SRC / "pivotrl").iterdir()
               if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert entries == set(FLOORS)


def test_no_import_runs_up_a_floor():
    assert upward_imports(import_graph()) == []
    # the check can fail: an io module importing a step is caught
    assert upward_imports({"pivotrl.io.records": {"pivotrl.select"}}) == ["pivotrl.io.records -> pivotrl.select"]
    assert upward_imports({"pivotrl.verifiers.x": {"pivotrl.scoring"}}) == ["pivotrl.verifiers.x -> pivotrl.scoring"]


def cli_code_outside_the_cli(files: dict[str, Path]) -> list[str]:
    """Library modules (everything under pivotrl/ but pivotrl/cli/) that import typer or rich or
    call print(): the library returns results and logs; only the verbs draw tables or parse flags."""
    found = []
    for mod, path in sorted(files.items()):
        if is_experiment(mod) or mod == "pivotrl.cli" or mod.startswith("pivotrl.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{mod} imports {n}" for n in names if n.split(".")[0] in ("typer", "rich")]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{mod} calls print() at line {node.lineno}")
    return found


def test_no_command_line_code_in_the_library(tmp_path):
    assert cli_code_outside_the_cli(module_files()) == []
    # the check can fail: a library module drawing a table, or printing
    (tmp_path / "a.py").write_text("from rich.table import Table\n")
    (tmp_path / "b.py").write_text("def f():\n    import typer\n    print('x')\n")
    assert cli_code_outside_the_cli({"pivotrl.io.a": tmp_path / "a.py", "pivotrl.cli.b": tmp_path / "b.py",
                                     "pivotrl.select": tmp_path / "b.py"}) == [
        "pivotrl.io.a imports rich.table", "pivotrl.select imports typer", "pivotrl.select calls print() at line 3"]
