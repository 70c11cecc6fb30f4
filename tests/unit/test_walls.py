"""The walls between services/' shared packages (docs/architecture.md section 9), checked on the source.

Each package's `__init__` docstring says what it may import; these tests read every import statement
(module level and inside functions alike: a function-level import crosses a wall too) and fail on
one that crosses: torch in a package every torch-free image loads, model code in the job contract,
jobs in the model stages, librosa anywhere, or the old `services.common`.
"""

from __future__ import annotations

import ast

import pytest

from tests.helpers.imports import SERVICES, crosses, imported_names

# package -> the top-level names (or services.<package> prefixes) none of its modules may import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "serving": ("torch", "torchvision", "services.media", "services.jobs", "services.inference"),
    "media": ("torch", "torchvision", "services.jobs", "services.inference"),
    "jobs": ("torch", "torchvision", "services.inference"),
    "inference": ("services.jobs",),
    "live": ("torch", "torchvision", "services.inference"),
    "web": ("torch", "torchvision", "services.inference", "services.media", "services.jobs"),
}


# The deployables (services/serving/stages.py): none imports another's package; what two of them
# share lives in a shared package named by what it is (local mode, which starts them all, may).
DEPLOYABLES = ("audio", "lipsync", "superres", "gateway", "render", "live", "web")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_beyond_its_wall(package: str) -> None:
    offenders = [
        f"{path.relative_to(SERVICES.parent)}:{line}: {name}"
        for path in sorted((SERVICES / package).rglob("*.py"))
        for line, name in imported_names(path)
        if any(crosses(name, f) for f in FORBIDDEN[package])
    ]
    assert not offenders, f"services/{package} may not import {', '.join(FORBIDDEN[package])}:\n" + "\n".join(offenders)


def test_nothing_imports_services_common() -> None:
    roots = [SERVICES, SERVICES.parent / "tests", SERVICES.parent / "bench", SERVICES.parent / "scripts"]
    offenders = [
        f"{path.relative_to(SERVICES.parent)}:{line}: {name}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        for line, name in imported_names(path)
        if crosses(name, "services.common")
    ]
    assert not (SERVICES / "common").exists(), (
        "services/common/ is back: put the file in serving, media, jobs or inference"
    )
    assert not offenders, "\n".join(offenders)


def test_no_service_imports_librosa() -> None:
    """librosa is the reference the tests check the mels against, not a service's import: its utilities
    are numba-compiled in every fresh pod (services/media/mel_filters.py), and no image installs it."""
    offenders = [
        f"{path.relative_to(SERVICES.parent)}:{line}: {name}"
        for path in sorted(SERVICES.rglob("*.py"))
        for line, name in imported_names(path)
        if crosses(name, "librosa") or crosses(name, "numba")
    ]
    assert not offenders, "\n".join(offenders)


def test_every_shared_package_says_what_it_may_import() -> None:
    for package in FORBIDDEN:
        doc = ast.get_docstring(ast.parse((SERVICES / package / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert "May import" in doc, f"services/{package}/__init__.py: the docstring says what the package may import"


@pytest.mark.parametrize("package", DEPLOYABLES)
def test_a_deployable_imports_no_other_deployable(package: str) -> None:
    others = [f"services.{other}" for other in DEPLOYABLES if other != package]
    offenders = [
        f"{path.relative_to(SERVICES.parent)}:{line}: {name}"
        for path in sorted((SERVICES / package).rglob("*.py"))
        for line, name in imported_names(path)
        if any(crosses(name, other) for other in others)
    ]
    assert not offenders, (
        f"services/{package} imports another deployable (move the shared code to a shared package):\n"
        + "\n".join(offenders)
    )
