"""The GEMM backend switch (ferrocaffe.blas): both backends (and the small-dimension kernels
on and off) give the same products, the default follows FERROCAFFE_BLAS, and bad libraries are
errors."""

import os
import subprocess
import sys

import numpy as np
import pytest

from ferrocaffe import blas, workspace
from ferrocaffe.proto import caffe2_pb2


def _run_fc(x, w, b):
    workspace.ResetWorkspace()
    for k, v in dict(x=x, w=w, b=b).items():
        workspace.FeedBlob(k, v)
    op = caffe2_pb2.OperatorDef(type="FC", input=["x", "w", "b"], output=["y"])
    workspace.RunOperatorOnce(op)
    return workspace.FetchBlob("y").copy()


def _run_matmul(a, b, trans_a, trans_b):
    workspace.ResetWorkspace()
    workspace.FeedBlob("a", a)
    workspace.FeedBlob("b", b)
    op = caffe2_pb2.OperatorDef(type="MatMul", input=["a", "b"], output=["c"])
    op.arg.add(name="trans_a", i=int(trans_a))
    op.arg.add(name="trans_b", i=int(trans_b))
    workspace.RunOperatorOnce(op)
    return workspace.FetchBlob("c").copy()


@pytest.fixture
def restore_backend():
    """Loads numpy's OpenBLAS into this process (once; it then stays loaded but switched off
    unless a test switches it on) and restores the backend afterwards."""
    before = blas.backend()
    bundled = blas._default_library()
    if bundled is not None:
        blas.load(bundled)
        blas.use_cblas(before != "gemm")
    yield bundled
    blas.use_cblas(before != "gemm")
    blas.use_small_kernels(True)
    blas.use_blocked(True)


# (257, 129, 65) and (300, 520, 190) are large enough for the blocked kernel (with a
# bias fused into it), and not multiples of its tiles.
@pytest.mark.parametrize(
    "m,k,n", [(1, 1, 1), (3, 5, 7), (64, 300, 33), (257, 129, 65), (300, 520, 190)]
)
def test_both_backends_match_numpy(m, k, n, restore_backend):
    rng = np.random.RandomState(m + k + n)
    x = rng.randn(m, k).astype(np.float32)
    w = rng.randn(n, k).astype(np.float32)
    b = rng.randn(n).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    for enabled, small, blocked in (
        (True, True, True),
        (False, True, True),
        (False, False, True),
        (False, True, False),
    ):
        blas.use_cblas(enabled)
        blas.use_small_kernels(small)
        blas.use_blocked(blocked)
        np.testing.assert_allclose(_run_fc(x, w, b), want, rtol=1e-4, atol=1e-4)
        for ta in (False, True):
            for tb in (False, True):
                a = x.T.copy() if ta else x
                bb = w if tb else w.T.copy()
                np.testing.assert_allclose(
                    _run_matmul(a, bb, ta, tb), x @ w.T, rtol=1e-4, atol=1e-4
                )


def test_fc_bias_is_added_once_whatever_the_kernel(restore_backend):
    """The blocked kernel adds FC's bias as it stores; the others accumulate into rows filled
    with it. Both must give X W^T + b, also with NaNs left in the output blob before."""
    rng = np.random.RandomState(7)
    x = rng.randn(130, 700).astype(np.float32)
    w = rng.randn(90, 700).astype(np.float32)
    b = rng.randn(90).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    blas.use_cblas(False)
    for blocked in (True, False):
        blas.use_blocked(blocked)
        workspace.ResetWorkspace()
        workspace.FeedBlob("y", np.full((130, 90), np.nan, np.float32))
        for k, v in dict(x=x, w=w, b=b).items():
            workspace.FeedBlob(k, v)
        op = caffe2_pb2.OperatorDef(type="FC", input=["x", "w", "b"], output=["y"])
        workspace.RunOperatorOnce(op)
        np.testing.assert_allclose(workspace.FetchBlob("y"), want, rtol=1e-4, atol=1e-3)


def test_switching_off_names_gemm(restore_backend):
    blas.use_cblas(False)
    assert blas.backend() == "gemm"


def test_default_backend_is_ferrocaffes_own():
    out = _import_with("")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gemm"


def test_env_numpy_selects_numpys_bundled_openblas():
    bundled = blas._default_library()
    out = _import_with("numpy")
    if bundled is None:
        assert out.returncode != 0
        assert "numpy bundles no OpenBLAS" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "cblas:" + bundled
        assert "openblas" in os.path.basename(bundled)


def _import_with(env_value):
    env = dict(os.environ, FERROCAFFE_BLAS=env_value)
    code = "import ferrocaffe.blas as b; print(b.backend())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_env_gemm_selects_the_rust_backend():
    out = _import_with("gemm")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gemm"


def test_env_bad_library_fails_import_with_a_clear_error():
    out = _import_with("/nonexistent/libcblas_missing.so")
    assert out.returncode != 0
    assert "cannot load CBLAS library /nonexistent/libcblas_missing.so" in out.stderr


def test_env_library_without_sgemm_is_rejected():
    import ferrocaffe._native as native

    out = _import_with(native.__file__)
    assert out.returncode != 0
    assert "exports no cblas_sgemm" in out.stderr


def test_a_second_different_library_is_refused(restore_backend):
    import ferrocaffe._native as native

    if restore_backend is None:
        pytest.skip("numpy bundles no OpenBLAS here: nothing is loaded to conflict with")
    with pytest.raises(ValueError, match="already loaded"):
        blas.load(native.__file__)


def _threads_with(value):
    env = {k: v for k, v in os.environ.items() if k != "FERROCAFFE_NUM_THREADS"}
    if value is not None:
        env["FERROCAFFE_NUM_THREADS"] = value
    code = (
        "import numpy as np; from ferrocaffe import blas, workspace, core\n"
        "workspace.FeedBlob('x', np.ones((256, 256), np.float32))\n"
        "workspace.RunOperatorOnce(core.CreateOperator('MatMul', ['x', 'x'], ['y']))\n"
        "assert (workspace.FetchBlob('y') == 256).all()\n"
        "print(blas.num_threads())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_the_compute_team_is_sized_to_the_machine_and_capped_by_the_environment():
    cores = len(os.sched_getaffinity(0))
    assert _threads_with(None) == cores
    assert _threads_with("1") == 1
    assert _threads_with(str(cores + 5)) == cores
    # Not a positive integer: ignored.
    assert _threads_with("0") == cores
    assert _threads_with("many") == cores
