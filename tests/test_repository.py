"""The repository keeps its shape: imports run downwards with no circle, the tools sit above the library, library
modules stay readable in size, and the project's text speaks of the design, not of how it was made."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "flashattn"
MAX_LIBRARY_MODULE_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, at module level or inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # ``from package import module`` imports the module; ``from module import name``, the module
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
            targets = submodules if len(submodules) == len(node.names) else [base, *submodules]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imported_modules(path, set(paths)) for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_library_never_imports_the_tools():
    graph = import_graph()
    offenders = {name: sorted(t for t in targets if t.startswith("flashattn.tools"))
                 for name, targets in graph.items()
                 if not name.startswith("flashattn.tools") and name != "flashattn.__main__"}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_library_modules_stay_readable():
    """Kernels may be long (one kernel and its jit helpers); every other library module stays near 500 lines."""
    long = {str(path.relative_to(ROOT)): lines for path in PACKAGE.rglob("*.py")
            if not {"kernels", "tools"} & set(path.relative_to(PACKAGE).parts)
            and (lines := len(path.read_text().splitlines())) > MAX_LIBRARY_MODULE_LINES}
    assert long == {}


# Work-log phrases: labels of work periods, device runs and numbered attempts. Package versions ("torch 2.11") are
# data, and so are commit hashes where a figure needs them.
WORK_LOG = [
    re.compile(r"\b[Ss]essions? \d"),
    re.compile(r"\b[Cc]alls? [A-Z](-[A-Z])?\b(?! ?=)"),
    re.compile(r"\b[Vv]ersions? \d+(\.\d+)?\b(?!\.\d)"),
    re.compile(r"\bperf-notes(\.md)?,? version"),
    re.compile(r"\b[Aa]ttempt \d"),
    re.compile(r"\bkernel v\d"),
]


def project_text() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    files += sorted((ROOT / "benchmarks").glob("*.sh"))
    files += [p for p in sorted((ROOT / "tests").glob("*.py")) if p.name != Path(__file__).name]
    return [p for p in files if p.exists()]


@pytest.mark.parametrize("pattern", WORK_LOG, ids=lambda p: p.pattern)
def test_no_work_log_phrases(pattern):
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
            for path in project_text() for number, line in enumerate(path.read_text().splitlines(), 1)
            if pattern.search(line)]
    assert hits == []


# the flagged examples are assembled, so that this file does not itself read as a work log
@pytest.mark.parametrize("text, flagged", [
    ("measured in sess" + "ion 31", True), ("cal" + "l B's script", True),
    ("docs/perf-notes.md, ver" + "sion 23", True),
    ("kernel ver" + "sion 23", True), ("atte" + "mpt 2 failed", True), ("torch 2.11.0+cu130, triton 3.6.0", False),
    ("CUDA 12.8", False), ("a call to the op", False), ("cal" + "ls A-C", True),
])
def test_the_work_log_patterns(text, flagged):
    assert any(p.search(text) for p in WORK_LOG) == flagged


def test_no_paths_outside_the_repository():
    hits = [f"{path.relative_to(ROOT)}:{number}" for path in project_text()
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if "../shared" in line or "/work/" in line]
    assert hits == []


def test_the_repository_holds_no_per_run_folders():
    results = ROOT / "benchmarks" / "results"
    assert not [p.name for p in results.iterdir() if p.is_dir()] if results.exists() else True
