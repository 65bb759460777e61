"""Caffe2's ``optimizer_test_util``: mixins that train a tiny model with an optimizer.

A test class mixes :class:`OptimizerTestBase` (and, for optimizers with a learning-rate blob,
:class:`LRModificationTestBase`) into a ``TestCase`` and defines ``build_optimizer(model,
**kwargs)`` (returning the optimizer that ``optimizer.build_*`` returned) and
``check_optimizer(optimizer)`` (assertions on its auxiliary parameters after training).

The model is a linear regression ``y = x . w + b`` over five binary features whose true
weights are ``[2, 6, 5, 0, 1]``: dense tests learn them with an FC layer (2000 steps, one
random example each), the sparse test with a ``Gather`` of the active features' weights, so
that the gradient is a ``GradientSlice``.
"""

import unittest

import numpy as np

from ferrocaffe import brew, cnn, core, optimizer, workspace
from ferrocaffe.model_helper import ModelHelper
from ferrocaffe.modeling.initializers import Initializer, PseudoFP16Initializer

__all__ = ["OptimizerTestBase", "LRModificationTestBase"]

_TRUE_WEIGHTS = (2, 6, 5, 0, 1)
_EXAMPLES = 20
_STEPS = 2000
# Each sparse feature is listed this many times, so an index can repeat within a slice.
_DUPLICATION = 2


def _true_weights():
    return np.array(_TRUE_WEIGHTS, dtype=np.float32)


def _train(net_name, batches):
    """Feeds each (name -> array) dict of ``batches`` and runs the net after it."""
    feed, run = workspace.FeedBlob, workspace.RunNet
    for batch in batches:
        for name, value in batch.items():
            feed(name, value)
        run(net_name)


class OptimizerTestBase:
    """Dense, GPU-dense and sparse training checks (a mixin, not a TestCase)."""

    def _createDense(self, dtype=core.DataType.FLOAT):
        weights = _true_weights()
        np.random.seed(123)
        half = dtype == core.DataType.FLOAT16
        data = np.random.randint(2, size=(_EXAMPLES, weights.size)).astype(
            np.float16 if half else np.float32
        )
        label = np.dot(data, weights)[:, np.newaxis]
        init = PseudoFP16Initializer if half else Initializer

        model = ModelHelper(name="test", arg_scope={"order": "NCHW"})
        out = brew.fc(
            model,
            "data",
            "fc",
            weights.size,
            1,
            ("ConstantFill", {}),
            ("ConstantFill", {}),
            axis=0,
            WeightInitializer=init,
            BiasInitializer=init,
        )
        if half:
            out = model.HalfToFloat(out, out + "_fp32")
        distance = model.SquaredL2Distance([out, "label"])
        loss = model.AveragedLoss(distance, "avg_loss")
        grads = model.AddGradientOperators([loss])
        self.assertIsInstance(grads["fc_w"], core.BlobReference)
        return model, weights, data, label

    def testDense(self):
        model, weights, data, label = self._createDense()
        opt = self.build_optimizer(model)
        workspace.FeedBlob("data", data[0])
        workspace.FeedBlob("label", label[0])
        workspace.RunNetOnce(model.param_init_net)
        workspace.CreateNet(model.net, True)
        picks = (np.random.randint(data.shape[0]) for _ in range(_STEPS))
        _train(model.net.Proto().name, ({"data": data[i], "label": label[i]} for i in picks))
        np.testing.assert_allclose(weights[np.newaxis, :], workspace.FetchBlob("fc_w"), atol=1e-2)
        self.check_optimizer(opt)

    @unittest.skipIf(not workspace.has_gpu_support, "No gpu support")
    def testGPUDense(self, dtype=core.DataType.FLOAT):
        with core.DeviceScope(core.DeviceOption(workspace.GpuDeviceType, 0)):
            model, _weights, data, label = self._createDense(dtype)
            if dtype == core.DataType.FLOAT16:
                host_fc = model.HalfToFloat("fc", "fc_fp32_for_host")
                model.CopyGPUToCPU(host_fc, "fc_cpu")
            else:
                model.CopyGPUToCPU("fc", "fc_cpu")
            workspace.FeedBlob("data", data[0])
            workspace.FeedBlob("label", label[0])
        # A CPU layer after the device ones; the optimizer is built in the default scope.
        brew.fc(model, "fc_cpu", "fc2", dim_in=1, dim_out=10, axis=0)
        self.build_optimizer(model)
        if self._skip_gpu:
            return
        workspace.RunNetOnce(model.param_init_net)
        workspace.CreateNet(model.net, True)
        workspace.RunNet(model.net.Proto().name)

    def testSparse(self):
        weights = _true_weights()
        np.random.seed(123)
        data = np.random.randint(2, size=(_EXAMPLES, weights.size * _DUPLICATION)).astype(
            np.float32
        )
        label = np.dot(data, np.repeat(weights, _DUPLICATION))

        model = cnn.CNNModelHelper("NCHW", name="test")
        w = model.param_init_net.ConstantFill([], "w", shape=[weights.size], value=0.0)
        model.params.append(w)
        picked = model.net.Gather([w, "indices"], "gather")
        out = model.ReduceFrontSum(picked, "sum")
        distance = model.SquaredL2Distance([out, "label"])
        loss = model.AveragedLoss(distance, "avg_loss")
        grads = model.AddGradientOperators([loss])
        self.assertIsInstance(grads["w"], core.GradientSlice)
        opt = self.build_optimizer(model)

        workspace.CreateBlob("indices")
        workspace.CreateBlob("label")
        feature_of = np.repeat(np.arange(weights.size), _DUPLICATION)
        for index_type in (np.int32, np.int64):
            workspace.RunNetOnce(model.param_init_net)
            workspace.CreateNet(model.net, True)
            batches = []
            for _ in range(_STEPS):
                k = np.random.randint(data.shape[0])
                active = feature_of[data[k] == 1]
                if active.size == 0:
                    continue
                batches.append(
                    {
                        "indices": active.reshape((active.size,)).astype(index_type),
                        "label": np.array(label[k]).astype(np.float32),
                    }
                )
            _train(model.net.Proto().name, batches)
            np.testing.assert_allclose(weights, workspace.FetchBlob("w"), atol=1e-2)
        self.check_optimizer(opt)


class LRModificationTestBase:
    """Gradient clipping by global norm and learning-rate injection (a mixin)."""

    def _gradient_ratio_reference(self, model, params, max_gradient_norm):
        squares = 0.0
        for param in params:
            grad = model.param_to_grad[param]
            if isinstance(grad, core.GradientSlice):
                grad = grad.values
            squares += np.linalg.norm(workspace.FetchBlob(grad)) ** 2
        global_norm = np.sqrt(squares)
        return max_gradient_norm / np.maximum(max_gradient_norm, global_norm)

    def _run_once(self, model, data, label):
        workspace.FeedBlob("data", data[0])
        workspace.FeedBlob("label", label[0])
        workspace.RunNetOnce(model.param_init_net)
        workspace.CreateNet(model.net, True)

    def test_global_norm_based_gradient_clipping(self):
        max_gradient_norm = 1.0
        model, _weights, data, label = self._createDense()
        opt = self.build_optimizer(model, max_gradient_norm=max_gradient_norm)
        params = [
            p
            for p in model.GetParams(top_scope=True)
            if p in model.param_to_grad
            and not isinstance(model.param_to_grad[p], core.GradientSlice)
        ]
        self._run_once(model, data, label)
        self.assertIsNotNone(opt._lr_multiplier)

        k = np.random.randint(data.shape[0])
        workspace.FeedBlob("data", data[k])
        workspace.FeedBlob("label", label[k])
        workspace.RunNet(model.net.Proto().name)

        reference = self._gradient_ratio_reference(model, params, max_gradient_norm)
        norm_ratio = workspace.FetchBlob("norm_clipped_grad_update/norm_ratio")
        np.testing.assert_almost_equal(norm_ratio, reference)
        self.assertTrue(reference < 1.0, "Bad test, gradient not being scaled.")

    def test_lr_injection(self):
        model, _weights, data, label = self._createDense()
        opt = self.build_optimizer(model, max_gradient_norm=1, allow_lr_injection=True)
        self._run_once(model, data, label)

        self.assertIsNotNone(opt._lr_multiplier)
        self.assertEqual(optimizer.get_lr_injection(), 1)
        optimizer.set_lr_injection(0)
        self.assertEqual(optimizer.get_lr_injection(), 0)

        # The multiplier is norm_ratio * injection: zero now.
        workspace.RunNet(model.net.Proto().name)
        self.assertEqual(workspace.FetchBlob("lr_multiplier"), 0)
