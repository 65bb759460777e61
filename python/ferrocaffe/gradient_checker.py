"""Caffe2's ``gradient_checker``: compare the gradients that the gradient ops compute with
central-difference estimates.

* :class:`GradientChecker` checks one operator. ``CheckSimple`` puts the loss
  ``0.5 * sum(y ** 2)`` over the chosen outputs on top of the op, feeds ``y`` as each output's
  gradient (so the analytic input gradient is what the gradient ops return), and estimates
  ``d loss / d x[i]`` as ``(loss(x[i] + h) - loss(x[i] - h)) / (2 h)``. It works in its own
  workspace (``workspace_name``), emptied afterwards.
* :class:`NetGradientChecker` checks a whole net (``Check``: the loss is the sum of the chosen
  outputs, the gradient comes from ``AddGradientOperators``) or compares the forward results
  and gradients of several nets that should agree (``CompareNets``).

Losses are accumulated in float64 from the (float32) outputs, and the denominator of each
difference is the step that was really applied after rounding the perturbed input to its dtype.
Sparse gradients (``GradientSlice``) are densified, rows with repeated indices summed, before
they are compared.

Like Caffe2, ``CheckSimple`` estimates only the first and the last three elements of the
checked input unless ``CAFFE2_FULL_GRAD_CHECK=1`` is set; ``GradientChecker(...,
full_check=True)`` asks for every element whatever the environment says.
"""

import os

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = ["GradientChecker", "NetGradientChecker", "getGradientForOp"]


def getGradientForOp(op):
    """The gradient ops of ``op`` and its input gradients, each output's gradient being named
    ``<output>_grad``."""
    return core.GradientRegistry.GetGradientForOp(op, [s + "_grad" for s in op.output])


def _half_sum_of_squares(arrays):
    return 0.5 * sum(float(np.sum(np.square(np.asarray(a, dtype=np.float64)))) for a in arrays)


def _densify(indices, values, like):
    """A dense gradient shaped like ``like`` from the rows ``values`` at ``indices`` (summed
    where an index repeats)."""
    dense = np.zeros(np.shape(like), dtype=np.float64)
    idx = np.asarray(indices).reshape(-1).astype(np.int64)
    vals = np.asarray(values, dtype=np.float64).reshape((idx.size,) + dense.shape[1:])
    if idx.size and (idx.min() < 0 or idx.max() >= dense.shape[0]):
        raise ValueError(
            "gradient slice index out of range: indices span [%d, %d], the input has %d rows"
            % (idx.min(), idx.max(), dense.shape[0])
        )
    np.add.at(dense, idx, vals)
    return dense.astype(np.asarray(like).dtype)


def _fetch_grad(grad_name, like):
    """The value of a gradient (a blob name or a GradientSlice), dense, as a numpy array."""
    if isinstance(grad_name, core.GradientSlice):
        return _densify(
            workspace.FetchBlob(str(grad_name.indices)),
            workspace.FetchBlob(str(grad_name.values)),
            like,
        )
    return np.array(workspace.FetchBlob(str(grad_name)))


def _perturbed(x, index, delta):
    """A copy of ``x`` with element ``index`` moved by ``delta`` (rounded to x's dtype), and
    the move actually applied."""
    y = np.array(x, copy=True)
    y.flat[index] = y.flat[index] + delta
    return y, float(y.flat[index]) - float(np.asarray(x).flat[index])


def _central_difference(loss_plus, loss_minus, step_plus, step_minus):
    """``(loss_plus - loss_minus) / (step_plus - step_minus)``; 0 where rounding to the
    input's dtype left the input unchanged (an integer input moved by less than 0.5), as the
    loss cannot have changed then (Caffe2 estimated 0 for such inputs too)."""
    span = step_plus - step_minus
    if span == 0:
        return 0.0
    return (loss_plus - loss_minus) / span


def _full_check_requested(flag):
    if flag is not None:
        return bool(flag)
    return "1" in (os.getenv("CAFFE2_FULL_GRAD_CHECK"), os.getenv("FERROCAFFE_FULL_GRAD_CHECK"))


class GradientChecker:
    """Checks an operator's gradient against central differences.

    ``stepsize``: the step ``h``; ``threshold``: both the absolute and the relative tolerance
    (``np.isclose(grad, estimate, atol=threshold, rtol=threshold)``); ``device_option`` is put
    on the op; ``input_device_options`` maps input names to the DeviceOption they are fed
    with; ``full_check`` (ferrocaffe's addition) estimates every element instead of Caffe2's
    first and last three.
    """

    def __init__(
        self,
        stepsize,
        threshold,
        device_option=None,
        workspace_name="gradient_check",
        input_device_options=None,
        full_check=None,
    ):
        self._stepsize = stepsize
        self._threshold = threshold
        self._device_option = device_option or caffe2_pb2.DeviceOption()
        self._workspace_name = workspace_name
        self._input_device_options = dict(input_device_options or {})
        self._full_check = full_check

    def _feed_inputs(self, input_names, inputs, device_options):
        for name, value in zip(input_names, inputs, strict=False):
            workspace.FeedBlob(name, value, device_options.get(name, self._device_option))

    def _forward_loss(self, op, outputs_with_grads):
        workspace.RunOperatorOnce(op)
        outs = [workspace.FetchBlob(op.output[i]) for i in outputs_with_grads]
        return _half_sum_of_squares(outs), outs

    def GetLossAndGrad(
        self, op, grad_ops, inputs, input_names, input_to_check, grad_name, outputs_with_grads
    ):
        """Feeds ``inputs``, runs ``op``, feeds each output ``y`` in ``outputs_with_grads`` as
        its own gradient ``<y>_grad``, runs ``grad_ops`` and returns ``(loss, gradient of
        input input_to_check)`` with ``loss = 0.5 * sum(y ** 2)``."""
        self._feed_inputs(input_names, inputs, self._input_device_options)
        loss, outs = self._forward_loss(op, outputs_with_grads)
        for i, value in zip(outputs_with_grads, outs, strict=True):
            workspace.FeedBlob(op.output[i] + "_grad", value, self._device_option)
        workspace.RunOperatorsOnce(grad_ops)
        return loss, _fetch_grad(grad_name, inputs[input_to_check])

    def _check_inferred(self, op, grad_ops, grads, inputs):
        """Without static shape inference, checks what it would have guaranteed: every
        gradient op output exists after the run and every dense input gradient has its
        input's shape and dtype."""
        for gop in grad_ops:
            for out in gop.output:
                if not workspace.HasBlob(out):
                    raise AssertionError(
                        "gradient op %s of %s did not produce %s" % (gop.type, op.type, out)
                    )
        for i, g in enumerate(grads):
            if g is None or isinstance(g, core.GradientSlice):
                continue
            value = workspace.FetchBlob(str(g))
            want = np.asarray(inputs[i])
            if value.shape != want.shape or value.dtype != want.dtype:
                raise AssertionError(
                    "gradient %s of input %s: shape %s dtype %s, the input has %s %s"
                    % (g, op.input[i], value.shape, value.dtype, want.shape, want.dtype)
                )

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
        """Checks the gradient of ``op`` with respect to input number ``input_to_check``.

        ``inputs``: numpy arrays, one per input of ``op``; ``outputs_with_grads``: indices of
        the outputs that make up the loss ``0.5 * sum(y ** 2)``; ``grad_ops``: the gradient
        ops (default: from the gradient registry, each output's gradient named
        ``<output>_grad``; an op type the registry has no gradient for can be checked by giving
        ``grad_ops`` that write ``<input>_grad``).

        Returns ``(ok, grad, grad_estimated)``; prints the failing elements when not ok.
        """
        old_ws = workspace.CurrentWorkspace()
        switched = self._workspace_name != old_ws
        if switched:
            workspace.SwitchWorkspace(self._workspace_name, True)
        try:
            return self._check_simple(
                op,
                inputs,
                input_to_check,
                outputs_with_grads,
                grad_ops,
                input_device_options,
                ensure_outputs_are_inferred,
            )
        finally:
            if switched:
                workspace.ResetWorkspace()
                workspace.SwitchWorkspace(old_ws)

    def _check_simple(
        self,
        op,
        inputs,
        input_to_check,
        outputs_with_grads,
        grad_ops,
        input_device_options,
        ensure_outputs_are_inferred,
    ):
        op.device_option.CopyFrom(self._device_option)
        # As Caffe2: the arrays feed the first inputs; the others must already be in the
        # checker's workspace (running the op fails otherwise).
        if len(inputs) > len(op.input):
            raise ValueError(
                "CheckSimple: %s has %d inputs, %d arrays were given"
                % (op.type, len(op.input), len(inputs))
            )
        outputs_with_grads = list(outputs_with_grads)
        inputs = [np.asarray(x) for x in inputs]
        try:
            registry_ops, g_input = getGradientForOp(op)
        except Exception:
            if grad_ops is None:
                raise
            # An op type without a gradient maker, checked with the given gradient ops: the
            # gradient of input x is the blob x_grad they produce.
            produced = {out for g in grad_ops for out in g.output}
            g_input = [x + "_grad" if x + "_grad" in produced else None for x in op.input]
        if grad_ops is None:
            grad_ops = registry_ops
        grad_name = g_input[input_to_check] if input_to_check < len(g_input) else None
        if grad_name is None:
            raise ValueError(
                "CheckSimple: input %d (%s) of %s has no gradient"
                % (input_to_check, op.input[input_to_check], op.type)
            )
        device_options = dict(input_device_options or core.InferOpBlobDevicesAsDict(op)[0])
        device_options.update(self._input_device_options)

        x = inputs[input_to_check]
        _, grad = self.GetLossAndGrad(
            op, grad_ops, inputs, op.input, input_to_check, grad_name, outputs_with_grads
        )
        if grad.shape != x.shape:
            raise Exception(
                "Mismatched gradient shapes: estimated (%s), grad (%s)" % (x.shape, grad.shape)
            )
        if ensure_outputs_are_inferred:
            self._check_inferred(op, grad_ops, g_input, inputs)

        grad_estimate = np.zeros(x.shape, dtype=np.float64)
        full = _full_check_requested(self._full_check)
        n = x.size
        for i in range(n):
            if not full and 3 <= i < n - 3:
                grad_estimate.flat[i] = grad.flat[i]
                continue
            losses = []
            steps = []
            for delta in (self._stepsize, -self._stepsize):
                moved, step = _perturbed(x, i, delta)
                inputs[input_to_check] = moved
                self._feed_inputs(op.input, inputs, device_options)
                losses.append(self._forward_loss(op, outputs_with_grads)[0])
                steps.append(step)
            inputs[input_to_check] = x
            grad_estimate.flat[i] = _central_difference(losses[0], losses[1], steps[0], steps[1])
        grad_estimate = grad_estimate.astype(x.dtype if x.dtype.kind == "f" else np.float64)

        fail = ~np.isclose(grad, grad_estimate, atol=self._threshold, rtol=self._threshold)
        ok = not np.any(fail)
        if not ok:
            idx = np.flatnonzero(fail)
            print("Failed. [idx, grad, grad_estimate] are:")
            print(np.vstack([idx, grad.flat[idx], grad_estimate.flat[idx]]).T)
        return ok, grad, grad_estimate


def _assert_close(value1, value2, threshold, err_msg=""):
    np.testing.assert_allclose(value1, value2, atol=threshold, rtol=threshold, err_msg=err_msg)
    delta = np.abs(np.asarray(value1, np.float64) - np.asarray(value2, np.float64)).flatten()
    return np.mean(delta), np.max(delta)


def _net_with_gradients(net, outputs_with_grad):
    grad_net = net.Clone(net.Name() + "_copy")
    grad_map = grad_net.AddGradientOperators(list(outputs_with_grad))
    return grad_net, grad_map


def _get_grad(net, outputs, outputs_with_grad, input_values, inputs_with_grads):
    """Runs ``net`` plus its gradient ops once; returns the forward values of ``outputs``, the
    (dense) gradients of ``inputs_with_grads`` and the net that was run."""
    grad_net, grad_map = _net_with_gradients(net, outputs_with_grad)
    for name, value in (input_values or {}).items():
        workspace.FeedBlob(name, value)
    for name in inputs_with_grads:
        if name not in grad_map or grad_map[name] is None:
            raise AssertionError("%s has no gradient, cannot check net gradient." % name)
        if not workspace.HasBlob(str(name)):
            raise AssertionError("%s is not in the workspace" % name)
    workspace.RunNetOnce(grad_net)
    forward = [(out, np.array(workspace.FetchBlob(str(out)))) for out in outputs]
    grads = {
        name: _fetch_grad(grad_map[name], workspace.FetchBlob(str(name)))
        for name in inputs_with_grads
    }
    return forward, grads, grad_net


class NetGradientChecker:
    """Gradient checks of whole nets (run in the current workspace)."""

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
        """Runs every net of ``nets`` with its gradient ops (the gradients of the outputs
        ``outputs[k][i]`` for ``i`` in ``outputs_with_grad_ids`` seeded with ones) and asserts
        that all nets give the first net's forward ``outputs`` and the first net's gradients
        of ``inputs_with_grads``. ``print_net_images`` prints the nets in text form (there is
        no image renderer)."""
        results = []
        for net, net_outputs in zip(nets, outputs, strict=True):
            with_grad = [net_outputs[i] for i in outputs_with_grad_ids]
            results.append(_get_grad(net, net_outputs, with_grad, input_values, inputs_with_grads))
        if print_net_images:
            for _, _, grad_net in results:
                print(grad_net.Proto())
        first_forward, first_grads, _ = results[0]
        for forward, grads, _ in results[1:]:
            assert len(forward) == len(first_forward)
            for idx, ((blob1, value1), (blob2, value2)) in enumerate(
                zip(first_forward, forward, strict=True)
            ):
                _assert_close(
                    value1,
                    value2,
                    threshold,
                    err_msg="Different forward pass results for output id %d. "
                    "Corresponding output blobs: %s and %s" % (idx, blob1, blob2),
                )
            assert set(grads) == set(first_grads)
            for blob, value in grads.items():
                _assert_close(
                    first_grads[blob],
                    value,
                    threshold,
                    err_msg="Different gradients for input %s" % blob,
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
        """Checks the gradient of ``sum(sum(o) for o in outputs_with_grad)`` with respect to
        the blob ``input_to_check`` (whose value is ``input_values[input_to_check]``) against
        central differences over every element. Blobs the net needs and ``input_values``
        does not give must already be in the workspace; ``input_values`` are fed again before
        every run, and the checked blob gets its original value back afterwards. Returns (mean, max) of the absolute differences; raises
        AssertionError when they exceed ``threshold`` (absolute and relative)."""
        _, grads, _ = _get_grad(net, [], outputs_with_grad, input_values, [input_to_check])
        analytic = grads[input_to_check]
        original = np.array(input_values[input_to_check])
        forward = net.Proto() if hasattr(net, "Proto") else net

        def loss_at(value):
            # every given value is fed again: the net may overwrite its inputs (in-place ops,
            # loop state)
            for name, given in input_values.items():
                workspace.FeedBlob(name, given)
            workspace.FeedBlob(input_to_check, value)
            workspace.RunNetOnce(forward)
            return sum(
                float(np.sum(np.asarray(workspace.FetchBlob(str(o)), dtype=np.float64)))
                for o in outputs_with_grad
            )

        estimate = np.zeros(original.shape, dtype=np.float64)
        try:
            for i in range(original.size):
                plus, step_plus = _perturbed(original, i, step_size)
                minus, step_minus = _perturbed(original, i, -step_size)
                estimate.flat[i] = _central_difference(
                    loss_at(plus), loss_at(minus), step_plus, step_minus
                )
        finally:
            workspace.FeedBlob(input_to_check, original)
        err_msg = "Error in gradient check for net_copy %s" % net.Name()
        if print_net:
            err_msg += ": %s" % (net.Proto(),)
        return _assert_close(analytic, estimate.astype(analytic.dtype), threshold, err_msg)
