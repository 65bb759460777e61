"""``torch.ops._caffe2.LayerNorm``: the op Caffe2 exported to PyTorch, registered by
``ferrocaffe.torch_ops`` (here after ``import torch``, the order Caffe2's tests use), eager and
under TorchScript, against numpy. Needs torch (an optional dependency)."""

import numpy as np
import pytest

from ferrocaffe import workspace  # noqa: F401  (installs the registration hook)

torch = pytest.importorskip("torch")


def layer_norm_ref(x, axis, eps, gamma=None, beta=None):
    left = int(np.prod(x.shape[:axis]))
    flat = x.reshape(left, -1).astype(np.float64)
    mean = flat.mean(axis=1, keepdims=True)
    std = np.sqrt(flat.var(axis=1, keepdims=True) + eps)
    y = ((flat - mean) / std).reshape(x.shape)
    if gamma is not None:
        y = y * gamma + beta
    shape = x.shape[:axis] + (1,)
    return y, mean.reshape(shape), std.reshape(shape)


@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_eager(affine):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    axis, eps = 1, 1e-4
    if affine:
        gamma = rng.standard_normal((3, 4)).astype(np.float32)
        beta = rng.standard_normal((3, 4)).astype(np.float32)
        got = torch.ops._caffe2.LayerNorm(
            torch.tensor(x), torch.tensor(gamma), torch.tensor(beta), axis, eps, True
        )
        want = layer_norm_ref(x, axis, eps, gamma, beta)
    else:
        got = torch.ops._caffe2.LayerNorm(torch.tensor(x), None, None, axis, eps)
        want = layer_norm_ref(x, axis, eps)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32 and tuple(g.shape) == w.shape
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-5)


def test_layer_norm_scripted():
    @torch.jit.script
    def scripted(x: torch.Tensor, axis: int, eps: float):
        return torch.ops._caffe2.LayerNorm(x, None, None, axis, eps, False)

    x = np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)
    y, mean, std = scripted(torch.tensor(x), 1, 1e-5)
    want = layer_norm_ref(x, 1, 1e-5)
    np.testing.assert_allclose(y.numpy(), want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean.numpy(), want[1], rtol=1e-5)
