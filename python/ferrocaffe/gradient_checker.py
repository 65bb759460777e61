"""Numerical gradient checks, with the API of Caffe2's ``gradient_checker`` module.

* ``GradientChecker(stepsize, threshold).CheckSimple(op, inputs, input_to_check,
  outputs_with_grads)`` checks one operator: the loss is half the sum of squares of the
  outputs listed in ``outputs_with_grads`` (so each output's gradient is the output itself),
  the analytic gradient comes from the op's registered gradient ops, the estimate from central
  differences. Returns ``(ok, analytic_grad, estimate)``.
* ``NetGradientChecker.Check(net, outputs_with_grad, input_values, input_to_check)`` checks a
  whole net: the loss is the sum of the (scalar or array) blobs in ``outputs_with_grad``, the
  analytic gradient comes from ``AddGradientOperators`` on a copy of the net. Raises
  ``AssertionError`` when they differ beyond ``threshold`` (relative and absolute); returns the
  mean and the largest difference.
* ``NetGradientChecker.CompareNets(nets, outputs, outputs_with_grad_ids, inputs_with_grads)``
  checks that several nets compute the same outputs and gradients.
"""

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = ["GradientChecker", "NetGradientChecker", "getGradientForOp"]


def getGradientForOp(op):
    """The gradient ops of ``op`` and its input gradients, with ``<output>_grad`` as the
    gradient of every output."""
    return core.GradientRegistry.GetGradientForOp(op, [str(o) + "_grad" for o in op.output])


def _dense(grad, like_blob):
    """The gradient blob's value; a GradientSlice is scattered into a dense array shaped like
    ``like_blob``."""
    if isinstance(grad, core.GradientSlice):
        dense = "gradient_checker_dense_grad"
        workspace.RunOperatorOnce(
            core.CreateOperator("SparseToDense", [grad.indices, grad.values, like_blob], [dense])
        )
        return workspace.FetchBlob(dense)
    return workspace.FetchBlob(str(grad))


def _run_with_gradients(net, outputs, outputs_with_grad, input_values, inputs_with_grads):
    """Runs a copy of ``net`` with gradient ops for ``outputs_with_grad``; returns the values of
    ``outputs``, the gradients of ``inputs_with_grads`` and the copy."""
    grad_net = net.Clone(net.Name() + "_copy")
    grad_map = grad_net.AddGradientOperators(outputs_with_grad)
    for name, value in (input_values or {}).items():
        workspace.FeedBlob(name, value)
    for name in inputs_with_grads:
        if name not in grad_map:
            raise ValueError(f"{name} has no gradient (not reached from {outputs_with_grad})")
    workspace.RunNetOnce(grad_net)
    results = [(o, workspace.FetchBlob(o)) for o in outputs]
    grads = {name: _dense(grad_map[name], name) for name in inputs_with_grads}
    return results, grads, grad_net


def _assert_close(value1, value2, threshold, err_msg=""):
    np.testing.assert_allclose(value1, value2, atol=threshold, rtol=threshold, err_msg=err_msg)
    delta = np.abs(np.asarray(value1, np.float64) - np.asarray(value2, np.float64)).ravel()
    if delta.size == 0:
        return 0.0, 0.0
    return float(delta.mean()), float(delta.max())


class NetGradientChecker:
    """Gradient checks of whole nets."""

    @staticmethod
    def CompareNets(
        nets,
        outputs,
        outputs_with_grad_ids,
        inputs_with_grads,
        input_values=None,
        threshold=0.0000001,
        print_net_images=False,
    ):
        """Runs each net (``outputs[i]`` are net i's outputs, ``outputs_with_grad_ids`` index
        into them) and asserts that all give the same outputs and input gradients."""
        assert len(nets) == len(outputs), "one list of outputs per net"
        runs = []
        for net, outs in zip(nets, outputs, strict=True):
            with_grad = [outs[i] for i in outputs_with_grad_ids]
            results, grads, _ = _run_with_gradients(
                net, outs, with_grad, input_values, inputs_with_grads
            )
            runs.append((net, results, grads))
        first_net, first_results, first_grads = runs[0]
        for net, results, grads in runs[1:]:
            for (name0, v0), (name1, v1) in zip(first_results, results, strict=True):
                _assert_close(
                    v0,
                    v1,
                    threshold,
                    f"output {name0} of {first_net.Name()} differs from {name1} of {net.Name()}",
                )
            for name in inputs_with_grads:
                _assert_close(
                    first_grads[name],
                    grads[name],
                    threshold,
                    f"gradient of {name} differs between {first_net.Name()} and {net.Name()}",
                )

    @staticmethod
    def Check(
        net,
        outputs_with_grad,
        input_values,
        input_to_check,
        step_size=0.0001,
        threshold=0.05,
        print_net=True,
    ):
        """Compares the gradient of sum(outputs_with_grad) with respect to ``input_to_check``
        with central differences of step ``step_size``."""
        _, grads, full_net = _run_with_gradients(
            net, [], outputs_with_grad, input_values, [input_to_check]
        )
        analytic = grads[input_to_check]
        base = np.array(input_values[input_to_check], copy=True)

        def loss_at(value):
            workspace.FeedBlob(input_to_check, value)
            workspace.RunNetOnce(full_net)
            return sum(
                np.asarray(workspace.FetchBlob(o), np.float64).sum() for o in outputs_with_grad
            )

        estimate = np.zeros(base.shape, np.float64)
        for k in range(base.size):
            plus = base.copy()
            plus.flat[k] += step_size
            minus = base.copy()
            minus.flat[k] -= step_size
            estimate.flat[k] = (loss_at(plus) - loss_at(minus)) / (2 * step_size)
        workspace.FeedBlob(input_to_check, base)
        msg = f"Error in gradient check for net_copy {net.Proto().name} (input {input_to_check})"
        if print_net:
            msg += f": {net.Proto()}"
        return _assert_close(analytic, estimate, threshold, msg)


class GradientChecker:
    """Gradient checks of single operators (see the module docs)."""

    def __init__(
        self,
        stepsize,
        threshold,
        device_option=None,
        workspace_name="gradient_check",
        input_device_options=None,
    ):
        self._stepsize = stepsize
        self._threshold = threshold
        self._device_option = device_option or caffe2_pb2.DeviceOption()
        self._workspace_name = workspace_name
        self._input_device_options = input_device_options or {}

    def GetLossAndGrad(
        self, op, grad_ops, inputs, input_names, input_to_check, grad_name, outputs_with_grads
    ):
        """Runs ``op`` on ``inputs``: the loss (half the sum of squares of the checked outputs)
        and the gradient of input ``input_to_check`` from ``grad_ops``."""
        for name, value in zip(input_names, inputs, strict=True):
            workspace.FeedBlob(
                name, value, self._input_device_options.get(name, self._device_option)
            )
        workspace.RunOperatorOnce(op)
        loss = 0.0
        for idx in outputs_with_grads:
            name = op.output[idx]
            value = workspace.FetchBlob(name)
            loss += float((np.asarray(value, np.float64) ** 2).sum())
            workspace.FeedBlob(name + "_grad", value, self._device_option)
        loss /= 2.0
        workspace.RunOperatorsOnce(grad_ops)
        return loss, _dense(grad_name, input_names[input_to_check])

    def CheckSimple(
        self,
        op,
        inputs,
        input_to_check,
        outputs_with_grads,
        grad_ops=None,
        input_device_options=None,
        ensure_outputs_are_inferred=False,
    ):
        """Checks the gradient of input ``input_to_check`` of ``op``; returns
        ``(ok, analytic_grad, estimate)`` and prints the differing entries when not ok."""
        previous = workspace.CurrentWorkspace()
        if self._workspace_name != previous:
            workspace.SwitchWorkspace(self._workspace_name, True)
        if input_device_options:
            self._input_device_options = dict(input_device_options)
        op.device_option.CopyFrom(self._device_option)
        if grad_ops is None:
            grad_ops, g_input = getGradientForOp(op)
        else:
            _, g_input = getGradientForOp(op)
        grad_name = g_input[input_to_check]
        inputs = [np.array(x, copy=True) for x in inputs]
        try:
            _, grad = self.GetLossAndGrad(
                op, grad_ops, inputs, op.input, input_to_check, grad_name, outputs_with_grads
            )
            x = inputs[input_to_check]
            estimate = np.zeros_like(x, dtype=np.float64)
            if estimate.shape != np.shape(grad):
                raise AssertionError(
                    f"gradient shape {np.shape(grad)} differs from the input's {estimate.shape}"
                )
            for k in range(x.size):
                x.flat[k] += self._stepsize
                pos, _ = self.GetLossAndGrad(
                    op,
                    grad_ops,
                    inputs,
                    op.input,
                    input_to_check,
                    grad_name,
                    outputs_with_grads,
                )
                x.flat[k] -= 2 * self._stepsize
                neg, _ = self.GetLossAndGrad(
                    op,
                    grad_ops,
                    inputs,
                    op.input,
                    input_to_check,
                    grad_name,
                    outputs_with_grads,
                )
                x.flat[k] += self._stepsize
                estimate.flat[k] = (pos - neg) / (2 * self._stepsize)
            bad = ~np.isclose(grad, estimate, atol=self._threshold, rtol=self._threshold)
            ok = not np.any(bad)
            if not ok:
                idx = np.flatnonzero(bad)
                print("Failed. [idx, grad, grad_estimate] are:")
                print(np.vstack([idx, np.ravel(grad)[idx], estimate.flat[idx]]).T)
        finally:
            if self._workspace_name != previous:
                workspace.ResetWorkspace()
                workspace.SwitchWorkspace(previous)
        return ok, grad, estimate.astype(np.asarray(grad).dtype)
