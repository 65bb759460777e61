"""The fuzzing harness (``scripts/fuzz.py``) on a few thousand cases, and the defects it found,
each as a regression test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ferrocaffe import core, workspace

FUZZ = Path(__file__).resolve().parent.parent / "scripts" / "fuzz.py"


@pytest.fixture(autouse=True)
def _fresh():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def test_a_few_thousand_fuzz_cases_find_no_panic_abort_or_hang(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(FUZZ),
            "--cases",
            "3000",
            "--seed",
            "1",
            "--workers",
            "2",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = r.stdout.strip().splitlines()
    assert lines, r.stderr
    assert lines[-1].startswith("3000 cases, 0 panics, 0 aborts, 0 hangs"), r.stdout[-3000:]
    assert r.returncode == 0


def test_the_harness_reports_a_crash_with_its_case(tmp_path):
    # A worker that dies is recorded as an abort of the case it was running, and the run goes
    # on with the next case.
    from importlib import util

    spec = util.spec_from_file_location("fuzz", FUZZ)
    fuzz = util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)

    class Args:
        seed, memory_gb, workdir, timeout = 1, 4.0, str(tmp_path), 30.0

    w = fuzz.Worker(Args, 0, 3)
    w.proc.kill()  # as if case 0 had crashed the process
    w.proc.wait()
    while not w.poll(Args.timeout):
        pass
    assert [f[0] for f in w.failures][:1] == ["abort"]


@pytest.mark.parametrize(
    "op_type,inputs,outputs",
    [
        ("CreateAtomicBool", [], []),
        ("ChannelStats", ["x", "x", "x"], ["c"]),
        ("GivenTensorDoubleFill", ["x"], []),
        ("GivenTensorByteStringToUInt8Fill", ["x", "x"], []),
    ],
)
def test_an_op_given_fewer_blobs_than_its_kernel_reads_raises(op_type, inputs, outputs):
    # Found by the fuzzer: types without a count-checking schema panicked indexing a missing
    # output or input.
    workspace.FeedBlob("x", np.ones((2, 3, 4), np.float32))
    op = core.CreateOperator(op_type, inputs, outputs)
    with pytest.raises(RuntimeError) as e:
        workspace.RunOperatorOnce(op)
    assert "panicked" not in str(e.value)
    assert op_type in str(e.value)


def test_sparse_to_dense_with_fewer_indices_than_value_rows_raises():
    # Found by the fuzzer (seed 5, case 18816): one index for two rows of values indexed past
    # the output and panicked.
    workspace.FeedBlob("i", np.array(3, np.int8))
    workspace.FeedBlob("v", np.ones((2, 7), np.float32))
    op = core.CreateOperator("SparseToDense", ["i", "v"], ["y"])
    with pytest.raises(RuntimeError, match="indices for 2 rows") as e:
        workspace.RunOperatorOnce(op)
    assert "panicked" not in str(e.value)
