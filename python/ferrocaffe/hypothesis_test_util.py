"""Caffe2's ``hypothesis_test_util``: property-based operator tests with Hypothesis.

:class:`HypothesisTestCase` (a :class:`ferrocaffe.test_util.TestCase`) checks one operator
against

* a NumPy reference (``assertReferenceChecks``, optionally with a gradient reference),
* central-difference gradient estimates (``assertGradientChecks``, through
  :class:`ferrocaffe.gradient_checker.GradientChecker`),
* itself on every device of a list (``assertDeviceChecks``, through
  :class:`ferrocaffe.device_checker.DeviceChecker`),
* a validator called with its inputs and outputs (``assertValidationChecks``),
* an expected exception (``assertRunOpRaises``).

Strategies: ``dims``, ``elements_of_type``, ``arrays``, ``tensor``, ``tensor1d``,
``tensors``, ``tensors1d``, ``segment_ids``, ``lengths``, ``segmented_tensor``,
``lengths_tensor``, ``sparse_segmented_tensor``, ``sparse_lengths_tensor``; ``floats`` is
``st.floats`` with 32-bit width unless told otherwise. Device options: ``cpu_do``,
``cuda_do``, ``hip_do``, ``gpu_do`` and the ``gc``/``dc`` pairs ``gcs``, ``gcs_cpu_only``,
``gcs_cuda_only``, ``gcs_gpu_only``, ``gcs_no_hip``. Where no GPU can be used
(``workspace.has_gpu_support`` is False) the device lists hold the CPU alone and the GPU-only
pairs are empty, as on a CPU-only Caffe2 build.

Importing the module registers Caffe2's Hypothesis profiles (``sandcastle``, ``dev``,
``debug``) and loads ``sandcastle`` on Sandcastle, otherwise ``$CAFFE2_HYPOTHESIS_PROFILE``
(default ``dev``: 10 examples, 10 s deadline, no example database).
"""

import contextlib
import copy
import functools
import logging
import os
import struct

import hypothesis
import hypothesis.extra.numpy
import hypothesis.strategies as st
import numpy as np

from ferrocaffe import core, device_checker, gradient_checker, test_util, workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "HypothesisTestCase",
    "arrays",
    "cpu_do",
    "cuda_do",
    "device_checker_device_options",
    "device_options",
    "dims",
    "elements_of_type",
    "expanded_device_options",
    "floats",
    "gcs",
    "gcs_cpu_only",
    "gcs_cuda_only",
    "gcs_gpu_only",
    "gcs_no_hip",
    "gpu_do",
    "gradient_checker_device_option",
    "hip_do",
    "is_sandcastle",
    "is_travis",
    "lengths",
    "lengths_tensor",
    "runOpBenchmark",
    "runOpOnInput",
    "segment_ids",
    "segmented_tensor",
    "settings",
    "sparse_lengths_tensor",
    "sparse_segmented_tensor",
    "temp_workspace",
    "tensor",
    "tensor1d",
    "tensors",
    "tensors1d",
    "to_float32",
]

_HYPOTHESIS_VERSION = hypothesis.version.__version_info__


def is_sandcastle():
    return os.getenv("SANDCASTLE") == "1" or os.getenv("TW_JOB_USER") == "sandcastle"


def is_travis():
    return "TRAVIS" in os.environ


def to_float32(x):
    """``x`` rounded to the nearest float32, as a Python float."""
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def settings(*args, **kwargs):
    """``hypothesis.settings`` accepting the options of the Hypothesis versions Caffe2's tests
    were written for: ``min_satisfying_examples`` is dropped where Hypothesis no longer has it,
    ``timeout`` (seconds) becomes ``deadline`` (milliseconds) where ``deadline`` is not given,
    and ``deadline`` is dropped on versions before it existed."""
    if _HYPOTHESIS_VERSION >= (3, 56, 0):
        kwargs.pop("min_satisfying_examples", None)
    if _HYPOTHESIS_VERSION < (4, 44, 0):
        kwargs.pop("deadline", None)
    elif "timeout" in kwargs:
        timeout = kwargs.pop("timeout")
        kwargs.setdefault("deadline", timeout * 1e3)
    return hypothesis.settings(*args, **kwargs)


def floats(*args, **kwargs):
    """``st.floats`` drawing float32 values unless ``width`` is given (bounds are rounded to
    float32 then)."""
    if _HYPOTHESIS_VERSION < (3, 67, 0):
        kwargs.pop("width", None)
    elif "width" not in kwargs:
        kwargs["width"] = 32
        for bound in ("min_value", "max_value"):
            if kwargs.get(bound) is not None:
                kwargs[bound] = to_float32(kwargs[bound])
    return st.floats(*args, **kwargs)


def _register_profiles():
    # Caffe2's hypothesis had no differing_executors check; its tests share @given methods
    # between test cases (e.g. rnn_cell_test's lstm_base), which today's check rejects.
    suppressed = [hypothesis.HealthCheck.too_slow]
    if hasattr(hypothesis.HealthCheck, "differing_executors"):
        suppressed.append(hypothesis.HealthCheck.differing_executors)
    common = dict(
        suppress_health_check=suppressed,
        database=None,
        min_satisfying_examples=1,
        verbosity=hypothesis.Verbosity.verbose,
    )
    profiles = {
        "sandcastle": dict(derandomize=True, max_examples=50, deadline=10000),
        "dev": dict(derandomize=False, max_examples=10, deadline=10000),
        "debug": dict(derandomize=False, max_examples=1000, deadline=50000),
    }
    # Caffe2's hypothesis had no "ci" profile; today's loads one (derandomize=True) when it sees
    # a CI variable, and new profiles inherit from it, so dev and debug say False explicitly.
    for name, extra in profiles.items():
        hypothesis.settings.register_profile(name, settings(**dict(common, **extra)))
    default = "sandcastle" if is_sandcastle() else os.getenv("CAFFE2_HYPOTHESIS_PROFILE", "dev")
    hypothesis.settings.load_profile(default)


_register_profiles()


# --------------------------------------------------------------------------------------------
# strategies


def dims(min_value=1, max_value=5):
    """One dimension: an integer in ``[min_value, max_value]``."""
    return st.integers(min_value=min_value, max_value=max_value)


def _dtype_key(dtype):
    if dtype is bool or dtype is np.bool_:
        return "bool"
    try:
        return np.dtype(dtype).name
    except TypeError:
        return None


_ELEMENTS = {
    "float16": lambda: floats(min_value=-1.0, max_value=1.0, width=16),
    "float32": lambda: floats(min_value=-1.0, max_value=1.0, width=32),
    "float64": lambda: floats(min_value=-1.0, max_value=1.0, width=64),
    "int32": lambda: st.integers(min_value=0, max_value=2**31 - 1),
    "int64": lambda: st.integers(min_value=0, max_value=2**63 - 1),
    "bool": st.booleans,
}


def elements_of_type(dtype=np.float32, filter_=None):
    """The default elements of an array of ``dtype``: floats in [-1, 1], non-negative
    integers of the type's range, booleans. ``filter_`` keeps only the values it accepts.
    Other dtypes raise ``ValueError``."""
    make = _ELEMENTS.get(_dtype_key(dtype))
    if make is None:
        raise ValueError("Unexpected dtype without elements provided")
    elements = make()
    return elements if filter_ is None else elements.filter(filter_)


def arrays(dims, dtype=np.float32, elements=None, unique=False):
    """NumPy arrays of shape ``dims`` (and the default elements of ``dtype`` unless
    ``elements`` is given)."""
    if elements is None:
        elements = elements_of_type(dtype)
    return hypothesis.extra.numpy.arrays(dtype, dims, elements=elements, unique=unique)


def _shapes(min_dim, max_dim, **dim_kwargs):
    return st.lists(dims(**dim_kwargs), min_size=min_dim, max_size=max_dim)


def tensor(min_dim=1, max_dim=4, dtype=np.float32, elements=None, unique=False, **kwargs):
    """An array of ``min_dim`` to ``max_dim`` dimensions, each drawn by ``dims(**kwargs)``."""
    return _shapes(min_dim, max_dim, **kwargs).flatmap(
        lambda shape: arrays(shape, dtype, elements, unique=unique)
    )


def tensor1d(min_len=1, max_len=64, dtype=np.float32, elements=None):
    """A 1-D array of ``min_len`` to ``max_len`` elements."""
    return tensor(1, 1, dtype, elements, min_value=min_len, max_value=max_len)


def tensors(n, min_dim=1, max_dim=4, dtype=np.float32, elements=None, **kwargs):
    """A list of ``n`` arrays, all of one shape (drawn as in :func:`tensor`)."""
    return _shapes(min_dim, max_dim, **kwargs).flatmap(
        lambda shape: st.lists(arrays(shape, dtype, elements), min_size=n, max_size=n)
    )


def tensors1d(n, min_len=1, max_len=64, dtype=np.float32, elements=None):
    """A list of ``n`` 1-D arrays of one length in ``[min_len, max_len]``."""
    return tensors(n, 1, 1, dtype, elements, min_value=min_len, max_value=max_len)


def _sorted_ids(steps):
    ids = np.cumsum(steps, dtype=np.int32)
    return ids - ids[0]


def segment_ids(size, is_sorted):
    """``size`` int32 segment ids. Sorted ids start at 0 and grow by 0 or 1 from one element
    to the next; unsorted ones are any integers in ``[0, 2 * size]``."""
    if size == 0:
        return st.just(np.empty(shape=[0], dtype=np.int32))
    if is_sorted:
        return arrays([size], dtype=np.int32, elements=st.booleans()).map(_sorted_ids)
    return arrays([size], dtype=np.int32, elements=st.integers(min_value=0, max_value=2 * size))


def _lengths_from_borders(size, borders):
    cuts = np.sort(np.concatenate([np.asarray(borders, dtype=np.int32), [0, size]]))
    return np.diff(cuts).astype(np.int32)


def lengths(size, min_segments=None, max_segments=None, **kwargs):
    """int32 segment lengths (zeros allowed) that add up to ``size``: between
    ``min_segments`` (default 0, at least one segment unless ``size`` and ``max_segments``
    are both 0) and ``max_segments`` (default ``size``) of them."""
    min_segments = 0 if min_segments is None else min_segments
    max_segments = size if max_segments is None else max_segments
    assert 0 <= min_segments <= max_segments
    if size == 0 and max_segments == 0:
        return st.just(np.empty(shape=[0], dtype=np.int32))
    assert max_segments > 0, "size is not 0, need at least one segment"
    n_borders = st.integers(min_value=max(min_segments - 1, 0), max_value=max_segments - 1)
    return n_borders.flatmap(
        lambda n: hypothesis.extra.numpy.arrays(
            np.int32, n, elements=st.integers(min_value=0, max_value=size)
        )
    ).map(functools.partial(_lengths_from_borders, size))


def segmented_tensor(
    min_dim=1,
    max_dim=4,
    dtype=np.float32,
    is_sorted=True,
    elements=None,
    segment_generator=segment_ids,
    allow_empty=False,
    **kwargs,
):
    """``(data, segments)``: an array as in :func:`tensor` (with a leading dimension of 0
    too when ``allow_empty``) and ``segment_generator(len(data), is_sorted=is_sorted)``."""
    empty = st.booleans() if allow_empty else st.just(False)
    shapes = st.tuples(empty, _shapes(min_dim, max_dim, **kwargs)).map(
        lambda pair: ([0] if pair[0] else []) + pair[1]
    )
    return shapes.flatmap(
        lambda shape: st.tuples(
            arrays(shape, dtype, elements), segment_generator(shape[0], is_sorted=is_sorted)
        )
    )


def lengths_tensor(min_segments=None, max_segments=None, *args, **kwargs):
    """``(data, lengths)``: :func:`segmented_tensor` with :func:`lengths` as segments."""
    segments = functools.partial(lengths, min_segments=min_segments, max_segments=max_segments)
    return segmented_tensor(*args, segment_generator=segments, **kwargs)


def sparse_segmented_tensor(
    min_dim=1,
    max_dim=4,
    dtype=np.float32,
    is_sorted=True,
    elements=None,
    allow_empty=False,
    segment_generator=segment_ids,
    itype=np.int64,
    **kwargs,
):
    """``(data, indices, segments)``: an array as in :func:`tensor`, 1 to ``len(data)``
    indices of type ``itype`` into its rows (none when ``allow_empty`` draws so), and
    ``segment_generator(len(indices), is_sorted=is_sorted)``."""
    empty = st.booleans() if allow_empty else st.just(False)

    def with_index_count(pair):
        is_empty, shape = pair
        count = st.just(0) if is_empty else st.integers(min_value=1, max_value=shape[0])
        return st.tuples(st.just(shape), count)

    def draw(shape_and_count):
        shape, count = shape_and_count
        indices = arrays(
            count, dtype=itype, elements=st.integers(min_value=0, max_value=shape[0] - 1)
        )
        return st.tuples(
            arrays(shape, dtype, elements),
            indices,
            segment_generator(count, is_sorted=is_sorted),
        )

    shapes = st.tuples(empty, _shapes(min_dim, max_dim, **kwargs))
    return shapes.flatmap(with_index_count).flatmap(draw)


def sparse_lengths_tensor(**kwargs):
    """``(data, indices, lengths)``: :func:`sparse_segmented_tensor` with :func:`lengths`."""
    return sparse_segmented_tensor(segment_generator=lengths, **kwargs)


# --------------------------------------------------------------------------------------------
# devices

cpu_do = caffe2_pb2.DeviceOption()
cuda_do = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)
hip_do = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.HIP)
gpu_do = caffe2_pb2.DeviceOption(device_type=workspace.GpuDeviceType)  # CUDA or ROCm
# A device is listed only where ops can run on it now: ferrocaffe's has_cuda_support says
# the module was built with CUDA, has_gpu_support that a GPU is there to use.
_cuda_do_list = [cuda_do] if workspace.has_gpu_support and not workspace.has_hip_support else []
_hip_do_list = [hip_do] if workspace.has_hip_support else []
_gpu_do_list = [gpu_do] if workspace.has_gpu_support else []
_device_options_no_hip = [cpu_do] + _cuda_do_list
device_options = _device_options_no_hip + _hip_do_list
# one option per GPU
expanded_device_options = [cpu_do] + [
    caffe2_pb2.DeviceOption(device_type=workspace.GpuDeviceType, device_id=i)
    for i in range(workspace.NumGpuDevices() if workspace.has_gpu_support else 0)
]


def device_checker_device_options():
    return st.just(device_options)


def gradient_checker_device_option():
    return st.sampled_from(device_options)


gcs = dict(gc=gradient_checker_device_option(), dc=device_checker_device_options())
gcs_cpu_only = dict(gc=st.sampled_from([cpu_do]), dc=st.just([cpu_do]))
gcs_cuda_only = dict(gc=st.sampled_from(_cuda_do_list), dc=st.just(_cuda_do_list))
gcs_gpu_only = dict(gc=st.sampled_from(_gpu_do_list), dc=st.just(_gpu_do_list))
gcs_no_hip = dict(gc=st.sampled_from(_device_options_no_hip), dc=st.just(_device_options_no_hip))


# --------------------------------------------------------------------------------------------
# running one op


@contextlib.contextmanager
def temp_workspace(name=b"temp_ws"):
    """Runs the block in a fresh workspace ``name``, emptied afterwards; the previous
    workspace is current again after the block, whether it raised or not."""
    if isinstance(name, bytes):
        name = name.decode()
    previous = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace(name, True)
    try:
        yield
    finally:
        workspace.ResetWorkspace()
        workspace.SwitchWorkspace(previous)


def _placed(op, device_option):
    op = copy.deepcopy(op)
    op.device_option.CopyFrom(device_option)
    return op


def _feed_inputs(op, inputs, device_option, input_device_options):
    placement = input_device_options or core.InferOpBlobDevicesAsDict(op)[0]
    for name, value in zip(op.input, inputs, strict=False):
        workspace.FeedBlob(name, value, device_option=placement.get(name, device_option))


def _require_all_inputs(op, inputs):
    if len(op.input) > len(inputs):
        raise ValueError(
            "must supply an input for each input on the op: %s vs %s" % (op.input, inputs)
        )


def runOpOnInput(device_option, op, inputs, input_device_options=None):
    """Runs (a copy of) ``op`` on ``device_option`` with ``inputs`` in a temporary workspace;
    returns its outputs."""
    op = _placed(op, device_option)
    with temp_workspace():
        _require_all_inputs(op, inputs)
        _feed_inputs(op, inputs, device_option, input_device_options)
        workspace.RunOperatorOnce(op)
        return [workspace.FetchBlob(name) for name in op.output]


def runOpBenchmark(device_option, op, inputs, input_device_options=None, iterations=10):
    """Times (a copy of) ``op`` as a one-op net: ``workspace.BenchmarkNet``'s result for one
    warm-up run and ``iterations`` timed runs, per-op times included."""
    op = _placed(op, device_option)
    net = caffe2_pb2.NetDef()
    net.op.extend([op])
    net.name = op.name or "test"
    with temp_workspace():
        _feed_inputs(op, inputs, device_option, input_device_options)
        workspace.CreateNet(net)
        return workspace.BenchmarkNet(net.name, 1, iterations, True)


_TENSOR_TYPES = {
    np.dtype(np.float64): caffe2_pb2.TensorProto.DOUBLE,
    np.dtype(np.float32): caffe2_pb2.TensorProto.FLOAT,
    np.dtype(np.int32): caffe2_pb2.TensorProto.INT32,
    np.dtype(np.int64): caffe2_pb2.TensorProto.INT64,
}


def _strict_shape_inference(ensure):
    return ensure or os.getenv("CAFFE2_ASSERT_SHAPEINFERENCE") == "1"


def _infer_shapes_and_types(net, ensure):
    """``(shapes, types)`` from the runtime's static shape inference, or None when it cannot
    infer them (an error only when ``ensure`` or ``$CAFFE2_ASSERT_SHAPEINFERENCE=1``)."""
    infer = getattr(workspace, "InferShapesAndTypes", None)
    if infer is None:
        if _strict_shape_inference(ensure):
            raise RuntimeError("shape inference is not available (workspace.InferShapesAndTypes)")
        return None
    try:
        return infer([net])
    except RuntimeError as e:
        logging.warning(str(e))
        if _strict_shape_inference(ensure):
            raise
        return None


class HypothesisTestCase(test_util.TestCase):
    """``test_util.TestCase`` with the operator checks of Caffe2's Hypothesis tests."""

    def assertDeviceChecks(
        self,
        device_options,
        op,
        inputs,
        outputs_to_check,
        input_device_options=None,
        threshold=0.01,
    ):
        """Asserts that ``op`` gives the same outputs ``outputs_to_check`` (indices) on every
        device of ``device_options`` (within ``threshold``, absolute and relative)."""
        __tracebackhide__ = True  # pytest shows the test and its reference, not this helper
        checker = device_checker.DeviceChecker(threshold, device_options=device_options)
        self.assertTrue(checker.CheckSimple(op, inputs, outputs_to_check, input_device_options))

    def assertGradientChecks(
        self,
        device_option,
        op,
        inputs,
        outputs_to_check,
        outputs_with_grads,
        grad_ops=None,
        threshold=0.005,
        stepsize=0.05,
        input_device_options=None,
        ensure_outputs_are_inferred=False,
    ):
        """Asserts that the gradient of ``op``'s input number ``outputs_to_check`` (Caffe2's
        name for it) agrees with central differences of the loss ``0.5 * sum(y ** 2)`` over
        the outputs ``outputs_with_grads``."""
        __tracebackhide__ = True  # pytest shows the test and its reference, not this helper
        checker = gradient_checker.GradientChecker(
            stepsize=stepsize,
            threshold=threshold,
            device_option=device_option,
            workspace_name=str(device_option),
            input_device_options=input_device_options,
        )
        ok, grad, grad_estimated = checker.CheckSimple(
            op,
            inputs,
            outputs_to_check,
            outputs_with_grads,
            grad_ops=grad_ops,
            input_device_options=input_device_options,
            ensure_outputs_are_inferred=ensure_outputs_are_inferred,
        )
        self.assertEqual(grad.shape, grad_estimated.shape)
        self.assertTrue(ok, "Gradient check failed for input " + str(op.input[outputs_to_check]))

    def _assertGradReferenceChecks(
        self, op, inputs, ref_outputs, output_to_grad, grad_reference, threshold=1e-4
    ):
        __tracebackhide__ = True  # pytest shows the test and its reference, not this helper
        grad_blob_name = output_to_grad + "_grad"
        grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(
            [op], {output_to_grad: grad_blob_name}
        )
        output_grad = workspace.FetchBlob(output_to_grad)
        grad_ref_outputs = grad_reference(output_grad, ref_outputs, inputs)
        # the output itself is its gradient
        workspace.FeedBlob(grad_blob_name, workspace.FetchBlob(output_to_grad))
        workspace.RunOperatorsOnce(grad_ops)

        self.assertEqual(len(grad_ref_outputs), len(inputs))
        for name, ref in zip(op.input, grad_ref_outputs, strict=False):
            grad = grad_map.get(name)
            if not grad:
                self.assertIsNone(ref)
                continue
            if isinstance(grad, core.GradientSlice):
                ref_values, ref_indices = ref
                values_name = grad.values
            else:
                ref_values, ref_indices = ref, None
                values_name = grad
            np.testing.assert_allclose(
                workspace.FetchBlob(str(values_name)),
                ref_values,
                atol=threshold,
                rtol=threshold,
                err_msg=f"Gradient {values_name} (x) is not matching the reference (y)",
            )
            if ref_indices is not None:
                np.testing.assert_allclose(
                    workspace.FetchBlob(str(grad.indices)), ref_indices, atol=1e-4, rtol=1e-4
                )

    def _assertInferTensorChecks(
        self, name, shapes, types, output, ensure_output_is_inferred=False
    ):
        __tracebackhide__ = True  # pytest shows the test and its reference, not this helper
        self.assertTrue(
            not ensure_output_is_inferred or name in shapes,
            f"Shape for {name} was not inferred",
        )
        if name not in shapes:
            return
        output = workspace.FetchBlob(name)
        if isinstance(output, np.ndarray):
            correct_type = _TENSOR_TYPES.get(output.dtype, f"unknown {output.dtype}")
        else:
            correct_type = str(type(output))
        try:
            np.testing.assert_array_equal(
                np.array(shapes[name]).astype(np.int32),
                np.array(output.shape).astype(np.int32),
                err_msg=f"Shape {name} mismatch: {shapes[name]} vs. {output.shape}",
            )
            # Caffe2 compared the inferred type of int32 outputs only.
            if correct_type == caffe2_pb2.TensorProto.INT32:
                np.testing.assert_equal(
                    types[name],
                    correct_type,
                    err_msg=f"Type {name} mismatch: {types[name]} vs. {correct_type}",
                )
        except AssertionError as e:
            logging.warning(str(e))
            if _strict_shape_inference(ensure_output_is_inferred):
                raise

    def assertReferenceChecks(
        self,
        device_option,
        op,
        inputs,
        reference,
        input_device_options=None,
        threshold=1e-4,
        output_to_grad=None,
        grad_reference=None,
        atol=None,
        outputs_to_check=None,
        ensure_outputs_are_inferred=False,
    ):
        """Runs ``op`` on ``device_option`` with ``inputs`` and asserts that its outputs match
        ``reference(*inputs)`` (a tuple or list of arrays; strings compared exactly, numbers
        within ``threshold`` relative and ``atol`` (default ``threshold``) absolute).
        ``outputs_to_check`` picks the outputs the reference returns (default: all).
        ``grad_reference(output_grad, ref_outputs, inputs)``, with ``output_to_grad``, checks
        the input gradients too, the output being fed as its own gradient. Returns the
        outputs."""
        __tracebackhide__ = True  # pytest shows the test and its reference, not this helper
        op = _placed(op, device_option)
        with temp_workspace():
            _require_all_inputs(op, inputs)
            _feed_inputs(op, inputs, device_option, input_device_options)
            net = core.Net("opnet")
            net.Proto().op.extend([op])
            inferred = _infer_shapes_and_types(net, ensure_outputs_are_inferred)
            workspace.RunNetOnce(net)
            reference_outputs = reference(*inputs)
            if not isinstance(reference_outputs, (tuple, list)):
                raise RuntimeError(
                    "You are providing a wrong reference implementation. A "
                    "proper one should return a tuple/list of numpy arrays."
                )
            if not outputs_to_check:
                self.assertEqual(len(reference_outputs), len(op.output))
                outputs_to_check = list(range(len(op.output)))
            outs = []
            for index, ref in zip(outputs_to_check, reference_outputs, strict=False):
                name = op.output[index]
                output = workspace.FetchBlob(name)
                if output.dtype.kind in ("S", "O"):
                    np.testing.assert_array_equal(output, ref)
                else:
                    np.testing.assert_allclose(
                        output,
                        ref,
                        atol=threshold if atol is None else atol,
                        rtol=threshold,
                        err_msg=f"Output {name} is not matching the reference",
                    )
                if inferred is not None:
                    shapes, types = inferred
                    self._assertInferTensorChecks(
                        name,
                        shapes,
                        types,
                        output,
                        ensure_output_is_inferred=ensure_outputs_are_inferred,
                    )
                outs.append(output)
            if grad_reference is not None:
                assert output_to_grad is not None, (
                    "If grad_reference is set, output_to_grad has to be set as well"
                )
                with core.DeviceScope(device_option):
                    self._assertGradReferenceChecks(
                        op,
                        inputs,
                        reference_outputs,
                        output_to_grad,
                        grad_reference,
                        threshold=threshold,
                    )
            return outs

    def assertValidationChecks(
        self,
        device_option,
        op,
        inputs,
        validator,
        input_device_options=None,
        as_kwargs=True,
        init_net=None,
    ):
        """Runs ``op`` (after ``init_net`` if given) and calls ``validator`` with the inputs and
        outputs: as keyword arguments named after the blobs (``as_kwargs``; in-place ops are
        refused then) or as ``validator(inputs=..., outputs=...)``."""
        __tracebackhide__ = True  # pytest shows the test and its reference, not this helper
        if as_kwargs:
            names = list(op.input) + list(op.output)
            assert len(set(names)) == len(names), "in-place ops are not supported in as_kwargs mode"
        op = _placed(op, device_option)
        with temp_workspace():
            _feed_inputs(op, inputs, device_option, input_device_options)
            if init_net:
                workspace.RunNetOnce(init_net)
            workspace.RunOperatorOnce(op)
            outputs = [workspace.FetchBlob(n) for n in op.output]
            if as_kwargs:
                validator(
                    **dict(
                        zip(list(op.input) + list(op.output), list(inputs) + outputs, strict=False)
                    )
                )
            else:
                validator(inputs=inputs, outputs=outputs)

    def assertRunOpRaises(
        self,
        device_option,
        op,
        inputs,
        input_device_options=None,
        exception=(Exception,),
        regexp=None,
    ):
        """Asserts that running ``op`` with ``inputs`` raises ``exception`` (with a message
        matching ``regexp`` if given)."""
        __tracebackhide__ = True  # pytest shows the test and its reference, not this helper
        op = _placed(op, device_option)
        with temp_workspace():
            _feed_inputs(op, inputs, device_option, input_device_options)
            if regexp is None:
                self.assertRaises(exception, workspace.RunOperatorOnce, op)
            else:
                self.assertRaisesRegex(exception, regexp, workspace.RunOperatorOnce, op)
