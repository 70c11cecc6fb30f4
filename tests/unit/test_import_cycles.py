"""No import circle among services/' modules (issue 18), checked on the source.

A circle works only as long as each module's imports happen in the right order (or stay inside a
function), and it hides which module is the interface and which the implementation. Every import
statement counts, module-level and function-level alike: a function-level import is a circle that
waits for its first call. `from package import name` is an edge to `package.name` when that is a
module (`from services.jobs.store import fair_claim`), else to the package.

Importing `a.b.c` also runs `a/__init__` and `a/b/__init__`; those implicit edges are left out, as
import-graph tools do, because a package's `__init__` that imports its own submodules would
otherwise always be a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
MAX_LISTED = 20


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> source file of every module under `root` (packages by their `__init__`)."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `name` (at `path`) imports, anywhere in its source."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return {target for target in found if target in modules and target != name}


def import_graph(root: Path) -> nx.DiGraph:
    modules = module_names(root)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, target) for target in imported_modules(name, path, modules))
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """Every elementary circle, each starting at its smallest name (a stable order for the message)."""
    cycles = []
    for cycle in nx.simple_cycles(import_graph(root)):
        start = cycle.index(min(cycle))
        cycles.append(cycle[start:] + cycle[:start])
    return sorted(cycles)


def test_services_have_no_import_cycle() -> None:
    cycles = import_cycles(SERVICES)
    listed = "\n".join(" -> ".join([*cycle, cycle[0]]) for cycle in cycles[:MAX_LISTED])
    more = f"\n... and {len(cycles) - MAX_LISTED} more" if len(cycles) > MAX_LISTED else ""
    assert not cycles, (
        f"{len(cycles)} import circle(s) in services/ (move the shared piece so imports go one way):\n{listed}{more}"
    )


def test_the_graph_sees_function_level_and_submodule_imports() -> None:
    """The edges that the circles opened in issue 18 ran through still count, so a circle like them is found."""
    graph = import_graph(SERVICES)
    assert graph.has_edge("services.jobs.store", "services.jobs.store.sqlite")  # inside open_job_store
    assert graph.has_edge("services.render.mp4", "services.media.av_limits")  # `from package import module`
    assert graph.has_edge("services.serving.server", "services.serving.channels")
    assert not graph.has_edge("services.jobs.store.sqlite", "services.jobs.store")  # parents are not edges


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_circles_through_functions_relative_imports_and_submodules_are_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    _write(
        pkg,
        {
            "__init__.py": "",
            "server.py": "def start():\n    from pkg import channels\n",
            "channels.py": "from .server import start\n",
            "store/__init__.py": "def open_store():\n    from pkg.store.sqlite import Sqlite\n",
            "store/sqlite.py": "from pkg.store.jobs import Store\n",
            "store/jobs.py": "import pkg.store\n",
            "alone.py": "import os\nfrom pkg import server\n",
        },
    )
    assert import_cycles(pkg) == [
        ["pkg.channels", "pkg.server"],
        ["pkg.store", "pkg.store.sqlite", "pkg.store.jobs"],
    ]
    (pkg / "store" / "jobs.py").write_text("import abc\n", encoding="utf-8")
    (pkg / "server.py").write_text("def start():\n    pass\n", encoding="utf-8")
    assert import_cycles(pkg) == []
