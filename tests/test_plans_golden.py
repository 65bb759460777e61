"""Replay the golden plans corpus (``../shared/golden/plans``, recorded from the real Caffe2)
with the reference runner; every case must pass. The plans with concurrent instances are run
three times over, as their results must not depend on thread timing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(os.environ.get("FERROCAFFE_GOLDEN", REPO.parent / "shared" / "golden"))
RUNNER = GOLDEN / "tools" / "run_golden.py"
PLANS = GOLDEN / "plans"


def _case_names():
    with open(PLANS / "cases.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["name"] for line in f if line.strip()]


NAMES = _case_names()


def _run(tmp_path, *extra):
    out = tmp_path / "report.json"
    cmd = [sys.executable, str(RUNNER), str(PLANS), "ferrocaffe", "--json-report", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        return json.load(f), proc


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    rep, _ = _run(tmp_path_factory.mktemp("plans"))
    return {c["name"]: c for c in rep["cases"]}


@pytest.mark.parametrize("name", NAMES)
def test_plan_case(report, name):
    case = report.get(name)
    assert case is not None, "runner did not report %s" % name
    assert case["pass"], "\n".join(case["diffs"])


def test_every_case_was_replayed(report):
    assert sorted(report) == sorted(NAMES) and len(NAMES) == 19


def test_concurrent_instances_are_stable(tmp_path):
    for _ in range(3):
        rep, proc = _run(tmp_path, "-k", "num_concurrent_instances")
        assert rep["failed"] == 0 and rep["passed"] == 2, proc.stdout[-2000:]
