"""CPU Conv / ConvGradient against a float64 numpy reference, on the paths the kernel takes:
im2col + GEMM, 1x1 without im2col (both layouts), groups, depthwise (both layouts), strides,
padding, dilation, and batches that are shared out to the compute threads a few images at a
time (and single images, whose products are shared out instead)."""

import itertools

import numpy as np
import pytest

from ferrocaffe import core, workspace


def ref_conv(x, w, b, stride, pad, dil, group):
    """NCHW x [N, C, H, W], w [M, C/G, kh, kw]: y [N, M, oh, ow] in float64."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    pt, pl, pb, pr = pad
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt : pt + h, pl : pl + wd] = x
    oh = (h + pt + pb - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + pl + pr - (dil[1] * (kw - 1) + 1)) // stride[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for gi in range(group):
        xs = xp[:, gi * cg : (gi + 1) * cg]
        for ki in range(kh):
            for kj in range(kw):
                patch = xs[
                    :,
                    :,
                    ki * dil[0] : ki * dil[0] + stride[0] * (oh - 1) + 1 : stride[0],
                    kj * dil[1] : kj * dil[1] + stride[1] * (ow - 1) + 1 : stride[1],
                ]
                y[:, gi * mg : (gi + 1) * mg] += np.einsum(
                    "ncij,mc->nmij", patch, w[gi * mg : (gi + 1) * mg, :, ki, kj]
                )
    return y + b.reshape(1, -1, 1, 1)


CASES = [
    # (n, c, h, w, m, kh, kw, stride, pad, dil, group)
    (5, 3, 9, 8, 4, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 3, 9, 8, 4, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (4, 6, 7, 7, 6, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (3, 4, 6, 5, 6, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 2),
    (3, 4, 11, 9, 4, 2, 3, (2, 3), (1, 0, 2, 1), (1, 1), 2),
    (2, 4, 10, 10, 2, 3, 3, (1, 2), (2, 1, 0, 2), (2, 2), 1),
    (6, 8, 9, 9, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8),  # depthwise
    (2, 5, 9, 8, 5, 3, 2, (2, 1), (1, 0, 1, 1), (1, 2), 5),  # depthwise, odd geometry
    (3, 2, 6, 6, 3, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 1),
    # One input channel (NHWC runs it NCHW-wise, then transposes).
    (4, 1, 12, 11, 6, 5, 3, (1, 2), (1, 0, 2, 1), (1, 1), 1),
    (3, 1, 13, 13, 20, 3, 3, (2, 1), (0, 1, 1, 0), (2, 1), 1),
    # Enough work per image that batches are shared out to the compute threads.
    (5, 16, 16, 16, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (3, 16, 16, 16, 32, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (3, 32, 16, 16, 32, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 32),
    # Fewer images than threads with work to share: NHWC cuts each image into slices of
    # output rows (the last one shorter here), one part each.
    (1, 16, 15, 16, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 8, 17, 13, 24, 3, 2, (2, 1), (1, 0, 2, 1), (1, 2), 1),
    (1, 16, 16, 16, 32, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
]


def _run(case, order, with_bias):
    n, c, h, w, m, kh, kw, stride, pad, dil, group = case
    rng = np.random.RandomState(hash((case, order)) % 2**31)
    x = rng.randn(n, c, h, w).astype(np.float32)
    wt = rng.randn(m, c // group, kh, kw).astype(np.float32)
    b = rng.randn(m).astype(np.float32) if with_bias else np.zeros(m, np.float32)
    y_ref = ref_conv(x.astype(np.float64), wt.astype(np.float64), b, stride, pad, dil, group)
    dy = rng.randn(*y_ref.shape).astype(np.float32)
    to = (lambda a: a.transpose(0, 2, 3, 1).copy()) if order == "NHWC" else (lambda a: a)
    back = (lambda a: a.transpose(0, 3, 1, 2)) if order == "NHWC" else (lambda a: a)
    workspace.ResetWorkspace()
    workspace.FeedBlob("x", to(x))
    workspace.FeedBlob("w", to(wt))
    workspace.FeedBlob("b", b)
    workspace.FeedBlob("dy", to(dy))
    args = dict(
        stride_h=stride[0],
        stride_w=stride[1],
        pad_t=pad[0],
        pad_l=pad[1],
        pad_b=pad[2],
        pad_r=pad[3],
        dilation_h=dil[0],
        dilation_w=dil[1],
        group=group,
        order=order,
    )
    ins = ["x", "w", "b"] if with_bias else ["x", "w"]
    workspace.RunOperatorOnce(core.CreateOperator("Conv", ins, ["y"], **args))
    y = back(workspace.FetchBlob("y"))
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)

    outs = ["dw", "db", "dx"] if with_bias else ["dw", "dx"]
    grad_args = dict(args, no_bias=0 if with_bias else 1)
    workspace.RunOperatorOnce(
        core.CreateOperator("ConvGradient", ["x", "w", "dy"], outs, **grad_args)
    )
    # dX and dW by linearity: dX = d<y, dy>/dx, dW = d<y, dy>/dw, from the reference with
    # one-hot probes would be slow; use the adjoint identities instead.
    dx = back(workspace.FetchBlob("dx")).astype(np.float64)
    dw = back(workspace.FetchBlob("dw")).astype(np.float64)
    # <conv(x', w), dy> == <x', dX> for any x' (bias zero).
    probe = rng.randn(*x.shape)
    zero = np.zeros(m)
    lhs = (ref_conv(probe, wt.astype(np.float64), zero, stride, pad, dil, group) * dy).sum()
    np.testing.assert_allclose((probe * dx).sum(), lhs, rtol=1e-4, atol=1e-3)
    probe_w = rng.randn(*wt.shape)
    lhs_w = (ref_conv(x.astype(np.float64), probe_w, zero, stride, pad, dil, group) * dy).sum()
    np.testing.assert_allclose((probe_w * dw).sum(), lhs_w, rtol=1e-4, atol=1e-3)
    if with_bias:
        np.testing.assert_allclose(
            workspace.FetchBlob("db"),
            dy.astype(np.float64).sum(axis=(0, 2, 3)),
            rtol=1e-4,
            atol=1e-4,
        )


@pytest.mark.parametrize(
    "case,order,with_bias",
    list(itertools.product(CASES, ["NCHW", "NHWC"], [True, False])),
    ids=lambda v: str(v).replace(" ", ""),
)
def test_conv_matches_the_reference(monkeypatch, case, order, with_bias):
    # The im2col paths (tests/test_conv_winograd.py covers the Winograd one, whose error is
    # larger than these tolerances allow for 16 channels).
    monkeypatch.setenv("FERROCAFFE_WINOGRAD", "0")
    _run(case, order, with_bias)


def test_conv_gradient_without_dx_and_on_an_empty_batch():
    rng = np.random.RandomState(0)
    workspace.ResetWorkspace()
    workspace.FeedBlob("x", rng.randn(0, 2, 5, 5).astype(np.float32))
    workspace.FeedBlob("w", rng.randn(3, 2, 3, 3).astype(np.float32))
    workspace.FeedBlob("dy", np.zeros((0, 3, 3, 3), np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("ConvGradient", ["x", "w", "dy"], ["dw", "db"]))
    assert not workspace.FetchBlob("dw").any() and workspace.FetchBlob("dw").shape == (3, 2, 3, 3)
    assert not workspace.FetchBlob("db").any()


@pytest.mark.parametrize("net_type", ["simple", "dag"])
@pytest.mark.parametrize("group", [1, 4])
def test_an_inplace_relu_after_a_conv_gives_what_the_two_ops_give(net_type, group):
    """The net folds the Relu into the convolution; the blobs must be those of running the
    ops one by one (negative outputs included, so a Relu left out would show)."""
    from ferrocaffe.proto import caffe2_pb2

    rng = np.random.RandomState(3)
    feeds = {
        "x": rng.randn(3, 4, 8, 8).astype(np.float32),
        "w": rng.randn(4, 4 // group, 3, 3).astype(np.float32),
        "b": rng.randn(4).astype(np.float32),
    }
    ops = [
        core.CreateOperator("Conv", ["x", "w", "b"], ["y"], kernel=3, pad=1, group=group),
        core.CreateOperator("Relu", ["y"], ["y"]),
        core.CreateOperator("Relu", ["y"], ["z"]),  # not in place: runs as an op
        core.CreateOperator("Conv", ["z", "w"], ["u"], kernel=3, group=group),
        core.CreateOperator("Relu", ["u"], ["u"]),
    ]
    workspace.ResetWorkspace()
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    for o in ops:
        workspace.RunOperatorOnce(o)
    want = {b: workspace.FetchBlob(b) for b in ("y", "z", "u")}
    assert (want["u"] == 0).any() and (want["u"] > 0).any()
    workspace.ResetWorkspace()
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    net = caffe2_pb2.NetDef(name="fused", type=net_type)
    net.op.extend(ops)
    workspace.RunNetOnce(net)
    for b, v in want.items():
        np.testing.assert_array_equal(workspace.FetchBlob(b), v, err_msg=b)


@pytest.mark.parametrize("kernel,fuse", [(3, True), (3, False), (1, False)])
def test_an_image_cut_into_row_slices_gets_the_bits_of_a_whole_image(monkeypatch, kernel, fuse):
    # One NHWC image (fewer images than threads: cut into slices of output rows on a machine
    # with two or more cores) against the same image in a batch of as many images as threads
    # (a part per image): every pixel must get the same value, with a fused Relu as well.
    import os

    from ferrocaffe.proto import caffe2_pb2

    threads = min(int(os.environ.get("FERROCAFFE_NUM_THREADS", os.cpu_count())), os.cpu_count())
    rng = np.random.RandomState(5)
    x = rng.randn(1, 19, 17, 16).astype(np.float32)
    w = rng.randn(24, kernel, kernel, 16).astype(np.float32)
    b = rng.randn(24).astype(np.float32)
    ops = [core.CreateOperator("Conv", ["x", "w", "b"], ["y"], kernel=kernel, order="NHWC")]
    if fuse:
        ops.append(core.CreateOperator("Relu", ["y"], ["y"]))
    outs = []
    # The single image cut into slices, then as one part (FERROCAFFE_CONV_SLICES=0), then in
    # a batch of a part per image.
    for slices, batch in (("1", x), ("0", x), ("1", np.concatenate([x] * max(threads, 2)))):
        monkeypatch.setenv("FERROCAFFE_CONV_SLICES", slices)
        workspace.ResetWorkspace()
        for k, v in (("x", batch), ("w", w), ("b", b)):
            workspace.FeedBlob(k, v)
        net = caffe2_pb2.NetDef(name="slices")
        net.op.extend(ops)
        workspace.RunNetOnce(net)
        outs.append(workspace.FetchBlob("y"))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][0], outs[2][0])
    np.testing.assert_array_equal(outs[2][-1], outs[2][0])
