"""Replay the golden API-example corpus (``api_examples.jsonl``, recorded from the real Caffe2)
against ferrocaffe with the reference runner, one pytest case per corpus case.

Every case of the groups in ``GROUPS`` must pass, except the ones in ``EXCLUDED``: those need a
part of ferrocaffe that is not written yet. An excluded case may pass; if it fails, its failure
must be the documented one (the runner's diff mentions ``marker``), so nothing else can hide
behind an exclusion.
"""

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

# Every group of the corpus.
GROUPS = (
    "blobref",
    "scope",
    "create_operator",
    "net",
    "misc",
    "device",
    "plan",
    "clone_bind",
    "ssa",
    "workspace",
)

# case name -> (reason, marker that the failure must mention). Empty: every case of GROUPS passes.
EXCLUDED: dict[str, tuple[str, str]] = {}


def _corpus_cases():
    with open(CORPUS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


CASES = [c["name"] for c in _corpus_cases() if c["group"] in GROUPS]


@pytest.fixture(scope="session")
def report(tmp_path_factory):
    """Run the reference runner once over GROUPS; case name -> {'pass', 'diffs'}."""
    out = tmp_path_factory.mktemp("api_examples") / "report.json"
    cmd = [sys.executable, str(RUNNER), str(CORPUS), "ferrocaffe", "--mode", "fork", "-j", "2"]
    for g in GROUPS:
        cmd += ["--group", g]
    cmd += ["-q", "--json-report", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.exists(), f"runner wrote no report:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    with open(out, encoding="utf-8") as f:
        return {entry["name"]: entry for entry in json.load(f)}


def test_runner_covered_every_selected_case(report):
    assert sorted(report) == sorted(CASES)
    assert len(CASES) > 250


def test_exclusions_name_real_cases():
    groups = {c["name"]: c["group"] for c in _corpus_cases()}
    for name in EXCLUDED:
        assert groups.get(name) in GROUPS, name


@pytest.mark.parametrize("name", CASES)
def test_case(report, name):
    entry = report[name]
    if entry["pass"]:
        return
    diffs = "\n".join(entry["diffs"])
    if name in EXCLUDED:
        reason, marker = EXCLUDED[name]
        assert marker in diffs, f"{name} is excluded ({reason}) but fails otherwise:\n{diffs}"
        return
    pytest.fail(f"{name}:\n{diffs}")
