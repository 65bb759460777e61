"""SpatialBN on the CPU against its definition in float64: inference, training (the outputs and
the saved statistics) and the gradient, in both orders, over channel counts that do and do not
fill a vector (1, 3, 16, 24, 70) and tensors large enough to be cut into parts for the team."""

import numpy as np
import pytest

from ferrocaffe import core, workspace

SHAPES = [(2, 1, 5, 7), (8, 3, 20, 20), (8, 16, 32, 32), (4, 24, 9, 11), (3, 70, 12, 13)]
EPS = 1e-5


def _feed(order, shape, seed):
    rng = np.random.RandomState(seed)
    n, c, h, w = shape
    x = (rng.randn(n, c, h, w) * 3 + rng.randn(1, c, 1, 1)).astype(np.float32)
    scale = (rng.rand(c) + 0.5).astype(np.float32)
    bias = rng.randn(c).astype(np.float32)
    rm = rng.randn(c).astype(np.float32)
    rv = (rng.rand(c) + 0.5).astype(np.float32)
    xo = x.transpose(0, 2, 3, 1).copy() if order == "NHWC" else x
    for k, v in dict(x=xo, s=scale, b=bias, rm=rm, rv=rv).items():
        workspace.FeedBlob(k, v)
    return x, scale, bias, rm, rv


def _nchw(a, order):
    return a.transpose(0, 3, 1, 2) if order == "NHWC" else a


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES)
def test_inference_is_the_affine_map_of_the_running_statistics(order, shape):
    workspace.ResetWorkspace()
    x, s, b, rm, rv = _feed(order, shape, 1)
    net = core.Net("bn_test")
    net.SpatialBN(["x", "s", "b", "rm", "rv"], "y", is_test=1, order=order, epsilon=EPS)
    workspace.RunNetOnce(net)
    c = (1, -1, 1, 1)
    want = (x - rm.reshape(c)) / np.sqrt(rv.reshape(c).astype(np.float64) + EPS) * s.reshape(
        c
    ) + b.reshape(c)
    np.testing.assert_allclose(_nchw(workspace.FetchBlob("y"), order), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES)
def test_training_normalizes_by_the_batch_and_its_gradient_matches(order, shape):
    workspace.ResetWorkspace()
    x, s, b, rm, rv = _feed(order, shape, 2)
    n, c, h, w = shape
    dy = np.random.RandomState(3).randn(n, c, h, w).astype(np.float32)
    workspace.FeedBlob("dy", dy.transpose(0, 2, 3, 1).copy() if order == "NHWC" else dy)
    net = core.Net("bn_train")
    net.SpatialBN(
        ["x", "s", "b", "rm", "rv"],
        ["y", "rm", "rv", "sm", "siv"],
        is_test=0,
        order=order,
        epsilon=EPS,
        momentum=0.9,
    )
    net.SpatialBNGradient(
        ["x", "s", "dy", "sm", "siv"], ["dx", "ds", "db"], order=order, epsilon=EPS
    )
    workspace.RunNetOnce(net)

    xd = x.astype(np.float64)
    m = n * h * w
    mean = xd.mean(axis=(0, 2, 3))
    var = xd.var(axis=(0, 2, 3))
    inv = 1 / np.sqrt(var + EPS)
    c4 = (1, -1, 1, 1)
    xhat = (xd - mean.reshape(c4)) * inv.reshape(c4)
    want_y = xhat * s.reshape(c4) + b.reshape(c4)
    np.testing.assert_allclose(_nchw(workspace.FetchBlob("y"), order), want_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("sm"), mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("siv"), inv, rtol=1e-4)
    unbiased = var * m / max(m - 1, 1)
    np.testing.assert_allclose(
        workspace.FetchBlob("rm"), 0.9 * rm + 0.1 * mean, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(workspace.FetchBlob("rv"), 0.9 * rv + 0.1 * unbiased, rtol=1e-4)

    g = dy.astype(np.float64)
    dbias = g.sum(axis=(0, 2, 3))
    dscale = (g * xhat).sum(axis=(0, 2, 3))
    dx = (
        s.reshape(c4)
        * inv.reshape(c4)
        / m
        * (m * g - dbias.reshape(c4) - xhat * dscale.reshape(c4))
    )
    scale = np.abs(g).sum(axis=(0, 2, 3)).max()
    np.testing.assert_allclose(workspace.FetchBlob("db"), dbias, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(workspace.FetchBlob("ds"), dscale, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(_nchw(workspace.FetchBlob("dx"), order), dx, rtol=1e-4, atol=1e-4)


def test_sum_elements_of_a_large_tensor_is_its_sum():
    workspace.ResetWorkspace()
    rng = np.random.RandomState(4)
    x = (rng.randn(300_001) * 10 + 3).astype(np.float32)
    workspace.FeedBlob("x", x)
    net = core.Net("se")
    net.SumElements("x", "t")
    net.SumElements("x", "a", average=1)
    workspace.RunNetOnce(net)
    want = x.astype(np.float64).sum()
    assert workspace.FetchBlob("t").dtype == np.float32
    assert workspace.FetchBlob("t") == np.float32(want)
    assert workspace.FetchBlob("a") == np.float32(want / x.size)
