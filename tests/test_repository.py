"""The repository stands on its own: its docs link only to what a clone has, and running a
benchmark changes no tracked file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()[:200]}")
    return done.stdout


def test_markdown_links_point_inside_the_repository() -> None:
    broken = []
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = document.read_text()
        if "../shared" in text:
            broken.append(f"{document.name}: mentions ../shared")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (document.parent / target).resolve().is_relative_to(ROOT):
                broken.append(f"{document.name}: {target} is outside the repository")
            elif not (document.parent / target).exists():
                broken.append(f"{document.name}: {target} does not exist")
    assert not broken, "\n".join(broken)
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()


def test_benchmark_outputs_go_to_an_ignored_folder() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    out = Path(_common.OUT_DIR).relative_to(ROOT)
    assert _git("ls-files", str(out)) == "", "run outputs are tracked"
    assert _git("check-ignore", "--no-index", str(out / "bench_storage.json")).strip()
    assert _git("ls-files", "benchmarks/results") == ""


def test_the_package_metadata_builds_without_deprecation_warnings() -> None:
    """`make demo` printed setuptools' "project.license as a TOML table is deprecated" banner twice."""
    script = (
        "import warnings\n"
        "from setuptools.config.pyprojecttoml import apply_configuration\n"
        "from setuptools.dist import Distribution\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    apply_configuration(Distribution(), 'pyproject.toml')\n"
        "print([f'{type(w.message).__name__}: {w.message}' for w in seen])\n"
    )
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Deprecat" not in done.stdout, done.stdout
