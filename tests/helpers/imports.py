"""What the source imports, read with `ast` (every import statement, module level and inside functions
alike): the walls between services' packages (tests/unit/test_walls.py) and what each image's code can
reach (tests/unit/test_images.py)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[2] / "services"


def imported_names(path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted module name) of every import in a source file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(SERVICES.parent).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            yield node.lineno, base
            for alias in node.names:  # `from services import jobs` names a package too
                yield node.lineno, f"{base}.{alias.name}"


def crosses(name: str, forbidden: str) -> bool:
    return name == forbidden or name.startswith(forbidden + ".")


def _module_file(name: str) -> Path | None:
    path = SERVICES.parent / Path(*name.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return path / "__init__.py" if (path / "__init__.py").is_file() else None


def third_party_imports(package: str) -> dict[str, list[str]]:
    """The top-level names of the non-stdlib modules that `services/<package>` can import, directly or
    through the `services.*` modules it imports (and their packages' `__init__`), each with the places
    that import it: an over-estimate of what its image needs at run time (an import inside a function
    counts even where the function is never called there)."""
    todo, seen = sorted((SERVICES / package).rglob("*.py")), set()
    found: dict[str, list[str]] = {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        parts = path.relative_to(SERVICES.parent).parts
        todo += [SERVICES.parent.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]
        for line, name in imported_names(path):
            if crosses(name, "services"):
                module = _module_file(name)
                if module is not None:
                    todo.append(module)
            elif (top := name.split(".")[0]) and top not in sys.stdlib_module_names:
                found.setdefault(top, []).append(f"{path.relative_to(SERVICES.parent)}:{line}")
    return found
