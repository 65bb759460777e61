"""Replay the golden RNN corpus (``../shared/golden/rnn``) with the reference runner: LSTM (1
and 2 layers, full and partial sequence lengths, a large case), GRU and a custom step net,
forward and gradient, each run with ``enable_rnn_executor`` 1 (as stored) and 0, which must
match Caffe2 and each other; plus the forward-only ``lstm_lm`` model of the models corpus."""

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, golden_path

GOLDEN = golden_path()
RUNNER = GOLDEN / "tools" / "run_golden.py"


def _names(corpus):
    with open(GOLDEN / corpus / "cases.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["name"] for line in f if line.strip()]


RNN_CASES = _names("rnn")
LSTM_MODELS = [n for n in _names("models") if ".lstm_lm" in n]


def _replay(tmp_path, corpus, names):
    out = tmp_path / "report.json"
    cmd = [
        sys.executable,
        str(RUNNER),
        str(GOLDEN / corpus),
        "ferrocaffe",
        "--json-report",
        str(out),
    ]
    for name in names:
        cmd += ["-k", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        cases = {c["name"]: c for c in json.load(f)["cases"]}
    return proc, cases


@pytest.fixture(scope="module")
def rnn_report(tmp_path_factory):
    return _replay(tmp_path_factory.mktemp("rnn"), "rnn", [])


@pytest.mark.parametrize("name", RNN_CASES)
def test_rnn_case(rnn_report, name):
    _, cases = rnn_report
    case = cases.get(name)
    assert case is not None, "runner did not report %s" % name
    assert case["pass"], "\n".join(case["diffs"])


def test_every_rnn_case_ran_and_passed(rnn_report):
    proc, cases = rnn_report
    assert len(RNN_CASES) >= 6
    assert set(cases) == set(RNN_CASES)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "rnn: %d passed, 0 failed" % len(RNN_CASES) in proc.stdout


def test_executor_and_plain_runs_agree_exactly(rnn_report):
    """The runner records the largest difference between the executor and the plain run."""
    _, cases = rnn_report
    for name, case in cases.items():
        assert case.get("info", {}).get("executor_max_abs_diff") == 0.0, name


def test_forward_only_lstm_language_model(tmp_path):
    assert LSTM_MODELS
    proc, cases = _replay(tmp_path, "models", LSTM_MODELS)
    for name in LSTM_MODELS:
        assert cases[name]["pass"], "\n".join(cases[name]["diffs"])
    assert proc.returncode == 0
