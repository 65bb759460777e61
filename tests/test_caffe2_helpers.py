"""Caffe2's test helpers as ferrocaffe provides them: ``hypothesis_test_util``,
``serialized_test.serialized_test_util``, ``device_checker``, ``hip_test_util``,
``mkl_test_util``, ``rnn.rnn_cell_test_util`` and ``_import_c_extension``. Needs neither a GPU
nor Caffe2's fetched test suite."""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import hypothesis
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrocaffe import core, device_checker, gradient_checker, hip_test_util, workspace
from ferrocaffe.proto import caffe2_pb2

# Importing hypothesis_test_util loads Caffe2's Hypothesis profile for the whole process, as
# Caffe2 did; give the rest of this test session its profile back.
_PREVIOUS_PROFILE = hypothesis.settings.default
from ferrocaffe import hypothesis_test_util as hu  # noqa: E402
from ferrocaffe import mkl_test_util  # noqa: E402
from ferrocaffe.rnn import rnn_cell_test_util  # noqa: E402
from ferrocaffe.serialized_test import serialized_test_util as serial  # noqa: E402

hypothesis.settings.register_profile("ferrocaffe-before-caffe2-helpers", _PREVIOUS_PROFILE)
hypothesis.settings.load_profile("ferrocaffe-before-caffe2-helpers")

FEW = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _case(cls=hu.HypothesisTestCase):
    return cls()  # unittest's default method name: the asserts can be called directly


def _py(code, env=None):
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- settings


def test_profiles_as_caffe2_registered_them():
    code = """
        import json, hypothesis
        import ferrocaffe.hypothesis_test_util as hu
        out = {}
        for name in ("sandcastle", "dev", "debug"):
            s = hypothesis.settings.get_profile(name)
            out[name] = [s.max_examples, s.deadline.total_seconds() * 1000, s.database is None,
                         s.derandomize, hypothesis.HealthCheck.too_slow in s.suppress_health_check]
        out["loaded"] = hypothesis.settings.default.max_examples
        print(json.dumps(out))
    """
    got = _py(code, {"CAFFE2_HYPOTHESIS_PROFILE": "debug", "SANDCASTLE": "0"})
    # Under CI, hypothesis's own "ci" profile is the parent of new ones; the result is the same.
    assert _py(code, {"CAFFE2_HYPOTHESIS_PROFILE": "debug", "SANDCASTLE": "0", "CI": "true"}) == got
    assert got["sandcastle"] == [50, 10000, True, True, True]
    assert got["dev"] == [10, 10000, True, False, True]
    assert got["debug"] == [1000, 50000, True, False, True]
    assert got["loaded"] == 1000
    assert _py(code, {"SANDCASTLE": "1"})["loaded"] == 50
    assert _py(code, {"SANDCASTLE": "0", "CAFFE2_HYPOTHESIS_PROFILE": "dev"})["loaded"] == 10


def test_settings_accepts_old_hypothesis_options():
    s = hu.settings(min_satisfying_examples=3, timeout=2, max_examples=4)
    assert s.max_examples == 4
    assert s.deadline.total_seconds() == 2.0
    # an explicit deadline wins over timeout
    assert hu.settings(timeout=2, deadline=500).deadline.total_seconds() == 0.5


def test_sandcastle_and_travis(monkeypatch):
    monkeypatch.delenv("SANDCASTLE", raising=False)
    monkeypatch.delenv("TW_JOB_USER", raising=False)
    monkeypatch.delenv("TRAVIS", raising=False)
    assert not hu.is_sandcastle() and not hu.is_travis()
    monkeypatch.setenv("TW_JOB_USER", "sandcastle")
    monkeypatch.setenv("TRAVIS", "")
    assert hu.is_sandcastle() and hu.is_travis()


def test_to_float32_rounds():
    assert hu.to_float32(0.1) == float(np.float32(0.1))
    assert hu.to_float32(0.1) != 0.1


# ---------------------------------------------------------------------------- strategies


@FEW
@given(x=hu.tensor(min_dim=2, max_dim=3, min_value=2, max_value=4))
def test_tensor_rank_dims_and_elements(x):
    assert x.dtype == np.float32
    assert 2 <= x.ndim <= 3 and all(2 <= d <= 4 for d in x.shape)
    assert np.all(np.abs(x) <= 1.0)


@FEW
@given(xs=hu.tensors(n=3, min_dim=1, max_dim=2, dtype=np.int32))
def test_tensors_share_one_shape(xs):
    assert len(xs) == 3
    assert len({x.shape for x in xs}) == 1
    assert all(x.dtype == np.int32 and np.all(x >= 0) for x in xs)


@FEW
@given(xs=hu.tensors1d(n=2, min_len=3, max_len=5), x=hu.tensor1d(min_len=2, max_len=2))
def test_1d_strategies(xs, x):
    assert all(v.ndim == 1 and 3 <= v.size <= 5 for v in xs)
    assert x.shape == (2,)


@FEW
@given(b=hu.arrays([4], dtype=bool), d=hu.arrays([3], dtype=np.float64), u=hu.tensor(unique=True))
def test_elements_of_type_per_dtype(b, d, u):
    assert b.dtype == np.bool_ and d.dtype == np.float64
    assert len(np.unique(u)) == u.size


def test_elements_of_type_rejects_unknown_dtypes():
    with pytest.raises(ValueError, match="Unexpected dtype"):
        hu.elements_of_type(np.uint16)


@FEW
@given(x=hu.arrays([20], elements=hu.elements_of_type(np.float32, filter_=lambda v: v > 0)))
def test_elements_of_type_filter(x):
    assert np.all(x > 0)


@FEW
@given(ids=st.integers(0, 12).flatmap(lambda n: hu.segment_ids(n, is_sorted=True)))
def test_sorted_segment_ids_start_at_zero_and_step_by_one(ids):
    assert ids.dtype == np.int32
    if ids.size:
        assert ids[0] == 0
        assert set(np.diff(ids).tolist()) <= {0, 1}


@FEW
@given(ids=hu.segment_ids(7, is_sorted=False))
def test_unsorted_segment_ids_range(ids):
    assert ids.shape == (7,) and np.all((ids >= 0) & (ids <= 14))


@FEW
@given(data=st.data(), size=st.integers(1, 10))
def test_lengths_add_up(data, size):
    lo = data.draw(st.integers(0, size))
    hi = data.draw(st.integers(max(lo, 1), size))
    lens = data.draw(hu.lengths(size, min_segments=lo, max_segments=hi))
    assert lens.dtype == np.int32
    assert lens.sum() == size and np.all(lens >= 0)
    assert max(lo, 1) <= lens.size <= hi


@FEW
@given(lens=hu.lengths(0, max_segments=0))
def test_lengths_of_nothing(lens):
    assert lens.shape == (0,) and lens.dtype == np.int32
    with pytest.raises(AssertionError):
        hu.lengths(3, max_segments=0)


@FEW
@given(pair=hu.lengths_tensor(min_segments=2, max_segments=3, min_dim=2, max_dim=2))
def test_lengths_tensor(pair):
    data, lens = pair
    assert data.ndim == 2 and lens.sum() == data.shape[0] and 2 <= lens.size <= 3


@FEW
@given(pair=hu.segmented_tensor(allow_empty=True, dtype=np.float64))
def test_segmented_tensor(pair):
    data, ids = pair
    assert data.dtype == np.float64 and ids.shape == (data.shape[0],)


@FEW
@given(triple=hu.sparse_segmented_tensor(itype=np.int32, min_dim=1, max_dim=2))
def test_sparse_segmented_tensor(triple):
    data, indices, ids = triple
    assert indices.dtype == np.int32 and 1 <= indices.size <= data.shape[0]
    assert np.all((indices >= 0) & (indices < data.shape[0]))
    assert ids.shape == indices.shape


@FEW
@given(triple=hu.sparse_lengths_tensor(allow_empty=True))
def test_sparse_lengths_tensor(triple):
    data, indices, lens = triple
    assert indices.dtype == np.int64
    assert lens.sum() == indices.size


@FEW
@given(f=hu.floats(min_value=0.1, max_value=0.7))
def test_floats_are_float32(f):
    assert np.float32(f) == f and 0.1 <= f <= 0.7 + 1e-7


# ---------------------------------------------------------------------------- devices


@FEW
@given(gpu_dc=hu.gcs_gpu_only["dc"], cpu=st.fixed_dictionaries(hu.gcs_cpu_only), **hu.gcs)
def test_device_lists_follow_gpu_support(gpu_dc, cpu, gc, dc):
    cpu_do = caffe2_pb2.DeviceOption()
    assert hu.cpu_do == cpu_do
    assert hu.gpu_do.device_type == workspace.GpuDeviceType
    gpus = [hu.cuda_do] if workspace.has_gpu_support else []
    assert hu.device_options == [cpu_do] + gpus
    assert gpu_dc == gpus
    assert cpu == {"gc": cpu_do, "dc": [cpu_do]}
    assert dc == hu.device_options and gc in hu.device_options
    assert len(hu.expanded_device_options) == 1 + (
        workspace.NumGpuDevices() if workspace.has_gpu_support else 0
    )
    assert mkl_test_util.device_options == hu.device_options  # no MKLDNN backend
    assert mkl_test_util.mkl_do.device_type == caffe2_pb2.MKLDNN


def test_run_in_hip():
    hip = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.HIP)
    assert hip_test_util.run_in_hip(hip, [])
    assert hip_test_util.run_in_hip(hu.cpu_do, [hu.cpu_do, hip])
    assert not hip_test_util.run_in_hip(hu.cpu_do, [hu.cpu_do, hu.cuda_do])


def test_gpu_extension_modules_are_absent_through_compat():
    got = _py("""
        import importlib.util, json
        import ferrocaffe.compat
        ferrocaffe.compat.install()
        out = {}
        for name in ("caffe2_pybind11_state_gpu", "caffe2_pybind11_state_hip"):
            full = "caffe2.python." + name
            out[name + "_spec"] = importlib.util.find_spec(full) is None
            try:
                __import__(full)
                out[name] = "imported"
            except ImportError as e:
                out[name] = type(e).__name__
        import caffe2.python.hypothesis_test_util as hu
        import caffe2.python.serialized_test.serialized_test_util as serial
        from caffe2.python.rnn.rnn_cell_test_util import _prepare_rnn
        import caffe2.python._import_c_extension as C
        import caffe2.python.hip_test_util, caffe2.python.mkl_test_util
        import caffe2.python.device_checker
        from caffe2.python.serialized_test import coverage  # Caffe2's own util imports it
        out["hu"] = hu.__name__
        out["serial_base"] = serial.SerializedTestCase.__mro__[1].__name__
        out["C"] = [hasattr(C, "Workspace"), hasattr(C, "cudnn_convolution_fwd_algo_count")]
        print(json.dumps(out))
    """)
    assert got["caffe2_pybind11_state_gpu_spec"] and got["caffe2_pybind11_state_hip_spec"]
    assert got["caffe2_pybind11_state_gpu"] == "ModuleNotFoundError"
    assert got["caffe2_pybind11_state_hip"] == "ModuleNotFoundError"
    assert got["hu"] == "ferrocaffe.hypothesis_test_util"
    assert got["serial_base"] == "HypothesisTestCase"
    assert got["C"] == [True, False]


# ---------------------------------------------------------------------------- running ops


def test_temp_workspace_restores_and_empties(tmp_path):
    workspace.FeedBlob("outer", np.ones(1, np.float32))
    with pytest.raises(KeyError):
        with hu.temp_workspace("scratch"):
            assert workspace.CurrentWorkspace() == "scratch"
            assert not workspace.HasBlob("outer")
            workspace.FeedBlob("inner", np.ones(1, np.float32))
            raise KeyError("boom")
    assert workspace.CurrentWorkspace() == "default" and workspace.HasBlob("outer")
    with hu.temp_workspace("scratch"):
        assert not workspace.HasBlob("inner")


def test_run_op_on_input():
    op = core.CreateOperator("Relu", ["X"], ["Y"])
    (y,) = hu.runOpOnInput(hu.cpu_do, op, [np.array([-1.0, 2.0], np.float32)])
    np.testing.assert_array_equal(y, [0.0, 2.0])
    assert not workspace.HasBlob("Y")  # ran in a temporary workspace
    with pytest.raises(ValueError, match="must supply an input"):
        hu.runOpOnInput(hu.cpu_do, core.CreateOperator("Add", ["A", "B"], ["C"]), [y])


def test_reference_checks_pass_and_fail():
    case = _case()
    op = core.CreateOperator("Relu", ["X"], ["Y"])
    x = np.array([[-1.0, 0.5], [2.0, -3.0]], np.float32)
    outs = case.assertReferenceChecks(hu.cpu_do, op, [x], lambda x: (np.maximum(x, 0),))
    np.testing.assert_array_equal(outs[0], np.maximum(x, 0))
    with pytest.raises(AssertionError, match="Output Y is not matching the reference"):
        case.assertReferenceChecks(hu.cpu_do, op, [x], lambda x: (np.abs(x),))
    with pytest.raises(RuntimeError, match="wrong reference implementation"):
        case.assertReferenceChecks(hu.cpu_do, op, [x], lambda x: np.maximum(x, 0))
    with pytest.raises(AssertionError):  # one reference output for an op with two outputs
        case.assertReferenceChecks(
            hu.cpu_do,
            core.CreateOperator("Split", ["X"], ["A", "B"], axis=0),
            [x],
            lambda x: (x[:1],),
        )
    # outputs_to_check picks the outputs the reference gives
    case.assertReferenceChecks(
        hu.cpu_do,
        core.CreateOperator("Split", ["X"], ["A", "B"], axis=0),
        [x],
        lambda x: (x[1:],),
        outputs_to_check=[1],
    )


def test_reference_checks_tolerances():
    case = _case()
    op = core.CreateOperator("Scale", ["X"], ["Y"], scale=1.001)
    x = np.ones(3, np.float32)
    case.assertReferenceChecks(hu.cpu_do, op, [x], lambda x: (x,), threshold=2e-3)
    with pytest.raises(AssertionError):
        case.assertReferenceChecks(hu.cpu_do, op, [x], lambda x: (x,))


def test_reference_checks_with_gradient_reference():
    case = _case()
    op = core.CreateOperator("Scale", ["X"], ["Y"], scale=3.0)
    x = np.array([1.0, -2.0], np.float32)

    def grad_ref(g_out, outputs, inputs):
        return (3.0 * g_out,)

    case.assertReferenceChecks(
        hu.cpu_do, op, [x], lambda x: (3 * x,), output_to_grad="Y", grad_reference=grad_ref
    )
    with pytest.raises(AssertionError, match="Gradient"):
        case.assertReferenceChecks(
            hu.cpu_do,
            op,
            [x],
            lambda x: (3 * x,),
            output_to_grad="Y",
            grad_reference=lambda g, o, i: (2.0 * g,),
        )


def test_reference_checks_demand_inference_only_when_asked():
    case = _case()
    op = core.CreateOperator("Relu", ["X"], ["Y"])
    x = np.ones(2, np.float32)
    if hasattr(workspace, "InferShapesAndTypes"):
        case.assertReferenceChecks(
            hu.cpu_do, op, [x], lambda x: (x,), ensure_outputs_are_inferred=True
        )
    else:
        with pytest.raises(RuntimeError, match="shape inference"):
            case.assertReferenceChecks(
                hu.cpu_do, op, [x], lambda x: (x,), ensure_outputs_are_inferred=True
            )


def test_gradient_checks_pass_for_a_right_gradient():
    case = _case()
    op = core.CreateOperator("Tanh", ["X"], ["Y"])
    x = np.array([[0.3, -0.4, 0.8], [0.1, 0.2, -0.9]], np.float32)
    case.assertGradientChecks(hu.cpu_do, op, [x], 0, [0])


def test_gradient_checks_fail_for_a_wrong_gradient():
    case = _case()
    op = core.CreateOperator("Relu", ["X"], ["Y"])
    x = np.array([0.5, 1.0, 2.0], np.float32)
    wrong = [core.CreateOperator("Scale", ["Y_grad"], ["X_grad"], scale=3.0)]
    with pytest.raises(AssertionError, match="Gradient check failed for input X"):
        case.assertGradientChecks(hu.cpu_do, op, [x], 0, [0], grad_ops=wrong)
    right = [core.CreateOperator("Scale", ["Y_grad"], ["X_grad"], scale=1.0)]
    case.assertGradientChecks(hu.cpu_do, op, [x], 0, [0], grad_ops=right)


def test_gradient_check_of_an_integer_input_estimates_zero():
    checker = gradient_checker.GradientChecker(stepsize=0.05, threshold=0.005)
    op = core.CreateOperator(
        "Cast",
        ["X"],
        ["Y"],
        to=caffe2_pb2.TensorProto.FLOAT,
        from_type=caffe2_pb2.TensorProto.INT32,
    )
    ok, grad, estimate = checker.CheckSimple(op, [np.zeros((2, 3), np.int32)], 0, [0])
    assert ok and not np.any(estimate) and grad.shape == (2, 3)


def test_device_checks():
    case = _case()
    op = core.CreateOperator("Relu", ["X"], ["Y"])
    case.assertDeviceChecks([hu.cpu_do, hu.cpu_do], op, [np.ones(3, np.float32)], [0])
    # a random op differs from one run to the next: the checker sees a disagreement
    fill = core.CreateOperator("GaussianFill", [], ["Z"], shape=[50])
    workspace.FeedBlob("keep", np.ones(1, np.float32))
    checker = device_checker.DeviceChecker(0.01, [hu.cpu_do, hu.cpu_do])
    assert checker.CheckSimple(fill, [], [0]) is False
    assert checker.CheckSimple(op, [np.ones(3, np.float32)], [0]) is True
    assert workspace.CurrentWorkspace() == "default" and workspace.HasBlob("keep")
    with pytest.raises(AssertionError):
        case.assertDeviceChecks([hu.cpu_do, hu.cpu_do], fill, [], [0])


def test_device_checker_check_net():
    net = core.Net("n")
    net.Relu(["X"], ["Y"])
    net.Scale(["Y"], ["Z"], scale=2.0)
    checker = device_checker.DeviceChecker(1e-6, [hu.cpu_do, hu.cpu_do])
    assert checker.CheckNet(net.Proto(), inputs={"X": np.ones(2, np.float32)})
    rand = core.Net("r")
    rand.GaussianFill([], ["G"], shape=[20])
    rand.Relu(["G"], ["H"])
    assert not checker.CheckNet(rand.Proto())
    assert checker.CheckNet(rand.Proto(), blobs_to_check=["H"], ignore={"H"})


def test_validation_checks():
    case = _case()
    op = core.CreateOperator("Add", ["A", "B"], ["C"])
    a, b = np.ones(2, np.float32), np.full(2, 2.0, np.float32)
    seen = {}

    def validator(A, B, C):
        seen.update(A=A, B=B, C=C)

    case.assertValidationChecks(hu.cpu_do, op, [a, b], validator)
    np.testing.assert_array_equal(seen["C"], a + b)

    def positional(inputs, outputs):
        np.testing.assert_array_equal(outputs[0], inputs[0] + inputs[1])

    case.assertValidationChecks(hu.cpu_do, op, [a, b], positional, as_kwargs=False)
    with pytest.raises(AssertionError, match="in-place"):
        case.assertValidationChecks(
            hu.cpu_do, core.CreateOperator("Add", ["A", "B"], ["A"]), [a, b], validator
        )


def test_run_op_raises():
    case = _case()
    op = core.CreateOperator("Add", ["A", "B"], ["C"])
    bad = [np.ones(2, np.float32), np.ones(3, np.float32)]
    case.assertRunOpRaises(hu.cpu_do, op, bad)
    with pytest.raises(AssertionError):
        case.assertRunOpRaises(hu.cpu_do, op, bad, regexp="no such message here")
    with pytest.raises(AssertionError):
        case.assertRunOpRaises(hu.cpu_do, op, [np.ones(2, np.float32)] * 2)


# ---------------------------------------------------------------------------- serialized


class _Recorded(serial.SerializedTestCase):
    def test_scale(self):  # the method named in the record
        pass


@pytest.fixture
def output_context(tmp_path, monkeypatch):
    saved = dict(vars(serial._output_context))
    serial._output_context.output_dir = str(tmp_path)
    monkeypatch.chdir(tmp_path)  # where Caffe2 looked next
    yield tmp_path
    for key in list(vars(serial._output_context)):
        delattr(serial._output_context, key)
    for key, value in saved.items():
        setattr(serial._output_context, key, value)


def _scale_check(case, x, scale=2.0):
    op = core.CreateOperator("Scale", ["X"], ["Y"], scale=scale)
    return case.assertReferenceChecks(hu.cpu_do, op, [x], lambda x: (scale * x,))


def test_serialized_record_then_compare(output_context):
    case = _Recorded("test_scale")
    x = np.array([1.0, 2.0], np.float32)
    case.should_serialize = True
    serial._output_context.should_generate_output = True
    _scale_check(case, x)
    record = output_context / "operator_test" / "test_caffe2_helpers.test_scale.zip"
    with zipfile.ZipFile(record) as z:
        assert sorted(z.namelist()) == ["grad_0.pb", "inout.npz", "op.pb"]
    report = (output_context / "SerializedTestCoverage.md").read_text()
    covered = report.split("## Covered operators")[1].split("</details>")[0]
    assert "* Scale\n" in covered  # the op and its gradient op (a Scale too)
    assert "* Relu\n" in report.split("## Not covered operators")[1].split("</details>")[0]
    serial._output_context.should_generate_output = False
    _scale_check(case, x)  # same inputs, same outputs, same gradient op
    # other inputs: the recorded op runs on the recorded inputs
    _scale_check(case, np.array([5.0, 6.0, 7.0], np.float32))
    # another scale computes other outputs from the recorded inputs than recorded
    with pytest.raises(AssertionError):
        _scale_check(case, x, scale=3.0)
    # checks are off outside the serialized run and when disabled
    with case.set_disable_serialized_check(True):
        _scale_check(case, x, scale=3.0)
    case.should_serialize = False
    _scale_check(case, x, scale=3.0)


def test_serialized_compare_sees_other_gradient_ops(output_context):
    case = _Recorded("test_scale")
    x = np.array([1.0, 2.0], np.float32)
    case.should_serialize = True
    serial._output_context.should_generate_output = True
    _scale_check(case, x)
    serial._output_context.should_generate_output = False
    with pytest.raises(AssertionError):
        case.compare_test(
            [x], [2 * x], [core.CreateOperator("Scale", ["Y_grad"], ["X_grad"], scale=5.0)]
        )


def test_serialized_compare_without_a_record_fails(output_context):
    case = _Recorded("test_scale")
    case.should_serialize = True
    with pytest.raises(FileNotFoundError):
        _scale_check(case, np.ones(2, np.float32))


def test_serialized_given_runs_the_seeded_example_twice():
    calls = []

    class T(serial.SerializedTestCase):
        @serial.given(v=st.integers(0, 10**9))
        def test_it(self, v):
            calls.append((self.should_serialize, v))

    T("test_it").test_it()
    assert [c[0] for c in calls] == [True, False]
    assert calls[0][1] == calls[1][1]
    calls.clear()
    T("test_it").test_it()
    assert calls[0][1] == calls[1][1]  # seed 0: the same example every time
    first = calls[0][1]
    calls.clear()
    T("test_it").test_it()
    assert calls[0][1] == first


def test_data_dir_default_and_override():
    assert serial.DATA_DIR.endswith(os.path.join("serialized_test", "data"))
    got = _py(
        "import json; from ferrocaffe.serialized_test import serialized_test_util as s;"
        "print(json.dumps(s.DATA_DIR))",
        {"FERROCAFFE_SERIALIZED_TEST_DATA": "/some/where"},
    )
    assert got == "/some/where"


# ---------------------------------------------------------------------------- rnn helpers


def test_rnn_activations():
    x = np.array([-2.0, 0.0, 3.0])
    np.testing.assert_allclose(rnn_cell_test_util.sigmoid(x), 1 / (1 + np.exp(-x)))
    np.testing.assert_allclose(rnn_cell_test_util.tanh(x), np.tanh(x), atol=1e-12)


def test_prepare_rnn_feeds_states_and_lengths():
    seen = {}

    def create_rnn(model, input_blob, seq_lengths, states, **kwargs):
        seen.update(kwargs, input=str(input_blob), lengths=str(seq_lengths))
        return ["out"]

    outputs, net, inputs = rnn_cell_test_util._prepare_rnn(
        4,
        3,
        5,
        create_rnn,
        outputs_with_grads=[0],
        forget_bias=0.0,
        two_d_initial_states=False,
        dim_out=[5, 6],
        T=4,
    )
    assert outputs == ["out"]
    assert [str(b) for b in inputs] == [
        "state_0/layer_0",
        "state_1/layer_0",
        "state_0/layer_1",
        "state_1/layer_1",
        "test_name_scope/input_blob",
    ]
    assert workspace.FetchBlob("state_1/layer_1").shape == (1, 3, 6)
    lengths = workspace.FetchBlob("test_name_scope/seq_lengths")
    assert lengths.dtype == np.int32 and lengths.shape == (3,)
    assert np.all((lengths >= 1) & (lengths <= 4))
    assert seen["scope"] == "external/recurrent" and seen["static_rnn_unroll_size"] == 4
    assert seen["dim_out"] == [5, 6] and seen["outputs_with_grads"] == [0]
    rnn_cell_test_util._prepare_rnn(
        2, 3, 5, create_rnn, [0], 0.0, two_d_initial_states=True, num_states=1
    )
    assert workspace.FetchBlob("state_0/layer_0").shape == (3, 5)


# ---------------------------------------------------------------------------- engine prefs


def test_engine_preferences_are_checked_and_fall_back_to_the_default():
    from ferrocaffe.core import engine

    core.SetEnginePref({}, {})  # what Caffe2's own test_util.TestCase does first
    core.SetOpEnginePref("Relu", {caffe2_pb2.CPU: ["NOT_BUILT"]})
    core.SetGlobalEnginePref({caffe2_pb2.CPU: ["NOT_BUILT"]})
    assert engine._per_op_pref[caffe2_pb2.CPU]["Relu"] == ["NOT_BUILT"]
    (y,) = hu.runOpOnInput(
        hu.cpu_do, core.CreateOperator("Relu", ["X"], ["Y"]), [np.array([-1.0], np.float32)]
    )
    assert y.tolist() == [0.0]  # the default implementation ran
    with pytest.raises(RuntimeError, match="NoSuchOp not registered"):
        core.SetOpEnginePref("NoSuchOp", {caffe2_pb2.CPU: ["X"]})
    with pytest.raises(TypeError):
        core.SetGlobalEnginePref({caffe2_pb2.CPU: "NNPACK"})
    engine._per_op_pref.clear()
    engine._global_pref.clear()


def test_profiles_suppress_the_checks_caffe2s_hypothesis_did_not_have():
    # Caffe2's tests share @given methods between test cases (rnn_cell_test's lstm_base).
    for name in ("sandcastle", "dev", "debug"):
        s = hypothesis.settings.get_profile(name)
        assert hypothesis.HealthCheck.too_slow in s.suppress_health_check
        if hasattr(hypothesis.HealthCheck, "differing_executors"):
            assert hypothesis.HealthCheck.differing_executors in s.suppress_health_check


def test_check_helpers_hide_their_frames_from_pytest_tracebacks():
    """A failure inside a reference shows the test and the reference, not the helper's frames
    (pytest's __tracebackhide__); unfiltered, the helper's frame is there."""
    tc = _case()

    def broken_reference(x):
        raise ValueError("reference broke")

    op = core.CreateOperator("Relu", ["X"], ["Y"])
    x = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="reference broke") as excinfo:
        tc.assertReferenceChecks(caffe2_pb2.DeviceOption(), op, [x], broken_reference)
    paths = [str(e.path) for e in excinfo.traceback]
    shown = [str(e.path) for e in excinfo.traceback.filter(excinfo)]
    assert any(p.endswith("hypothesis_test_util.py") for p in paths)
    assert not any(p.endswith("hypothesis_test_util.py") for p in shown)
    assert shown[-1].endswith("test_caffe2_helpers.py")  # the reference itself
