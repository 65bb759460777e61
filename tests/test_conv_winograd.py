"""Conv's Winograd path (3x3, stride 1, no dilation, one group; F(2x2,3x3) and F(4x4,3x3))
against a float64 direct reference: odd sizes, padding on every side, several channel counts and
batch sizes, both orders, with and without bias, and the fused Relu.

``FERROCAFFE_WINOGRAD`` is read when the op is created: ``2`` / ``4`` force a tile size on
every shape that qualifies, ``0`` turns the path off, unset takes the measured rules."""

import itertools
import zlib

import numpy as np
import pytest
from test_conv_cpu import ref_conv

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

VAR = "FERROCAFFE_WINOGRAD"

CASES = [
    # (n, c, h, w, k, pad (t, l, b, r))
    (1, 1, 5, 5, 1, (1, 1, 1, 1)),
    (2, 3, 9, 7, 5, (1, 1, 1, 1)),
    (3, 8, 11, 13, 9, (0, 0, 0, 0)),
    (1, 9, 6, 10, 17, (2, 0, 1, 3)),
    (5, 17, 7, 9, 8, (0, 2, 3, 1)),
    (2, 33, 15, 14, 19, (1, 1, 1, 1)),
    (1, 16, 3, 3, 16, (1, 1, 1, 1)),
    (2, 4, 1, 2, 3, (1, 1, 1, 1)),  # the whole image inside one padded tile
    (8, 16, 12, 12, 24, (1, 1, 1, 1)),  # enough tiles for several blocks per thread
    (1, 64, 20, 21, 32, (1, 2, 1, 0)),
]


def _feed(case, order, rng):
    n, c, h, w, k, _ = case
    x = rng.randn(n, c, h, w).astype(np.float32)
    wt = rng.randn(k, c, 3, 3).astype(np.float32)
    b = rng.randn(k).astype(np.float32)
    to = (lambda a: a.transpose(0, 2, 3, 1).copy()) if order == "NHWC" else (lambda a: a)
    workspace.ResetWorkspace()
    workspace.FeedBlob("x", to(x))
    workspace.FeedBlob("w", to(wt))
    workspace.FeedBlob("b", b)
    return x, wt, b


def _conv(case, order, with_bias, **extra):
    pad = case[5]
    ins = ["x", "w", "b"] if with_bias else ["x", "w"]
    op = core.CreateOperator(
        "Conv",
        ins,
        ["y"],
        kernel=3,
        pad_t=pad[0],
        pad_l=pad[1],
        pad_b=pad[2],
        pad_r=pad[3],
        order=order,
        **extra,
    )
    workspace.RunOperatorOnce(op)
    y = workspace.FetchBlob("y")
    return y.transpose(0, 3, 1, 2) if order == "NHWC" else y


@pytest.mark.parametrize(
    "case,order,with_bias,tile",
    list(itertools.product(CASES, ["NCHW", "NHWC"], [True, False], ["2", "4"])),
    ids=lambda v: str(v).replace(" ", ""),
)
def test_winograd_matches_a_float64_direct_convolution(monkeypatch, case, order, with_bias, tile):
    monkeypatch.setenv(VAR, tile)
    rng = np.random.RandomState(zlib.crc32(repr((case, order, with_bias, tile)).encode()))
    x, wt, b = _feed(case, order, rng)
    bias = b.astype(np.float64) if with_bias else np.zeros(case[4])
    want = ref_conv(x.astype(np.float64), wt.astype(np.float64), bias, (1, 1), case[5], (1, 1), 1)
    got = _conv(case, order, with_bias)
    assert got.shape == want.shape
    # Unit-scale data: sums of 9*C products have a spread of 3*sqrt(C). Errors measured, in
    # units of that spread: im2col 3e-6, F2 1e-6, F4 2e-5 (its transforms lose a few bits more).
    # A wrong tap, tile edge or padding is off by ~1.
    scale = 3.0 * np.sqrt(case[1])
    tol = (1e-5 if tile == "2" else 6e-5) * scale
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("setting", ["0", "2", "4", None])
def test_every_setting_gives_the_same_convolution(monkeypatch, order, setting):
    """Off, either tile size, or the default rules: the same result up to rounding, on a shape
    the rules may take (64 channels) and on ones that do not qualify (stride 2, groups)."""
    if setting is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, setting)
    rng = np.random.RandomState(7)
    case = (2, 64, 14, 14, 64, (1, 1, 1, 1))
    x, wt, b = _feed(case, order, rng)
    want = ref_conv(x.astype(np.float64), wt.astype(np.float64), b, (1, 1), case[5], (1, 1), 1)
    np.testing.assert_allclose(_conv(case, order, True), want, rtol=0, atol=2e-3)
    # Stride 2 and two groups run im2col + GEMM whatever the setting.
    want = ref_conv(x.astype(np.float64), wt.astype(np.float64), b, (2, 2), case[5], (1, 1), 1)
    np.testing.assert_allclose(_conv(case, order, True, stride=2), want, rtol=0, atol=2e-3)
    wt2 = wt[:, :32]
    workspace.FeedBlob("w", wt2.transpose(0, 2, 3, 1).copy() if order == "NHWC" else wt2)
    want = ref_conv(x.astype(np.float64), wt2.astype(np.float64), b, (1, 1), case[5], (1, 1), 2)
    np.testing.assert_allclose(_conv(case, order, True, group=2), want, rtol=0, atol=2e-3)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("tile", ["2", "4"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_a_fused_relu_on_the_winograd_path_gives_what_the_two_ops_give(
    monkeypatch, order, tile, with_bias
):
    monkeypatch.setenv(VAR, tile)
    rng = np.random.RandomState(11)
    case = (3, 16, 9, 10, 16, (1, 1, 1, 1))
    _feed(case, order, rng)
    ins = ["x", "w", "b"] if with_bias else ["x", "w"]
    ops = [
        core.CreateOperator("Conv", ins, ["y"], kernel=3, pad=1, order=order),
        core.CreateOperator("Relu", ["y"], ["y"]),
    ]
    for o in ops:
        workspace.RunOperatorOnce(o)
    want = workspace.FetchBlob("y")
    assert (want == 0).any() and (want > 0).any()
    workspace.FeedBlob("y", np.zeros(1, np.float32))
    net = caffe2_pb2.NetDef(name="fused")
    net.op.extend(ops)
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), want)


@pytest.mark.parametrize("tile", ["2", "4"])
def test_the_kept_filter_transform_follows_every_change_of_the_filters(monkeypatch, tile):
    """A net keeps the transformed filters between runs: a new filter blob, and filters
    written in place by an op of the same net, must both be seen by the next run."""
    monkeypatch.setenv(VAR, tile)
    rng = np.random.RandomState(5)
    case = (2, 16, 8, 8, 16, (1, 1, 1, 1))
    x, wt, b = _feed(case, "NCHW", rng)
    net = caffe2_pb2.NetDef(name="keep")
    net.op.extend(
        [
            core.CreateOperator("Conv", ["x", "w", "b"], ["y"], kernel=3, pad=1),
            core.CreateOperator("Scale", ["w"], ["w"], scale=-2.0),
        ]
    )
    workspace.CreateNet(net)

    def check(w):
        want = ref_conv(x.astype(np.float64), w, b.astype(np.float64), (1, 1), case[5], (1, 1), 1)
        np.testing.assert_allclose(workspace.FetchBlob("y"), want, rtol=0, atol=1e-3)

    w = wt.astype(np.float64)
    workspace.RunNet("keep")
    check(w)
    workspace.RunNet("keep")  # the filters the first run scaled in place
    check(-2.0 * w)
    w2 = rng.randn(*wt.shape).astype(np.float32)
    workspace.FeedBlob("w", w2)
    workspace.RunNet("keep")
    check(w2.astype(np.float64))
    workspace.RunNet("keep")
    check(-2.0 * w2.astype(np.float64))
