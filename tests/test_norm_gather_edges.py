"""Edge cases of SpatialBN (training mode, the multi-batch inputs, empty batches), LayerNorm
(its c10 export and the precision of its moments) and Gather (an empty DATA axis), checked
against numpy formulas of what Caffe2's CPU kernels compute."""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.model_helper import ModelHelper


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def run(op, **feeds):
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(op)
    return [workspace.FetchBlob(o) for o in op.output]


def bn_train_op(order="NCHW", num_batches=1, extra=(), epsilon=1e-3, momentum=0.8):
    return core.CreateOperator(
        "SpatialBN",
        ["X", "scale", "bias", "rm", "rv", *extra],
        ["Y", "rm", "rv", "saved_mean", "saved_rstd"],
        order=order,
        is_test=False,
        epsilon=epsilon,
        momentum=momentum,
        num_batches=num_batches,
    )


def channel_params(c, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(c).astype(np.float32) for _ in range(4)]


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_training_keeps_running_stats_on_an_empty_batch(order):
    c = 3
    scale, bias, rm, rv = channel_params(c, 0)
    rv = np.abs(rv)
    x = np.zeros((0, c, 2, 2) if order == "NCHW" else (0, 2, 2, c), np.float32)
    y, rm2, rv2, mean, rstd = run(bn_train_op(order), X=x, scale=scale, bias=bias, rm=rm, rv=rv)
    assert y.shape == x.shape
    np.testing.assert_array_equal(rm2, rm)
    np.testing.assert_array_equal(rv2, rv)
    np.testing.assert_array_equal(mean, np.zeros(c, np.float32))
    np.testing.assert_array_equal(rstd, np.zeros(c, np.float32))


def test_spatial_bn_multi_batch_on_an_empty_batch_ignores_the_sums():
    c = 2
    scale, bias, rm, rv = channel_params(c, 1)
    sums = np.array([3.0, -1.0], np.float32)
    op = bn_train_op(num_batches=3, extra=("sums", "sumsq"))
    x = np.zeros((0, c, 3, 1), np.float32)
    y, rm2, rv2, mean, rstd = run(
        op, X=x, scale=scale, bias=bias, rm=rm, rv=rv, sums=sums, sumsq=sums + 9
    )
    assert y.shape == x.shape
    np.testing.assert_array_equal(rm2, rm)
    np.testing.assert_array_equal(rv2, rv)
    np.testing.assert_array_equal(mean, np.zeros(c, np.float32))
    np.testing.assert_array_equal(rstd, np.zeros(c, np.float32))


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_multi_batch_uses_the_sums_of_every_batch(order):
    n, c, h, w, nb, eps, mom = 2, 3, 2, 3, 4, 1e-3, 0.7
    rng = np.random.default_rng(2)
    scale, bias, rm, rv = channel_params(c, 3)
    sums = (rng.random(c) - 0.5).astype(np.float32)
    sumsq = (rng.random(c) + 1.0).astype(np.float32) * (nb * n * h * w)
    shape = (n, c, h, w) if order == "NCHW" else (n, h, w, c)
    x = rng.standard_normal(shape).astype(np.float32)
    op = bn_train_op(order, nb, ("sums", "sumsq"), eps, mom)
    y, rm2, rv2, mean, rstd = run(
        op, X=x, scale=scale, bias=bias, rm=rm, rv=rv, sums=sums, sumsq=sumsq
    )
    size = nb * n * h * w
    mu = sums / size
    var = sumsq / size - mu**2
    np.testing.assert_allclose(mean, mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(var + eps), rtol=1e-5)
    np.testing.assert_allclose(rm2, mom * rm + (1 - mom) * mu, rtol=1e-5, atol=1e-6)
    unbiased = var * size / (size - 1)
    np.testing.assert_allclose(rv2, mom * rv + (1 - mom) * unbiased, rtol=1e-5, atol=1e-6)
    bshape = (1, c, 1, 1) if order == "NCHW" else (1, 1, 1, c)
    want = (x - mu.reshape(bshape)) / np.sqrt(var + eps).reshape(bshape) * scale.reshape(
        bshape
    ) + bias.reshape(bshape)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_spatial_bn_training_starts_uninitialised_running_stats_from_zeros():
    c, eps, mom = 2, 1e-5, 0.9
    x = np.random.default_rng(4).standard_normal((3, c, 2, 2)).astype(np.float32)
    scale, bias = np.ones(c, np.float32), np.zeros(c, np.float32)
    empty = np.zeros(0, np.float32)
    _, rm, rv, mean, _ = run(
        bn_train_op(epsilon=eps, momentum=mom), X=x, scale=scale, bias=bias, rm=empty, rv=empty
    )
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rm, (1 - mom) * x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, (1 - mom) * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-4, atol=1e-6)


def bn_grad_op(num_batches, order="NCHW"):
    return core.CreateOperator(
        "SpatialBNGradient",
        ["X", "scale", "dY", "mean", "rstd", "dscale_sum", "dbias_sum"],
        ["dX", "dscale", "dbias"],
        order=order,
        num_batches=num_batches,
    )


def test_spatial_bn_gradient_multi_batch_on_an_empty_batch_gives_zero_gradients():
    c = 3
    scale, mean, dscale_sum, dbias_sum = channel_params(c, 5)
    x = np.zeros((0, 2, 2, c), np.float32)
    dx, dscale, dbias = run(
        bn_grad_op(2, "NHWC"),
        X=x,
        scale=scale,
        dY=x,
        mean=mean,
        rstd=np.abs(mean),
        dscale_sum=dscale_sum,
        dbias_sum=dbias_sum,
    )
    assert dx.shape == x.shape
    np.testing.assert_array_equal(dscale, np.zeros(c, np.float32))
    np.testing.assert_array_equal(dbias, np.zeros(c, np.float32))


def test_spatial_bn_gradient_multi_batch_shares_the_summed_gradients():
    n, c, h, w, nb = 2, 3, 2, 2, 3
    rng = np.random.default_rng(6)
    scale, mean, dscale_sum, dbias_sum = channel_params(c, 7)
    rstd = (rng.random(c) + 0.5).astype(np.float32)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    dy = rng.standard_normal((n, c, h, w)).astype(np.float32)
    dx, dscale, dbias = run(
        bn_grad_op(nb),
        X=x,
        scale=scale,
        dY=dy,
        mean=mean,
        rstd=rstd,
        dscale_sum=dscale_sum,
        dbias_sum=dbias_sum,
    )
    np.testing.assert_allclose(dscale, dscale_sum / nb, rtol=1e-6)
    np.testing.assert_allclose(dbias, dbias_sum / nb, rtol=1e-6)
    r = lambda v: v.reshape(1, c, 1, 1)  # noqa: E731
    alpha = scale * rstd
    beta = -alpha * (dscale_sum / nb) * rstd / (n * h * w)
    gamma = alpha * (mean * (dscale_sum / nb) * rstd - dbias_sum / nb) / (n * h * w)
    np.testing.assert_allclose(dx, r(alpha) * dy + r(beta) * x + r(gamma), rtol=1e-4, atol=1e-5)


def test_c10_layer_norm_is_registered_and_reruns_into_its_outputs():
    assert core.IsOperator("C10LayerNorm_DontUseThisOpYet")
    x = np.random.default_rng(8).standard_normal((2, 3, 4)).astype(np.float32)
    workspace.FeedBlob("X", x)
    m = ModelHelper(name="c10_ln")
    m.net.C10LayerNorm_DontUseThisOpYet(["X"], ["Y", "mean", "std"], axis=1, epsilon=1e-4)
    workspace.RunNetOnce(m.param_init_net)
    workspace.CreateNet(m.net)
    workspace.RunNet(m.net.Proto().name)
    workspace.RunNet(m.net.Proto().name)
    flat = x.reshape(2, -1).astype(np.float64)
    std = np.sqrt(flat.var(axis=1) + 1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("mean").ravel(), flat.mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("std").ravel(), std, rtol=1e-5)
    want = (flat - flat.mean(axis=1, keepdims=True)) / std[:, None]
    np.testing.assert_allclose(workspace.FetchBlob("Y"), want.reshape(x.shape), atol=1e-5)


def test_layer_norm_moments_of_a_long_row_stay_exact():
    # 2^18 values around 100: summed in f32 the mean and the variance drift far off.
    x = (100 + np.random.default_rng(9).standard_normal((1, 1 << 18))).astype(np.float32)
    op = core.CreateOperator("LayerNorm", ["X"], ["Y", "mean", "std"], axis=1, epsilon=1e-5)
    y, mean, std = run(op, X=x)
    x64 = x.astype(np.float64)
    want_std = np.sqrt(x64.var() + 1e-5)
    np.testing.assert_allclose(mean.ravel(), [x64.mean()], rtol=1e-7)
    np.testing.assert_allclose(std.ravel(), [want_std], rtol=1e-5)
    np.testing.assert_allclose(y, (x64 - x64.mean()) / want_std, atol=2e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_gather_from_an_empty_axis_gives_the_empty_data_and_checks_no_index(dtype):
    data = np.zeros((0, 10, 20), dtype)
    ind = np.array([5, 9, 3], np.int32)
    op = core.CreateOperator("Gather", ["data", "ind"], ["out"])
    (out,) = run(op, data=data, ind=ind)
    assert out.shape == (0, 10, 20) and out.dtype == dtype
    shapes, _ = workspace.InferShapesAndTypes([_net_of(op)], {"data": [0, 10, 20], "ind": [3]})
    assert list(shapes["out"]) == [0, 10, 20]


def test_gather_with_an_empty_output_checks_no_index():
    # Empty rows: the output holds nothing, so an out-of-range index is never read.
    data = np.zeros((4, 0), np.float32)
    op = core.CreateOperator("Gather", ["data", "ind"], ["out"])
    (out,) = run(op, data=data, ind=np.array([7], np.int64))
    assert out.shape == (1, 0)
    with pytest.raises(Exception, match="out of DATA bounds"):
        run(op, data=np.zeros((4, 2), np.float32), ind=np.array([7], np.int64))


def test_batch_gather_from_an_empty_axis_and_its_gradient():
    data = np.zeros((2, 0, 3), np.float32)
    ind = np.array([1, 4], np.int32)
    (out,) = run(core.CreateOperator("BatchGather", ["data", "ind"], ["out"]), data=data, ind=ind)
    assert out.shape == (2, 0, 3)
    grad_op = core.CreateOperator("BatchGatherGradient", ["data", "ind", "out"], ["ddata"])
    (ddata,) = run(grad_op)
    assert ddata.shape == (2, 0, 3)


def test_gather_shape_inference_with_match_outer():
    op = core.CreateOperator("Gather", ["data", "ind"], ["out"], axis=1, match_outer=True)
    shapes, _ = workspace.InferShapesAndTypes([_net_of(op)], {"data": [2, 5, 3], "ind": [2, 4]})
    assert list(shapes["out"]) == [2, 4, 3]


def _net_of(op):
    net = core.Net("one_op")
    net.Proto().op.extend([op])
    return net


def test_layer_norm_gradient_of_a_long_row_cancels_exactly():
    # dY = Y: the row sums of the gradient cancel to a tiny dX, which f32 sums would swamp.
    x = np.random.default_rng(10).standard_normal((1, 1 << 18)).astype(np.float32)
    x64, eps = x.astype(np.float64), 1e-4
    mean = x64.mean(axis=1, keepdims=True).astype(np.float32)
    std = np.sqrt(x64.var(axis=1, keepdims=True) + eps).astype(np.float32)
    y = ((x64 - mean) / std).astype(np.float32)
    op = core.CreateOperator(
        "LayerNormGradient", ["dY", "Y", "mean", "std", "X"], ["dX"], axis=1, epsilon=eps
    )
    (dx,) = run(op, dY=y, Y=y, mean=mean, std=std, X=x)
    mu, sd, g = mean.astype(np.float64), std.astype(np.float64), y.astype(np.float64)
    xhat = (x64 - mu) / sd
    want = (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True)) / sd
    # dX is about 5e-4 here; summed in f32 it was off by about 3e-4.
    np.testing.assert_allclose(dx, want, rtol=1e-3, atol=2e-5)
