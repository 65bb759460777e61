"""Shared fixtures. The golden corpus recorded from Caffe2 lives outside the repository, at
``../shared/golden`` relative to the repository root, or wherever ``$FERROCAFFE_GOLDEN`` says."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def golden_path() -> Path:
    override = os.environ.get("FERROCAFFE_GOLDEN")
    return Path(override) if override else REPO_ROOT.parent / "shared" / "golden"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    path = golden_path()
    if not (path / "README.md").is_file():
        pytest.fail(
            f"golden corpus not found at {path}: put it at ../shared/golden beside the "
            "repository or set FERROCAFFE_GOLDEN"
        )
    return path
