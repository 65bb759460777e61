"""Replay the golden model corpus (``../shared/golden/models``) with the reference runner: every
model whose op types all have kernels must reproduce Caffe2's outputs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ferrocaffe import _native

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(os.environ.get("FERROCAFFE_GOLDEN", REPO.parent / "shared" / "golden"))
RUNNER = GOLDEN / "tools" / "run_golden.py"
MODELS = GOLDEN / "models"
KERNELS = set(_native.kernel_types())


def _runnable():
    names = []
    with open(MODELS / "cases.jsonl", encoding="utf-8") as f:
        for line in f:
            c = json.loads(line)
            need = set(c["op_census"]) | set(c.get("op_census_nested") or {})
            need |= set(c.get("init_op_census") or {})
            if need <= KERNELS:
                names.append(c["name"])
    return names


RUNNABLE = _runnable()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "report.json"
    cmd = [sys.executable, str(RUNNER), str(MODELS), "ferrocaffe", "--json-report", str(out)]
    for name in RUNNABLE:
        cmd += ["-k", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        return {c["name"]: c for c in json.load(f)["cases"]}


@pytest.mark.parametrize("name", RUNNABLE)
def test_model(report, name):
    case = report.get(name)
    assert case is not None, "runner did not report %s" % name
    assert case["pass"], "\n".join(case["diffs"])


def test_most_models_are_runnable():
    assert len(RUNNABLE) >= 12
