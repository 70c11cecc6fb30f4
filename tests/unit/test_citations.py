"""Code and docs cite the design as built (docs/architecture.md), never a design file outside the
repository: a reader of a clone must be able to follow every reference (issue 29)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = "DESIGN" + ".md"  # spelled in two parts so this file does not cite it
SOURCES = ("services", "docs", "tests", "bench", "scripts", "clients", "helm", "protos")
SUFFIXES = {".py", ".md", ".proto", ".yaml", ".yml", ".js", ".html", ".sh", ".txt", ".toml"}


def test_no_file_cites_a_design_file_outside_the_repository() -> None:
    files = [REPO / "README.md", REPO / "pyproject.toml", REPO / "Makefile"]
    for top in SOURCES:
        files += [
            p
            for p in (REPO / top).rglob("*")
            if p.suffix in SUFFIXES and "node_modules" not in p.parts and "__pycache__" not in p.parts and p.is_file()
        ]
    citing = [str(p.relative_to(REPO)) for p in files if OUTSIDE in p.read_text(errors="replace")]
    assert not citing, f"cite docs/architecture.md instead of {OUTSIDE}: {citing}"
