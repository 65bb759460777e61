"""The CUDA kernels of the conv family (Conv, ConvGradient, MaxPool, AveragePool and their
gradients) against the same ops on the CPU."""

import numpy as np
import pytest

from ferrocaffe import _native, core, workspace
from ferrocaffe.proto import caffe2_pb2

pytestmark = pytest.mark.skipif(workspace.NumCudaDevices() == 0, reason="no CUDA device")

CUDA = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)
TOL = dict(rtol=1e-3, atol=1e-4)

# Conv and ConvGradient run on cuDNN when it is present, on their own kernels without it or
# with FERROCAFFE_CUDNN=0 (read when the op is created): every conv case runs both ways.
CUDNN = pytest.mark.parametrize("cudnn", ["1", "0"], ids=["cudnn", "nocudnn"])


@pytest.fixture
def cudnn_env(monkeypatch, cudnn):
    monkeypatch.setenv("FERROCAFFE_CUDNN", cudnn)
    return cudnn


def run(op_type, inputs, outputs, cuda, **kwargs):
    """Runs one op on fresh blobs (fed on the device when `cuda`) and fetches its outputs."""
    workspace.ResetWorkspace()
    for name, arr in inputs:
        if cuda:
            workspace.FeedBlob(name, arr, CUDA)
        else:
            workspace.FeedBlob(name, arr)
    op = core.CreateOperator(
        op_type,
        [n for n, _ in inputs],
        outputs,
        device_option=CUDA if cuda else None,
        **kwargs,
    )
    workspace.RunOperatorOnce(op)
    got = [np.array(workspace.FetchBlob(o)) for o in outputs]
    workspace.ResetWorkspace()
    return got


def compare(op_type, inputs, outputs, **kwargs):
    want = run(op_type, inputs, outputs, False, **kwargs)
    got = run(op_type, inputs, outputs, True, **kwargs)
    for name, w, g in zip(outputs, want, got, strict=True):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, err_msg=name, **TOL)
    return got


def image(rng, order, n, c, h, w, scale=1.0):
    shape = (n, c, h, w) if order == "NCHW" else (n, h, w, c)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# (id, N, C, H, W, M, (kh, kw), group, extra args)
CONV_CASES = [
    ("3x3_pad1", 2, 3, 7, 6, 4, (3, 3), 1, dict(pad=1)),
    ("stride2_pads", 2, 3, 9, 8, 5, (3, 3), 1, dict(stride=2, pads=[0, 1, 2, 1])),
    ("strides_rect", 1, 2, 8, 9, 3, (2, 3), 1, dict(strides=[2, 1], pad=1)),
    ("dilation2", 2, 3, 9, 9, 4, (3, 3), 1, dict(dilation=2, pad=2)),
    ("dilations_stride2", 1, 4, 11, 10, 2, (3, 2), 1, dict(dilations=[2, 3], stride=2)),
    ("group2", 2, 4, 7, 7, 6, (3, 3), 2, dict(pad=1)),
    ("group3_stride2", 3, 6, 8, 7, 9, (3, 3), 3, dict(stride=2, pad=1)),
    ("depthwise", 2, 4, 8, 8, 4, (3, 3), 4, dict(pad=1)),
    ("depthwise_s2_d2", 2, 5, 9, 10, 5, (3, 3), 5, dict(stride=2, dilation=2, pad=1)),
    ("channel_mult", 2, 3, 6, 6, 6, (3, 3), 3, dict(pad=1)),
    ("1x1", 2, 5, 6, 7, 4, (1, 1), 1, {}),
    ("1x1_group2", 2, 4, 5, 5, 6, (1, 1), 2, {}),
    ("1x1_stride2", 2, 3, 7, 7, 4, (1, 1), 1, dict(stride=2)),
    ("1x1_pad1", 1, 3, 4, 4, 2, (1, 1), 1, dict(pad=1)),
    ("row_1x3", 2, 3, 1, 9, 4, (1, 3), 1, dict(strides=[1, 2], pads=[0, 1, 0, 1])),
    ("batch0", 0, 3, 6, 6, 4, (3, 3), 1, dict(pad=1)),
    ("batch0_group", 0, 4, 6, 6, 4, (3, 3), 2, {}),
    # The column matrix exceeds one chunk (several launches over images).
    ("chunked", 16, 64, 64, 64, 4, (3, 3), 1, dict(pad=1)),
]


def weights(rng, order, m, cg, kh, kw, scale=1.0):
    shape = (m, cg, kh, kw) if order == "NCHW" else (m, kh, kw, cg)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def conv_params():
    for case in CONV_CASES:
        for order in ("NCHW", "NHWC"):
            for bias in (True, False):
                tag = f"{case[0]}-{order}-{'bias' if bias else 'nobias'}"
                yield pytest.param(case, order, bias, id=tag)


def out_size(size, k, s, d, p0, p1):
    return (size + p0 + p1 - (d * (k - 1) + 1)) // s + 1


def pair(extra, one, many, default):
    if many in extra:
        return list(extra[many])
    v = extra.get(one, default)
    return [v, v]


def conv_out_dims(case, order):
    _, n, _, h, w, m, (kh, kw), _, extra = case
    s = pair(extra, "stride", "strides", 1)
    d = pair(extra, "dilation", "dilations", 1)
    p = list(extra["pads"]) if "pads" in extra else [extra.get("pad", 0)] * 4
    oh = out_size(h, kh, s[0], d[0], p[0], p[2])
    ow = out_size(w, kw, s[1], d[1], p[1], p[3])
    return (n, m, oh, ow) if order == "NCHW" else (n, oh, ow, m)


def conv_inputs(case, order, bias, rng):
    _, n, c, h, w, m, (kh, kw), group, _ = case
    scale = 0.1 if case[0] == "chunked" else 1.0
    inputs = [
        ("X", image(rng, order, n, c, h, w, scale)),
        ("W", weights(rng, order, m, c // group, kh, kw, scale)),
    ]
    if bias:
        inputs.append(("b", rng.standard_normal(m).astype(np.float32)))
    return inputs


@CUDNN
@pytest.mark.parametrize("case, order, bias", list(conv_params()))
@pytest.mark.usefixtures("cudnn_env")
def test_conv(case, order, bias):
    rng = np.random.default_rng(0)
    inputs = conv_inputs(case, order, bias, rng)
    _, _, _, _, _, _, (kh, kw), group, extra = case
    (y,) = compare(
        "Conv", inputs, ["Y"], order=order, kernel_h=kh, kernel_w=kw, group=group, **extra
    )
    assert y.shape == conv_out_dims(case, order)


@CUDNN
@pytest.mark.parametrize("case, order, bias", list(conv_params()))
@pytest.mark.usefixtures("cudnn_env")
def test_conv_gradient(case, order, bias):
    rng = np.random.default_rng(1)
    inputs = conv_inputs(case, order, True, rng)[:2]
    scale = 0.1 if case[0] == "chunked" else 1.0
    dy = (rng.standard_normal(conv_out_dims(case, order)) * scale).astype(np.float32)
    inputs.append(("dY", dy))
    _, _, _, _, _, _, (kh, kw), group, extra = case
    outputs = ["dW", "db", "dX"] if bias else ["dW", "dX"]
    compare(
        "ConvGradient",
        inputs,
        outputs,
        order=order,
        kernel_h=kh,
        kernel_w=kw,
        group=group,
        no_bias=0 if bias else 1,
        **extra,
    )


@CUDNN
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.usefixtures("cudnn_env")
def test_conv_gradient_without_dx(order, bias):
    rng = np.random.default_rng(2)
    case = CONV_CASES[5]  # group2
    inputs = conv_inputs(case, order, True, rng)[:2]
    dy = rng.standard_normal(conv_out_dims(case, order)).astype(np.float32)
    inputs.append(("dY", dy))
    outputs = ["dW", "db"] if bias else ["dW"]
    compare(
        "ConvGradient",
        inputs,
        outputs,
        order=order,
        kernel=3,
        group=2,
        pad=1,
        no_bias=0 if bias else 1,
    )


@CUDNN
@pytest.mark.usefixtures("cudnn_env")
def test_conv_runs_again_with_new_shapes():
    """One op instance over two input shapes (a plan per shape) and back to the first."""
    rng = np.random.default_rng(5)
    workspace.ResetWorkspace()
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    op = core.CreateOperator("Conv", ["X", "W"], ["Y"], device_option=CUDA, kernel=3, pad=1)
    net = core.Net("conv_shapes")
    net.Proto().op.extend([op])
    xs = [rng.standard_normal(s).astype(np.float32) for s in [(2, 3, 6, 6), (1, 3, 9, 7)]]
    want = []
    for x in xs:
        want.append(run("Conv", [("X", x), ("W", w)], ["Y"], False, kernel=3, pad=1)[0])
    workspace.FeedBlob("W", w, CUDA)
    workspace.FeedBlob("X", xs[0], CUDA)
    workspace.CreateNet(net)
    for i in [0, 1, 0]:
        workspace.FeedBlob("X", xs[i], CUDA)
        workspace.RunNet(net.Proto().name)
        np.testing.assert_allclose(np.array(workspace.FetchBlob("Y")), want[i], **TOL)
    workspace.ResetWorkspace()


def test_cudnn_version():
    version = _native.cuda_cudnn_version()
    if version is None:
        pytest.skip("no cuDNN library here")
    assert version >= 8000, version


# (id, N, C, H, W, args)
POOL_CASES = [
    ("k3_s2_p1", 2, 3, 9, 8, dict(kernel=3, stride=2, pad=1)),
    ("k2_s2", 2, 4, 8, 8, dict(kernel=2, stride=2)),
    ("k3_s1", 1, 2, 6, 7, dict(kernel=3)),
    ("rect_pads", 2, 3, 7, 9, dict(kernel_h=2, kernel_w=3, strides=[2, 1], pads=[0, 1, 1, 0])),
    ("big_pad", 1, 2, 5, 5, dict(kernel=3, stride=2, pad=2)),
    ("include_pad", 2, 3, 9, 8, dict(kernel=3, stride=2, pad=1, count_include_pad=1)),
    ("empty_windows", 1, 2, 3, 3, dict(kernel=2, pad=2)),
    ("global", 2, 5, 6, 7, dict(global_pooling=1)),
    ("batch0", 0, 3, 6, 6, dict(kernel=2, stride=2)),
]


def pool_params():
    for case in POOL_CASES:
        for order in ("NCHW", "NHWC"):
            for kind in ("MaxPool", "AveragePool"):
                yield pytest.param(case, order, kind, id=f"{kind}-{case[0]}-{order}")


@pytest.mark.parametrize("case, order, kind", list(pool_params()))
def test_pool(case, order, kind):
    rng = np.random.default_rng(3)
    _, n, c, h, w, args = case
    x = image(rng, order, n, c, h, w)
    compare(kind, [("X", x)], ["Y"], order=order, **args)


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("case, order, kind", list(pool_params()))
def test_pool_gradient(case, order, kind, ties):
    rng = np.random.default_rng(4)
    _, n, c, h, w, args = case
    if ties:
        # Few distinct values: windows hold several maxima (the first gets the gradient).
        shape = (n, c, h, w) if order == "NCHW" else (n, h, w, c)
        x = rng.integers(0, 3, size=shape).astype(np.float32)
    else:
        x = image(rng, order, n, c, h, w)
    (y,) = run(kind, [("X", x)], ["Y"], False, order=order, **args)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    compare(
        kind + "Gradient",
        [("X", x), ("Y", y), ("dY", dy)],
        ["dX"],
        order=order,
        **args,
    )
