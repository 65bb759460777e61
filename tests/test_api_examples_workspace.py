"""The ``workspace`` group of the golden API examples (``api_examples.jsonl``): feeding,
fetching and running tiny nets, replayed with the reference runner. ``gradient_net_runs``
also needs ``core.GradientRegistry``; until that lands it may only fail for that reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(os.environ.get("FERROCAFFE_GOLDEN", REPO.parent / "shared" / "golden"))
CORPUS = GOLDEN / "api_examples.jsonl"
RUNNER = GOLDEN / "tools" / "run_api_examples.py"

NEEDS_GRADIENTS = {"workspace.gradient_net_runs": "GradientRegistry"}


def _names():
    with open(CORPUS, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    return [c["name"] for c in cases if c["group"] == "workspace"]


NAMES = _names()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("api_ws") / "report.json"
    cmd = [
        sys.executable,
        str(RUNNER),
        str(CORPUS),
        "ferrocaffe",
        "--group",
        "workspace",
        "--mode",
        "fork",
        "-j",
        "2",
        "--json-report",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        rep = json.load(f)
    cases = rep["cases"] if isinstance(rep, dict) else rep
    return {c["name"]: c for c in cases}


@pytest.mark.parametrize("name", NAMES)
def test_workspace_example(report, name):
    case = report[name]
    if case["pass"]:
        return
    text = json.dumps(case)
    marker = NEEDS_GRADIENTS.get(name)
    assert marker is not None and marker in text, text[:3000]


def test_group_size():
    assert len(NAMES) == 21
