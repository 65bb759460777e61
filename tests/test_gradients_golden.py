"""Replays every case of the golden gradients corpus (recorded from Caffe2) through the public
API with the shared runner, ``../shared/golden/tools/run_golden.py``, and requires all of them
to pass.

Two parts of what the runner checks belong to modules other than ``core.gradients``:
``core.get_ssa`` / ``core.get_undefined_blobs`` (``core.ssa``) and the reset of
``core.Net._net_names_used`` between cases (``core.net``). While those modules do not provide
them yet, the SSA comparisons are left out and the control-flow cases (which create nets) run
one per worker process, so that every case still starts from fresh net names.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from ferrocaffe import core

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("FERROCAFFE_GOLDEN", REPO.parent / "shared" / "golden"))
RUNNER = GOLDEN / "tools" / "run_golden.py"
CORPUS = GOLDEN / "gradients"

SSA_PENDING = not hasattr(core, "get_ssa")
NET_NAMES_PENDING = not isinstance(
    getattr(getattr(core, "Net", None), "_net_names_used", None), set
)


def _replay(report, *extra):
    cmd = [sys.executable, str(RUNNER), str(CORPUS), "ferrocaffe", "-q"]
    cmd += ["--json-report", str(report), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert report.exists(), f"the runner wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr}"
    return {c["name"]: c for c in json.loads(report.read_text())["cases"]}


def _diffs(case):
    diffs = case["diffs"]
    if SSA_PENDING:
        diffs = [d for d in diffs if not d.startswith(("get_ssa", "get_undefined_blobs"))]
    return diffs


def test_every_golden_gradient_case_passes(tmp_path):
    cases = _replay(tmp_path / "all.json", "-j", "2")
    if NET_NAMES_PENDING:
        cases.update(_replay(tmp_path / "control.json", "--group", "control", "--chunk", "1"))
    assert len(cases) == sum(1 for line in CORPUS.joinpath("cases.jsonl").open() if line.strip())
    failures = {name: _diffs(c) for name, c in cases.items() if _diffs(c)}
    summary = "\n".join(f"{name}: {d[0][:300]}" for name, d in sorted(failures.items()))
    assert not failures, f"{len(failures)} of {len(cases)} golden cases fail:\n{summary}"
