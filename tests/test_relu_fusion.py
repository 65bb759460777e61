"""An in-place Relu right after FC, SpatialBN or InstanceNorm is folded into that op when a
net is created (one pass over Y and one dispatch fewer). The net must leave every blob with
the bits that running its ops one at a time gives, NaN included (Relu gives 0), in training
nets with their gradient ops as well."""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

RNG = np.random.default_rng(11)


def _op_by_op_then_as_a_net(feeds, ops, blobs, net_type=""):
    """Blob values after running `ops` one at a time, and after running them as one net."""
    results = []
    for as_net in (False, True):
        workspace.ResetWorkspace()
        for k, v in feeds.items():
            workspace.FeedBlob(k, v)
        if as_net:
            net = caffe2_pb2.NetDef(name="fused", type=net_type)
            net.op.extend(ops)
            workspace.RunNetOnce(net)
        else:
            for o in ops:
                workspace.RunOperatorOnce(o)
        results.append({b: workspace.FetchBlob(b) for b in blobs})
    return results


def _assert_same(alone, fused):
    for b, v in alone.items():
        np.testing.assert_array_equal(fused[b], v, err_msg=b)


@pytest.mark.parametrize("net_type", ["", "dag"])
def test_fc_then_relu_in_place(net_type):
    x = RNG.standard_normal((8, 13)).astype(np.float32)
    x[2, 3] = np.nan  # a NaN row of Y: Relu gives 0 there
    feeds = {
        "x": x,
        "w": RNG.standard_normal((16, 13)).astype(np.float32),
        "b": RNG.standard_normal(16).astype(np.float32),
    }
    ops = [
        core.CreateOperator("FC", ["x", "w", "b"], ["y"]),
        core.CreateOperator("Relu", ["y"], ["y"]),
        core.CreateOperator("FC", ["y", "w2", "b2"], ["z"]),
        core.CreateOperator("Relu", ["z"], ["r"]),  # not in place: stays an op
    ]
    feeds["w2"] = RNG.standard_normal((5, 16)).astype(np.float32)
    feeds["b2"] = RNG.standard_normal(5).astype(np.float32)
    alone, fused = _op_by_op_then_as_a_net(feeds, ops, ["y", "z", "r"], net_type)
    _assert_same(alone, fused)
    assert (alone["y"][2] == 0).all() and (alone["y"] > 0).any()
    assert (alone["z"] < 0).any()  # z itself keeps its negative values


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("is_test", [1, 0])
def test_spatial_bn_then_relu_in_place(order, is_test):
    c = 6
    shape = (4, c, 5, 3) if order == "NCHW" else (4, 5, 3, c)
    x = RNG.standard_normal(shape).astype(np.float32)
    feeds = {
        "x": x,
        "scale": RNG.standard_normal(c).astype(np.float32),
        "bias": RNG.standard_normal(c).astype(np.float32),
        "mean": RNG.standard_normal(c).astype(np.float32),
        "var": RNG.uniform(0.5, 2.0, c).astype(np.float32),
    }
    outs = ["y"] if is_test else ["y", "mean", "var", "saved_mean", "saved_inv"]
    ops = [
        core.CreateOperator(
            "SpatialBN",
            ["x", "scale", "bias", "mean", "var"],
            outs,
            is_test=is_test,
            order=order,
            epsilon=1e-4,
        ),
        core.CreateOperator("Relu", ["y"], ["y"]),
    ]
    alone, fused = _op_by_op_then_as_a_net(feeds, ops, outs)
    _assert_same(alone, fused)
    assert (alone["y"] == 0).any() and (alone["y"] > 0).any()


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_instance_norm_then_relu_in_place(order):
    c = 5
    shape = (3, c, 4, 7) if order == "NCHW" else (3, 4, 7, c)
    feeds = {
        "x": RNG.standard_normal(shape).astype(np.float32),
        "scale": RNG.standard_normal(c).astype(np.float32),
        "bias": RNG.standard_normal(c).astype(np.float32),
    }
    ops = [
        core.CreateOperator("InstanceNorm", ["x", "scale", "bias"], ["y", "m", "s"], order=order),
        core.CreateOperator("Relu", ["y"], ["y"]),
    ]
    alone, fused = _op_by_op_then_as_a_net(feeds, ops, ["y", "m", "s"])
    _assert_same(alone, fused)
    assert (alone["y"] == 0).any() and (alone["y"] > 0).any()


def test_a_training_step_through_fc_bn_and_relu_in_place_keeps_every_gradient():
    # Forward: FC -> Relu (in place) -> SpatialBN (training) -> Relu (in place) -> loss;
    # the gradient ops read the Relu outputs, which the fused ops must leave as they were.
    net = core.Net("train")
    net.FC(["x", "w", "b"], "h")
    net.Relu("h", "h")
    net.Reshape(["h"], ["h4", "h_old"], shape=[8, 6, 2, 1])
    net.SpatialBN(
        ["h4", "scale", "bias", "rm", "rv"],
        ["bn", "rm", "rv", "sm", "si"],
        is_test=0,
        order="NCHW",
    )
    net.Relu("bn", "bn")
    net.SumElements("bn", "loss")
    grads = net.AddGradientOperators(["loss"])
    feeds = {
        "x": RNG.standard_normal((8, 10)).astype(np.float32),
        "w": RNG.standard_normal((12, 10)).astype(np.float32),
        "b": RNG.standard_normal(12).astype(np.float32),
        "scale": RNG.standard_normal(6).astype(np.float32),
        "bias": RNG.standard_normal(6).astype(np.float32),
        "rm": np.zeros(6, np.float32),
        "rv": np.ones(6, np.float32),
    }
    blobs = ["h", "bn", "loss", "rm", "rv", grads["w"], grads["b"], grads["x"], grads["scale"]]
    alone, fused = _op_by_op_then_as_a_net(feeds, list(net.Proto().op), blobs)
    _assert_same(alone, fused)
    assert (alone["h"] == 0).any() and (alone["bn"] == 0).any()
