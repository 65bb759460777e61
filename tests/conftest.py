"""Shared fixtures. The golden corpus recorded from Caffe2 lives in the repository at
``tests/golden`` (see its README), or wherever ``$FERROCAFFE_GOLDEN`` says."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def golden_path() -> Path:
    override = os.environ.get("FERROCAFFE_GOLDEN")
    return Path(override) if override else REPO_ROOT / "tests" / "golden"


def side_file(name: str) -> Path:
    """A file recorded beside the corpora (``op-catalog.json``, ``caffe2-wire-format.json``):
    inside the corpus root in the repository, one level up where ``$FERROCAFFE_GOLDEN`` points
    at a copy laid out as the original recording."""
    root = golden_path()
    inside = root / name
    return inside if inside.exists() else root.parent / name


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    path = golden_path()
    if not (path / "README.md").is_file():
        pytest.fail(
            f"golden corpus not found at {path}: it ships in the repository at tests/golden; "
            "FERROCAFFE_GOLDEN, when set, must point at a copy of it"
        )
    return path
