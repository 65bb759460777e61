"""Caffe2's ``serialized_test.serialized_test_util``: operator tests that also compare with
outputs Caffe2 recorded.

A test method decorated with :func:`given` runs its Hypothesis test twice with one example
drawn from seed 0: first with ``self.should_serialize`` set (each ``assertReferenceChecks``
then also calls ``assertSerializedOperatorChecks``), then without.

``assertSerializedOperatorChecks`` looks for ``<test file>.<test method>.zip`` in
``<output dir>/operator_test`` (``op.pb``, ``grad_<i>.pb``, ``inout.npz``, as Caffe2 wrote
them). Where the inputs differ from the recorded ones, the recorded operator is run on the
recorded inputs. The outputs must match the recorded outputs (``assert_allclose`` with the
check's tolerances) and each gradient op must equal the recorded one (arguments compared
regardless of order). A missing file raises ``FileNotFoundError``, as in Caffe2.

The output dir is ``_output_context.output_dir`` when set, else :data:`DATA_DIR`:
``$FERROCAFFE_SERIALIZED_TEST_DATA`` or, by default, the data of Caffe2's test suite as
fetched by ferrocaffe's test tooling (``~/.cache/ferrocaffe/caffe2-tests/caffe2/python/
serialized_test/data``). ferrocaffe ships no recorded data of its own. Setting
``_output_context.should_generate_output`` (Caffe2's ``-G``) writes the zip instead of
comparing, and then ``SerializedTestCoverage.md`` (see :mod:`.coverage`) beside the
``operator_test`` folder unless ``_output_context.disable_gen_coverage`` (``-C``);
``_output_context.disable_serialized_check`` (``-D``) turns the comparison off.
"""

import inspect
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from contextlib import contextmanager

import hypothesis as hy
import numpy as np

from ferrocaffe import gradient_checker
from ferrocaffe import hypothesis_test_util as hu
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.serialized_test import coverage

__all__ = [
    "DATA_DIR",
    "DATA_SUFFIX",
    "SerializedTestCase",
    "TOP_DIR",
    "given",
    "operator_test_type",
    "testWithArgs",
]

operator_test_type = "operator_test"
DATA_SUFFIX = "data"
TOP_DIR = os.path.dirname(os.path.realpath(__file__))
_FETCHED_DATA = os.path.join(
    os.path.expanduser("~"),
    ".cache",
    "ferrocaffe",
    "caffe2-tests",
    "caffe2",
    "python",
    "serialized_test",
    DATA_SUFFIX,
)
DATA_DIR = os.environ.get("FERROCAFFE_SERIALIZED_TEST_DATA") or _FETCHED_DATA
# Caffe2's module path, for the fallback under the working directory
_CAFFE2_PACKAGE_DIR = os.path.join("caffe2", "python", "serialized_test")
_output_context = threading.local()


def _one_seeded_example(given_args, given_kwargs, f):
    return hy.seed(0)(hy.settings(max_examples=1)(hy.given(*given_args, **given_kwargs)(f)))


def given(*given_args, **given_kwargs):
    """Like ``hypothesis.given`` with one example from seed 0, run twice: once with the
    serialized comparison on (``self.should_serialize``), once with it off."""

    def wrapper(f):
        serialized_run = _one_seeded_example(given_args, given_kwargs, f)
        plain_run = _one_seeded_example(given_args, given_kwargs, f)

        def func(self, *args, **kwargs):
            self.should_serialize = True
            try:
                serialized_run(self, *args, **kwargs)
            finally:
                self.should_serialize = False
            plain_run(self, *args, **kwargs)

        func.__name__ = f.__name__
        func.__qualname__ = getattr(f, "__qualname__", f.__name__)
        func.__doc__ = f.__doc__
        func.__module__ = f.__module__
        return func

    return wrapper


def _getGradientOrNone(op_proto):
    """The gradient ops of ``op_proto`` (each output's gradient ``<output>_grad``), or an
    empty list when it has none."""
    try:
        grad_ops, _ = gradient_checker.getGradientForOp(op_proto)
    except Exception:
        return []
    return grad_ops


def _transformList(values):
    """A 1-D object array holding each of ``values`` (arrays of any shapes)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _prepare_dir(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def _parse_op(data):
    op = caffe2_pb2.OperatorDef()
    op.ParseFromString(data)
    return op


def _sorted_args(op):
    copy = caffe2_pb2.OperatorDef()
    copy.CopyFrom(op)
    copy.arg.sort(key=lambda arg: arg.name)
    return copy


class SerializedTestCase(hu.HypothesisTestCase):
    """A ``HypothesisTestCase`` whose reference checks also compare with recorded outputs."""

    should_serialize = False

    def get_output_dir(self):
        base = getattr(_output_context, "output_dir", DATA_DIR)
        output_dir = os.path.join(base, operator_test_type)
        if os.path.exists(output_dir):
            return output_dir
        # Caffe2 looked under the working directory next
        fallback = os.path.join(os.getcwd(), _CAFFE2_PACKAGE_DIR, DATA_SUFFIX, operator_test_type)
        return fallback if os.path.exists(fallback) else output_dir

    def get_output_filename(self):
        """``<test file name without extension>.<test method>``."""
        test_file = os.path.basename(inspect.getfile(self.__class__)).split(".")[0]
        return test_file + "." + self.id().split(".")[-1]

    def serialize_test(self, inputs, outputs, grad_ops, op, device_option):
        """Writes ``<output dir>/<test name>.zip`` with the op, its gradient ops, the inputs,
        the outputs and the device type."""
        output_dir = self.get_output_dir()
        os.makedirs(output_dir, exist_ok=True)
        test_name = self.get_output_filename()
        with tempfile.TemporaryDirectory() as work:
            inout = os.path.join(work, "inout")
            np.savez_compressed(
                inout,
                inputs=_transformList(inputs),
                outputs=_transformList(outputs),
                device_type=int(device_option.device_type),
            )
            with zipfile.ZipFile(os.path.join(output_dir, test_name + ".zip"), "w") as z:
                z.writestr("op.pb", op.SerializeToString())
                z.write(inout + ".npz", "inout.npz")
                for i, grad in enumerate(grad_ops):
                    z.writestr(f"grad_{i}.pb", grad.SerializeToString())

    def compare_test(self, inputs, outputs, grad_ops, atol=1e-7, rtol=1e-7):
        """Compares ``outputs`` and ``grad_ops`` with the recorded ones (re-running the
        recorded op on the recorded inputs where ``inputs`` differ from them)."""
        path = os.path.join(self.get_output_dir(), self.get_output_filename() + ".zip")
        with zipfile.ZipFile(path) as z:
            files = {name: z.read(name) for name in z.namelist()}
        with tempfile.TemporaryDirectory() as work:
            inout = os.path.join(work, "inout.npz")
            with open(inout, "wb") as f:
                f.write(files["inout.npz"])
            with np.load(inout, encoding="bytes", allow_pickle=True) as loaded:
                loaded_inputs = loaded["inputs"].tolist()
                loaded_outputs = loaded["outputs"].tolist()
                device_type = int(loaded["device_type"])

        same_inputs = all(np.array_equal(x, y) for x, y in zip(inputs, loaded_inputs, strict=False))
        if not same_inputs:
            recorded_op = _parse_op(files["op.pb"])
            device_option = caffe2_pb2.DeviceOption(device_type=device_type)
            outputs = hu.runOpOnInput(device_option, recorded_op, loaded_inputs)
            grad_ops = _getGradientOrNone(recorded_op)

        for x, y in zip(outputs, loaded_outputs, strict=False):
            np.testing.assert_allclose(x, y, atol=atol, rtol=rtol)

        for i, grad_op in enumerate(grad_ops):
            name = f"grad_{i}.pb"
            if name not in files:
                raise FileNotFoundError(
                    "%s has no %s: the recorded op had %d gradient ops, this one has %d"
                    % (path, name, sum(n.startswith("grad_") for n in files), len(grad_ops))
                )
            self._assertSameOps(_parse_op(files[name]), grad_op)

    def _assertSameOps(self, op1, op2):
        self.assertEqual(_sorted_args(op1), _sorted_args(op2))

    def assertSerializedOperatorChecks(
        self, inputs, outputs, gradient_operator, op, device_option, atol=1e-7, rtol=1e-7
    ):
        """In the serialized run of a :func:`given` test: records (when generating) or
        compares with the record."""
        if not self.should_serialize:
            return
        if getattr(_output_context, "should_generate_output", False):
            self.serialize_test(inputs, outputs, gradient_operator, op, device_option)
            if not getattr(_output_context, "disable_gen_coverage", False):
                # Caffe2 wrote the report into its package; ferrocaffe beside the records
                coverage.gen_serialized_test_coverage(
                    self.get_output_dir(), os.path.dirname(self.get_output_dir())
                )
        else:
            self.compare_test(inputs, outputs, gradient_operator, atol, rtol)

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
        outs = super().assertReferenceChecks(
            device_option,
            op,
            inputs,
            reference,
            input_device_options,
            threshold,
            output_to_grad,
            grad_reference,
            atol,
            outputs_to_check,
            ensure_outputs_are_inferred,
        )
        if not getattr(_output_context, "disable_serialized_check", False):
            self.assertSerializedOperatorChecks(
                inputs,
                outs,
                _getGradientOrNone(op),
                op,
                device_option,
                threshold if atol is None else atol,
                threshold,
            )
        return outs

    @contextmanager
    def set_disable_serialized_check(self, val: bool):
        previous = getattr(_output_context, "disable_serialized_check", False)
        _output_context.disable_serialized_check = val
        try:
            yield
        finally:
            _output_context.disable_serialized_check = previous


def testWithArgs():
    """``unittest.main()`` after reading Caffe2's options: ``-G`` (generate),
    ``-O DIR`` (output dir), ``-D`` (no serialized check), ``-C`` (no coverage report)."""
    import argparse
    import unittest

    parser = argparse.ArgumentParser()
    parser.add_argument("-G", "--generate-serialized", action="store_true", dest="generate")
    parser.add_argument("-O", "--output", default=DATA_DIR)
    parser.add_argument("-D", "--disable-serialized_check", action="store_true", dest="disable")
    parser.add_argument(
        "-C", "--disable-gen-coverage", action="store_true", dest="disable_coverage"
    )
    parser.add_argument("unittest_args", nargs="*")
    args = parser.parse_args()
    sys.argv[1:] = args.unittest_args
    _output_context.should_generate_output = args.generate
    _output_context.output_dir = args.output
    _output_context.disable_serialized_check = args.disable
    _output_context.disable_gen_coverage = args.disable_coverage
    unittest.main()
