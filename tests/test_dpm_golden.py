"""Replay the golden data-parallel corpus (``../shared/golden/dpm``): the nets that
``data_parallel_model.Parallelize_CPU`` built, trained for 5 iterations on 2-4 CPU devices
(dag executor), must reproduce Caffe2's parameters, momentum and losses, as must the
one-device runs, the extracted predictor and the checkpoint resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(os.environ.get("FERROCAFFE_GOLDEN", REPO.parent / "shared" / "golden"))
RUNNER = GOLDEN / "tools" / "run_golden.py"
DPM = GOLDEN / "dpm"


def _names():
    with open(DPM / "cases.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["name"] for line in f if line.strip()]


NAMES = _names()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("dpm") / "report.json"
    cmd = [sys.executable, str(RUNNER), str(DPM), "ferrocaffe", "--json-report", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        return {c["name"]: c for c in json.load(f)["cases"]}


@pytest.mark.parametrize("name", NAMES)
def test_dpm_case(report, name):
    case = report.get(name)
    assert case is not None, "runner did not report %s" % name
    assert case["pass"], "\n".join(case["diffs"])
