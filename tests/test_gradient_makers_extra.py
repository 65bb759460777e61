"""Gradient makers for ops beyond the golden corpus: the gradient op each emits (type, inputs,
outputs), as Caffe2's makers define them."""

import pytest

from ferrocaffe import core


def grad_of(op_type, inputs, outputs, **args):
    op = core.CreateOperator(op_type, inputs, outputs, **args)
    g_output = [o + "_grad" for o in outputs]
    ops, g_input = core.GradientRegistry.GetGradientForOp(op, g_output)
    return ops, g_input


@pytest.mark.parametrize("t", ["Sin", "Cos", "Tan", "Acos", "Asin", "Atan"])
def test_trig_gradients_read_x_and_dy(t):
    ops, g = grad_of(t, ["x"], ["y"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        (t + "Gradient", ["x", "y_grad"], ["x_grad"])
    ]
    assert g == ["x_grad"]


@pytest.mark.parametrize(
    "t,ins",
    [("Cbrt", ["y_grad", "y"]), ("Rsqrt", ["y_grad", "y"]), ("Reciprocal", ["y", "y_grad"])],
)
def test_output_based_unary_gradients(t, ins):
    ops, _ = grad_of(t, ["x"], ["y"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        (t + "Gradient", ins, ["x_grad"])
    ]


def test_reduce_min_reads_dy_x_y():
    ops, _ = grad_of("ReduceMin", ["x"], ["y"], axes=[1], keepdims=0)
    (op,) = ops
    assert (op.type, list(op.input), list(op.output)) == (
        "ReduceMinGradient",
        ["y_grad", "x", "y"],
        ["x_grad"],
    )
    assert {a.name for a in op.arg} == {"axes", "keepdims"}


@pytest.mark.parametrize("t", ["MaxPool2D", "AveragePool2D"])
def test_2d_pool_gradients(t):
    ops, _ = grad_of(t, ["x"], ["y"], kernel=2)
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        (t + "Gradient", ["x", "y", "y_grad"], ["x_grad"])
    ]


def test_conv2d_gradient_like_conv():
    ops, g = grad_of("Conv2D", ["x", "w", "b"], ["y"], kernel=3)
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("Conv2DGradient", ["x", "w", "y_grad"], ["w_grad", "b_grad", "x_grad"])
    ]
    assert g == ["x_grad", "w_grad", "b_grad"]


def test_lengths_mean_and_weighted_sum():
    ops, _ = grad_of("LengthsMean", ["data", "lengths"], ["y"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("LengthsIndicesInGradientMeanGradient", ["y_grad", "lengths", "data"], ["data_grad"])
    ]
    ops, g = grad_of("LengthsWeightedSum", ["data", "w", "lengths"], ["y"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        (
            "LengthsIndicesInGradientWeightedSumGradient",
            ["w", "y_grad", "lengths", "data"],
            ["data_grad"],
        )
    ]
    assert g == ["data_grad", None, None]


def test_group_norm_moments_pad_image():
    ops, _ = grad_of("GroupNorm", ["x", "gamma", "beta"], ["y", "mu", "rsig"], group=2)
    (op,) = [o for o in ops]
    assert (op.type, list(op.input), list(op.output)) == (
        "GroupNormGradient",
        ["y_grad", "x", "gamma", "beta", "mu", "rsig"],
        ["x_grad", "gamma_grad", "beta_grad"],
    )
    ops, _ = grad_of("Moments", ["x"], ["mean", "var"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("MomentsGradient", ["mean_grad", "var_grad", "x", "mean"], ["x_grad"])
    ]
    ops, _ = grad_of("PadImage", ["x"], ["y"], pad=1)
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("PadImageGradient", ["y_grad"], ["x_grad"])
    ]
    assert [a.name for a in ops[0].arg] == ["pad"]
