"""Kernels against the golden op corpus (``tests/golden/ops``), for every op type that has
a kernel: feed the inputs, ``RunOperatorOnce``, compare the outputs (rtol 1e-4, atol 1e-5), the
statistics of random fills, or the recorded error; then run the recorded gradient ops (every
one must have a kernel) on the recorded output gradients and compare their outputs.
(Whether the gradient *ops* are the right ones is the autodiff suite's job.)
"""

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import golden_path

from ferrocaffe import _native, workspace
from ferrocaffe.proto import caffe2_pb2

REPO = Path(__file__).resolve().parent.parent
GOLDEN = golden_path()
OPS = GOLDEN / "ops"
KERNELS = set(_native.kernel_types())


def _cases():
    with open(OPS / "cases.jsonl", encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    return [c for c in cases if c["op_type"] in KERNELS]


CASES = _cases()


@pytest.fixture(scope="module")
def arrays():
    return np.load(OPS / "arrays.npz")


def _check_stats(st, y):
    exp = st["expect"]
    assert y.dtype.name == st["dtype"] and list(y.shape) == st["shape"]
    y = y.astype(np.float64)
    if "mean" in exp:
        assert abs(y.mean() - exp["mean"]) <= exp["mean_tol"], (y.mean(), exp)
    if "std" in exp:
        assert abs(y.std() - exp["std"]) <= exp["std_tol"], (y.std(), exp)
    if "min_ge" in exp:
        assert y.min() >= exp["min_ge"]
    if "max_le" in exp:
        assert y.max() <= exp["max_le"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_forward(case, arrays):
    workspace.ResetWorkspace()
    op = caffe2_pb2.OperatorDef.FromString(base64.b64decode(case["op_b64"]))
    for m in case.get("inputs") or []:
        workspace.FeedBlob(m["name"], arrays[m["key"]])
    if "error" in case:
        net = caffe2_pb2.NetDef(name="error_net", op=[op])
        with pytest.raises(Exception) as info:
            workspace.CreateNet(net)
            workspace.RunNet(net.name)
        assert case["error"]["match"] in str(info.value)
        return
    workspace.RunOperatorOnce(op)
    if "stats" in case:
        _check_stats(case["stats"], workspace.FetchBlob(op.output[0]))
    for m in case.get("outputs") or []:
        exp = arrays[m["key"]]
        got = workspace.FetchBlob(m["name"])
        assert got.dtype == exp.dtype, (m["name"], got.dtype, exp.dtype)
        assert got.shape == exp.shape, (m["name"], got.shape, exp.shape)
        if exp.dtype.kind == "f":
            np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(got, exp)
    g = case.get("gradient")
    if not g:
        return
    grad_net = caffe2_pb2.NetDef.FromString(base64.b64decode(g["grad_ops_b64"]))
    for m in g.get("output_grads_fed") or []:
        workspace.FeedBlob(m["name"], arrays[m["key"]])
    for gop in grad_net.op:
        workspace.RunOperatorOnce(gop)
    for m in g.get("grad_op_outputs") or []:
        exp = arrays[m["key"]]
        got = workspace.FetchBlob(m["name"])
        assert got.shape == exp.shape, (m["name"], got.shape, exp.shape)
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5, err_msg=m["name"])


def test_corpus_has_kernel_cases():
    assert len(CASES) >= 60
