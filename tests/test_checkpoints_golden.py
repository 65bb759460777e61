"""Replay the golden checkpoint corpus (``../shared/golden/checkpoints``): Save / Load /
Checkpoint / DBExists on minidb and protodb files Caffe2 wrote (and on the files ferrocaffe
writes, round trip), and SerializeBlob / DeserializeBlob. Every case must pass."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(os.environ.get("FERROCAFFE_GOLDEN", REPO.parent / "shared" / "golden"))
RUNNER = GOLDEN / "tools" / "run_golden.py"
CKPT = GOLDEN / "checkpoints"


def _names():
    with open(CKPT / "cases.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["name"] for line in f if line.strip()]


NAMES = _names()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "report.json"
    cmd = [sys.executable, str(RUNNER), str(CKPT), "ferrocaffe", "--json-report", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        return {c["name"]: c for c in json.load(f)["cases"]}


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_case(report, name):
    case = report.get(name)
    assert case is not None, "runner did not report %s" % name
    assert case["pass"], "\n".join(case["diffs"])


def test_corpus_size():
    assert len(NAMES) == 98
