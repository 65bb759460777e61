"""Caffe2's ``optimizer`` module: parameter-update operators for a model whose gradients exist.

    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=0.1, policy="step", stepsize=1, gamma=0.9)

``build_*`` creates one optimizer object and runs it for every parameter that has a gradient
(``model.GetOptimizationParamInfo()``), each under the device scope of the op that creates the
parameter. What every optimizer shares:

* an int64 iteration counter ``optimizer_iteration`` (ConstantFill + CreateMutex in the init
  net, ``AtomicIter`` in the net; ``utils.BuildUniqueMutexIter``);
* a ``LearningRate`` op per optimizer instance and device, writing
  ``<Class>_<instance>_lr_<device>`` (``SgdOptimizer_0_lr_cpu``, ``..._gpu0``) with
  ``base_lr`` negated (descent) and ``policy`` plus any extra keyword arguments of the
  optimizer (``stepsize``, ``gamma``, ...) as LearningRate arguments;
* per-parameter state in the init net, named after the parameter (``<param>_momentum``,
  ``<param>_squared_sum``, ``<param>_first_moment``, ...).

Dense gradients are blobs; sparse ones are ``core.GradientSlice(indices, values)`` and use the
sparse update ops (optionally after ``DeduplicateGradientSlices``).
"""

import copy
import logging
from collections import defaultdict, namedtuple

import numpy as np

from ferrocaffe import core, scope, utils
from ferrocaffe.modeling import parameter_info
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "AuxOptimizerParams",
    "Optimizer",
    "SgdOptimizer",
    "MultiPrecisionSgdOptimizer",
    "FP16SgdOptimizer",
    "WeightDecayBuilder",
    "AdagradOptimizer",
    "AdamOptimizer",
    "WngradOptimizer",
    "StormOptimizer",
    "AdadeltaOptimizer",
    "FtrlOptimizer",
    "GFtrlOptimizer",
    "DecayAdagradOptimizer",
    "YellowFinOptimizer",
    "RmsPropOptimizer",
    "build_sgd",
    "build_multi_precision_sgd",
    "build_fp16_sgd",
    "build_adagrad",
    "build_adam",
    "build_ftrl",
    "build_gftrl",
    "build_wngrad",
    "build_storm",
    "build_adadelta",
    "build_decay_adagrad",
    "build_yellowfin",
    "build_rms_prop",
    "add_weight_decay",
    "get_param_device",
    "get_lr_injection",
    "set_lr_injection",
    "reset_optimizer_instance_count",
]

_LEARNING_RATE_INJECTION = "lr_injection"

AuxOptimizerParams = namedtuple("AuxOptimizerParams", ["local", "shared"])

# Instances created so far per optimizer class: part of the learning-rate blob names.
_optimizer_instance_count = defaultdict(int)

FP16_ENGINES = ["SIMD_Q_FP16", "SIMD_Q_STOC_FP16", "SIMD_Q_STOC_MKL_FP16"]

logger = logging.getLogger(__name__)


def reset_optimizer_instance_count():
    """Forget how many optimizers were created (blob names start from ``_0`` again)."""
    _optimizer_instance_count.clear()


# Ops whose output has the shape of their first input, for the init-net shape lookup.
_SHAPE_PRESERVING = frozenset(("FloatToHalf", "HalfToFloat", "Copy", "Cast", "Alias"))


def _init_net_shapes(init_net):
    """Shapes of the blobs that an init net's fill ops create, read from their arguments.

    Caffe2 asked its C++ shape inference here (``workspace.InferShapesAndTypes``); for init
    nets, which hold fill ops, the ``shape`` / ``extra_shape`` / ``input_as_shape`` arguments
    give the same answer. Blobs whose shape cannot be read are absent."""
    shapes = {}
    for op in init_net.Proto().op:
        if not op.output:
            continue
        args = {a.name: a for a in op.arg}
        shape = None
        if op.type in _SHAPE_PRESERVING and op.input:
            shape = shapes.get(op.input[0])
        elif op.type.endswith("Fill"):
            as_shape = "input_as_shape" in args and args["input_as_shape"].i
            if "shape" in args and not as_shape:
                shape = list(args["shape"].ints)
            elif op.input and not as_shape:
                shape = shapes.get(op.input[0])
                if shape is not None:
                    shape = list(shape)
            if shape is not None and "extra_shape" in args:
                shape = shape + list(args["extra_shape"].ints)
        if shape is not None:
            shapes[op.output[0]] = shape
    return shapes


class Optimizer:
    """Base class: ``optimizer(net, param_init_net, param_info)`` (or ``(net, init_net, param,
    grad)``) adds the update ops of one parameter. Subclasses implement ``_run``."""

    def __init__(self):
        self._aux_params = AuxOptimizerParams(local=[], shared=[])
        self._instance_num = _optimizer_instance_count[self.__class__.__name__]
        _optimizer_instance_count[self.__class__.__name__] += 1
        self._lr_multiplier = None
        self._local_lr_multiplier = None
        self._local_lr_multiplier_on_gpu = False
        self._use_dedicated_lr_iteration_counter = False

    def __call__(self, net, param_init_net, param, grad=None):
        if grad is None:
            assert isinstance(param, parameter_info.ParameterInfo), (
                f"Expected parameter to be of type ParameterInfo, got {param}"
            )
            assert param.grad is not None
        else:
            if isinstance(param, str):
                param = core.BlobReference(param)
            param = parameter_info.ParameterInfo(param_id=None, param=param, grad=grad)
        self._run(net, param_init_net, param)

    def _run(self, net, param_init_net, param_info):
        raise TypeError(f"{type(self).__name__} does not implement _run")

    def get_cpu_blob_name(self, base_str, node_name=""):
        return f"{self.__class__.__name__}_{self._instance_num}_{base_str}{node_name}_cpu"

    def get_gpu_blob_name(self, base_str, gpu_id, node_name):
        return f"{self.__class__.__name__}_{self._instance_num}_{base_str}{node_name}_gpu{gpu_id}"

    @property
    def attributes(self):
        """The optimizer's settings (its attributes, without the instance number)."""
        attr = copy.deepcopy(self.__dict__)
        del attr["_instance_num"]
        return attr

    @property
    def use_dedicated_lr_iteration_counter(self):
        return self._use_dedicated_lr_iteration_counter

    @use_dedicated_lr_iteration_counter.setter
    def use_dedicated_lr_iteration_counter(self, val):
        self._use_dedicated_lr_iteration_counter = val

    def make_unique_blob_name(self, base_str):
        """``base_str`` made unique to this optimizer instance and the current device."""
        current_scope = scope.CurrentDeviceScope()
        if current_scope is None:
            return self.get_cpu_blob_name(base_str)
        if core.IsGPUDeviceType(current_scope.device_type):
            return self.get_gpu_blob_name(
                base_str, current_scope.device_id, current_scope.node_name
            )
        return self.get_cpu_blob_name(base_str, current_scope.node_name)

    def _alpha_lr(self, net, param_init_net):
        """``build_lr`` for the optimizers whose rate is ``self.alpha`` under ``self.policy``,
        with the policy arguments given at construction: ``(lr blob, iteration blob)``."""
        return self.build_lr(
            net, param_init_net, base_learning_rate=self.alpha, policy=self.policy,
            **self.init_kwargs,
        )  # fmt: skip

    def build_lr(
        self,
        net,
        param_init_net,
        base_learning_rate,
        learning_rate_blob=None,
        policy="fixed",
        iter_val=0,
        **kwargs,
    ):
        """The learning-rate blob (created once per name) and the iteration blob.

        ``LearningRate([iteration], lr, base_lr=-base_learning_rate, policy=policy, **kwargs)``;
        then ``Mul`` by the global multiplier (copied with ``CopyFromCPUInput``) and by the
        local one when they are set.
        """
        if learning_rate_blob is None:
            learning_rate_blob = self.make_unique_blob_name("lr")

        if self._use_dedicated_lr_iteration_counter:
            iteration = utils.BuildUniqueMutexIter(
                param_init_net,
                net,
                iter=utils.OPTIMIZER_ITERATION_LR_NAME,
                iter_mutex=utils.ITERATION_MUTEX_LR_NAME,
                iter_val=iter_val,
            )
            logger.info("Created dedicated learning rate iteration counter: %s", iteration)
        else:
            iteration = utils.BuildUniqueMutexIter(param_init_net, net, iter_val=iter_val)

        if not net.BlobIsDefined(learning_rate_blob):
            # Minimizing: the step goes against the gradient, so the rate is negative.
            lr = net.LearningRate(
                [iteration],
                learning_rate_blob,
                base_lr=-base_learning_rate,
                policy=policy,
                **kwargs,
            )
        else:
            lr = net.GetBlobRef(learning_rate_blob)

        if self._lr_multiplier is not None:
            lr_multiplier = net.CopyFromCPUInput(
                self._lr_multiplier, self.make_unique_blob_name("lr_multiplier")
            )
            lr = net.Mul([lr, lr_multiplier], self.make_unique_blob_name("scaled_lr"), broadcast=1)

        if self._local_lr_multiplier is not None:
            current_scope = scope.CurrentDeviceScope()
            if (
                current_scope is not None
                and core.IsGPUDeviceType(current_scope.device_type)
                and not self._local_lr_multiplier_on_gpu
            ):
                local_lr_multiplier = net.CopyFromCPUInput(
                    self._local_lr_multiplier,
                    self.make_unique_blob_name("local_lr_multiplier"),
                )
            else:
                local_lr_multiplier = self._local_lr_multiplier
            lr = net.Mul(
                [lr, local_lr_multiplier],
                self.make_unique_blob_name("local_scaled_lr"),
                broadcast=1,
            )
        return lr, iteration

    def build_non_lr_iter(self, net, param_init_net, iter_val=0):
        """The general iteration counter when the learning rate has its own; a dummy
        ``LearningRate`` (``iter_placement_hint``) pins it to the trainer."""
        assert self._use_dedicated_lr_iteration_counter, (
            "This method should be only called when dedicated learning rate iteration "
            "counter is used."
        )
        iteration = utils.BuildUniqueMutexIter(param_init_net, net, iter_val=iter_val)
        logger.info("Created iteration counter for non learning rate purposes: %s", iteration)
        hint = self.make_unique_blob_name("iter_placement_hint")
        if not net.BlobIsDefined(hint):
            net.LearningRate([iteration], hint, base_lr=1.0, policy="fixed")
        return iteration

    def add_lr_multiplier(self, lr_multiplier):
        """Multiply every later learning rate by this blob (replaces an earlier one)."""
        self._lr_multiplier = lr_multiplier

    def _add_local_lr_multiplier(self, local_lr_multiplier, is_gpu_blob=False):
        self._local_lr_multiplier = local_lr_multiplier
        self._local_lr_multiplier_on_gpu = is_gpu_blob

    def _clear_local_lr_multiplier(self):
        self._local_lr_multiplier = None
        self._local_lr_multiplier_on_gpu = False

    @staticmethod
    def dedup(net, sparse_dedup_aggregator, grad):
        """Merge the rows of a GradientSlice that share an index ('sum' or 'mean'), or return
        it unchanged without an aggregator."""
        assert isinstance(grad, core.GradientSlice), (
            f"Dedup only works for sparse gradient, got {grad}"
        )
        if sparse_dedup_aggregator:
            return net.DeduplicateGradientSlices(grad, aggregator=sparse_dedup_aggregator)
        return grad

    def get_auxiliary_parameters(self):
        """``AuxOptimizerParams(local, shared)``: per-parameter state blobs (momentum, squared
        sums, ...) and blobs shared by all parameters (``ONE``, the iteration)."""
        return self._aux_params

    def scale_learning_rate(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} does not support scale_learning_rate")

    def create_lars_inputs(self, param_init_net, weight_decay, trust, lr_max):
        wd = param_init_net.ConstantFill([], "weight_decay", shape=[1], value=weight_decay)
        trust = param_init_net.ConstantFill([], "trust", shape=[1], value=trust)
        lr_max = param_init_net.ConstantFill([], "lr_max", shape=[1], value=lr_max)
        return wd, trust, lr_max

    def _add_lars(self, net, param_init_net, param, grad):
        """A ``Lars`` op computing this parameter's local learning-rate multiplier."""
        assert self.lars >= 0, f"Lars offset must be nonnegative, got {self.lars}"
        wd, trust, lr_max = self.create_lars_inputs(
            param_init_net, 0.0, 1.0, np.finfo(np.float32).max
        )
        multiplier = net.Lars(
            [param, grad, wd, trust, lr_max],
            self.make_unique_blob_name(str(param) + "_lars"),
            offset=self.lars,
            lr_min=0.0,
        )
        current_scope = scope.CurrentDeviceScope()
        self._add_local_lr_multiplier(
            multiplier,
            is_gpu_blob=(
                current_scope is not None and core.IsGPUDeviceType(current_scope.device_type)
            ),
        )


def _device_or_cpu():
    dev = scope.CurrentDeviceScope()
    return dev if dev is not None else core.DeviceOption(caffe2_pb2.CPU)


class SgdOptimizer(Optimizer):
    """Plain SGD (``WeightedSum`` / ``ScatterWeightedSum``) or, with ``momentum > 0``,
    ``MomentumSGDUpdate`` / ``SparseMomentumSGDUpdate`` (``nesterov`` on by default).

    Extra keyword arguments go to the ``LearningRate`` op (policy parameters)."""

    def __init__(
        self,
        base_learning_rate=0.01,
        policy="fixed",
        momentum=0.0,
        nesterov=True,
        sparse_dedup_aggregator=None,
        lars=None,
        **kwargs,
    ):
        super().__init__()
        self.base_learning_rate = base_learning_rate
        self.policy = policy
        self.momentum = momentum
        self.nesterov = nesterov
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.lars = lars
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param = param_info.blob
        grad = param_info.grad
        if self.base_learning_rate == 0:
            return
        assert self.base_learning_rate > 0, (
            f"Expect positive base learning rate, got {self.base_learning_rate}"
        )
        self._clear_local_lr_multiplier()
        if self.lars is not None and not isinstance(grad, core.GradientSlice):
            self._add_lars(net, param_init_net, param, grad)

        # WeightedSum adds lr * grad, so without momentum the rate itself is the (negative)
        # step; the momentum ops subtract, so they get the positive rate.
        lr_sign = -1 if self.momentum else 1
        lr, _ = self.build_lr(
            net,
            param_init_net,
            base_learning_rate=self.base_learning_rate * lr_sign,
            policy=self.policy,
            **self.init_kwargs,
        )

        # One constant per device.
        dev = _device_or_cpu()
        one = param_init_net.ConstantFill(
            [], f"ONE_{dev.device_type}_{dev.device_id}{dev.node_name}", shape=[1], value=1.0
        )
        self._aux_params.shared.append(one)

        if self.momentum > 0:
            momentum_data = param_init_net.ConstantFill(param, str(param) + "_momentum", value=0.0)
            self._aux_params.local.append(momentum_data)

        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            if self.momentum > 0.0:
                net.SparseMomentumSGDUpdate(
                    [grad.values, momentum_data, lr, param, grad.indices],
                    [grad.values, momentum_data, param],
                    momentum=self.momentum,
                    nesterov=self.nesterov,
                )
            else:
                net.ScatterWeightedSum([param, one, grad.indices, grad.values, lr], param)
        elif self.momentum > 0.0:
            net.MomentumSGDUpdate(
                [grad, momentum_data, lr, param],
                [grad, momentum_data, param],
                momentum=self.momentum,
                nesterov=self.nesterov,
            )
        else:
            net.WeightedSum([param, one, grad, lr], param)

    def scale_learning_rate(self, scale):
        self.base_learning_rate *= scale


class MultiPrecisionSgdOptimizer(SgdOptimizer):
    """Momentum SGD on the float32 master copy of a float16 parameter (``blob_copy``, as
    made by ``PseudoFP16Initializer``): HalfToFloat of the gradient, MomentumSGDUpdate in
    float32, FloatToHalf back. Parameters without a float32 copy use SgdOptimizer."""

    def __init__(
        self,
        base_learning_rate=0.1,
        momentum=0.0,
        policy="fixed",
        nesterov=True,
        sparse_dedup_aggregator=None,
        **kwargs,
    ):
        super().__init__(
            base_learning_rate=base_learning_rate,
            policy=policy,
            momentum=momentum,
            nesterov=nesterov,
            sparse_dedup_aggregator=sparse_dedup_aggregator,
            **kwargs,
        )

    def _run(self, net, param_init_net, param_info):
        param = param_info.blob
        param_fp32 = (
            param_info.blob_copy[core.DataType.FLOAT] if param_info.blob_copy is not None else None
        )
        if param_fp32 is None:
            return SgdOptimizer._run(self, net, param_init_net, param_info)

        grad = param_info.grad
        if self.base_learning_rate == 0:
            return
        assert self.base_learning_rate > 0, (
            f"Expect positive base learning rate, got {self.base_learning_rate}"
        )
        lr, _ = self.build_lr(
            net,
            param_init_net,
            base_learning_rate=-self.base_learning_rate,
            policy=self.policy,
            **self.init_kwargs,
        )
        momentum_data = param_init_net.ConstantFill(param_fp32, str(param) + "_momentum", value=0.0)
        self._aux_params.local.append(momentum_data)
        assert not isinstance(grad, core.GradientSlice), (
            "MultiPrecisionSgd does not support sparse gradients"
        )
        grad_fp32 = net.HalfToFloat(grad, grad + "_fp32")
        net.MomentumSGDUpdate(
            [grad_fp32, momentum_data, lr, param_fp32],
            [grad_fp32, momentum_data, param_fp32],
            momentum=self.momentum,
            nesterov=self.nesterov,
        )
        net.FloatToHalf(param_fp32, param)


class FP16SgdOptimizer(SgdOptimizer):
    """Momentum SGD with weight decay in float16 (``FP16MomentumSGDUpdate``) or, for float32
    parameters (no float16 copy, or a name containing 'spatbn'), ``FP32MomentumSGDUpdate``."""

    def __init__(
        self,
        base_learning_rate=0.1,
        momentum=0.0,
        policy="fixed",
        nesterov=True,
        weight_decay=0.0001,
        sparse_dedup_aggregator=None,
        **kwargs,
    ):
        super().__init__(
            base_learning_rate=base_learning_rate,
            policy=policy,
            momentum=momentum,
            nesterov=nesterov,
            sparse_dedup_aggregator=sparse_dedup_aggregator,
            **kwargs,
        )
        self.weight_decay = weight_decay

    def _run(self, net, param_init_net, param_info, fp32_update=False):
        # SpatialBN parameters stay float32 (cuDNN wants them so).
        if str(param_info.blob).find("spatbn") != -1:
            fp32_update = True
        param = param_fp32 = param_info.blob
        fp32_update_flag = 1
        if not fp32_update and param_info.blob_copy is not None:
            if core.DataType.FLOAT in param_info.blob_copy:
                param_fp32 = param_info.blob_copy[core.DataType.FLOAT]
                fp32_update_flag = 0
            elif core.DataType.FLOAT16 in param_info.blob_copy:
                param = param_info.blob_copy[core.DataType.FLOAT16]
                fp32_update_flag = 0

        grad = param_info.grad
        if self.base_learning_rate == 0:
            return
        assert self.base_learning_rate > 0, (
            f"Expect positive base learning rate, got {self.base_learning_rate}"
        )
        lr, _ = self.build_lr(
            net,
            param_init_net,
            base_learning_rate=-self.base_learning_rate,
            policy=self.policy,
            **self.init_kwargs,
        )
        momentum_data_fp32 = param_init_net.ConstantFill(
            param_fp32, str(param) + "_momentum_fp32", value=0.0
        )
        momentum_data = param_init_net.FloatToHalf(momentum_data_fp32, str(param) + "_momentum")
        self._aux_params.local.append(momentum_data)
        assert not isinstance(grad, core.GradientSlice), "FP16Sgd does not support sparse gradients"
        if fp32_update_flag == 0:
            net.FP16MomentumSGDUpdate(
                [grad, momentum_data, lr, param],
                [grad, momentum_data, param],
                momentum=self.momentum,
                nesterov=self.nesterov,
                weight_decay=self.weight_decay,
            )
        else:
            net.FP32MomentumSGDUpdate(
                [grad, momentum_data_fp32, lr, param],
                [grad, momentum_data_fp32, param],
                momentum=self.momentum,
                nesterov=self.nesterov,
                weight_decay=self.weight_decay,
            )


class WeightDecayBuilder(Optimizer):
    """L2 weight decay folded into the gradient: ``WeightedSum([grad, ONE, param, wd], grad)``
    with per-device constants ``ONE_<type>_<id>`` and ``wd_<type>_<id>``."""

    def __init__(self, weight_decay):
        # Caffe2 does not run Optimizer.__init__ here: no instance number, no aux params.
        self.weight_decay = weight_decay
        self._lr_multiplier = None

    def _run(self, net, param_init_net, param_info):
        dev = _device_or_cpu()
        one = param_init_net.ConstantFill(
            [], f"ONE_{dev.device_type}_{dev.device_id}", shape=[1], value=1.0
        )
        wd = param_init_net.ConstantFill(
            [], f"wd_{dev.device_type}_{dev.device_id}", shape=[1], value=self.weight_decay
        )
        if isinstance(param_info.grad, core.GradientSlice):
            raise ValueError("Weight decay does not yet support sparse gradients")
        net.WeightedSum([param_info.grad, one, param_info.blob, wd], param_info.grad)


class AdagradOptimizer(Optimizer):
    """Adagrad: ``Adagrad`` for dense gradients, ``SparseAdagrad`` (or, with ``rowWise``, one
    accumulator per row: ``RowWiseSparseAdagrad``) for GradientSlices.

    ``weight_decay`` applies to parameters with more than one dimension; ``lars`` adds a
    per-parameter LARS multiplier; ``output_effective_lr`` (``_and_update``) adds the
    ``<param>_effective_lr`` (and ``<param>_update``) outputs; ``counter_halflife > 0`` keeps
    per-row update counters (``RowWiseCounter``). The pruning, SWA, EMA and weight-scale
    options of later Caffe2 versions are not supported (a ValueError names them).
    """

    def __init__(
        self,
        alpha=0.01,
        epsilon=1e-4,
        decay=1,
        weight_decay=0.0,
        policy="fixed",
        sparse_dedup_aggregator=None,
        rowWise=False,
        engine="",
        lars=None,
        output_effective_lr=False,
        output_effective_lr_and_update=False,
        pruning_options=None,
        swa_options=None,
        ema_options=None,
        weight_scale=None,
        counter_halflife=-1,
        use_dedicated_lr_iteration_counter=False,
        **kwargs,
    ):
        super().__init__()
        unsupported = [
            name
            for name, value in (
                ("pruning_options", pruning_options),
                ("swa_options", swa_options),
                ("ema_options", ema_options),
                ("weight_scale", weight_scale),
            )
            if value
        ]
        if unsupported:
            raise ValueError(f"AdagradOptimizer: unsupported options {unsupported}")
        self.alpha = alpha
        self.epsilon = epsilon
        self.decay = decay
        self.weight_decay = float(weight_decay)
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.rowWise = rowWise
        self.engine = engine
        self.lars = lars
        self.output_effective_lr = output_effective_lr
        self.output_effective_lr_and_update = output_effective_lr_and_update
        self.counter_halflife = counter_halflife
        self.init_kwargs = kwargs
        self.use_dedicated_lr_iteration_counter = use_dedicated_lr_iteration_counter

    def _row_state(self, param_init_net, param, suffix, shapes, **fill_kwargs):
        """A ``[rows]`` state blob: from the known shape, or via Shape/Slice of the param."""
        if str(param) in shapes:
            return param_init_net.ConstantFill(
                [], str(param) + suffix, shape=[shapes[str(param)][0]], **fill_kwargs
            )
        shape = param_init_net.Shape(param, str(param) + "_shape")
        num_rows = param_init_net.Slice([shape], str(shape) + "_numrows", starts=[0], ends=[1])
        return param_init_net.ConstantFill(
            num_rows, str(param) + suffix, input_as_shape=1, **fill_kwargs
        )

    def _run(self, net, param_init_net, param_info):
        param = param_info.blob
        grad = param_info.grad
        if self.alpha <= 0:
            return
        self._clear_local_lr_multiplier()
        if self.lars is not None and not isinstance(grad, core.GradientSlice):
            assert self.weight_decay == 0, "weight decay is not implemented for LARS yet"
            self._add_lars(net, param_init_net, param, grad)

        lr, lr_iteration = self._alpha_lr(net, param_init_net)
        iteration = (
            self.build_non_lr_iter(net, param_init_net, iter_val=0)
            if self._use_dedicated_lr_iteration_counter
            else lr_iteration
        )
        if self.counter_halflife > 0:
            self._aux_params.shared.append(iteration)

        if self.rowWise:
            shapes = _init_net_shapes(param_init_net)
            param_squared_sum = self._row_state(
                param_init_net, param, "_avg_squared_sum", shapes, value=0.0
            )
        elif self.engine in FP16_ENGINES:
            assert self.weight_decay == 0, f"weight decay is not tested for engine: {self.engine}"
            shapes = _init_net_shapes(param_init_net)
            assert str(param) in shapes, shapes
            param_squared_sum = param_init_net.Float16ConstantFill(
                [], str(param) + "_squared_sum", value=0.0, shape=shapes[str(param)]
            )
        else:
            param_squared_sum = param_init_net.ConstantFill(
                [param], str(param) + "_squared_sum", value=0.0
            )
        self._aux_params.local.append(param_squared_sum)

        if self.counter_halflife > 0:
            shapes = _init_net_shapes(param_init_net)
            update_counter = self._row_state(
                param_init_net,
                param,
                "_update_counter",
                shapes,
                value=0.0,
                dtype=core.DataType.DOUBLE,
            )
            prev_update_iter = self._row_state(
                param_init_net,
                param,
                "_prev_update_iter",
                shapes,
                value=0,
                dtype=core.DataType.INT64,
            )
            self._aux_params.local.append(update_counter)
            self._aux_params.local.append(prev_update_iter)

        if self.rowWise:
            assert isinstance(grad, core.GradientSlice), (
                "If SparseAdagrad with rowWise=True, gradient must be a gradientslice. "
                "PLease ensure that rowWise is not enabled for the dense Adagrad optimizer, "
                "as it is not supported."
            )

        # No weight decay for 1-d parameters (biases, scales).
        weight_decay = 0.0
        if self.weight_decay > 0:
            param_shape = _init_net_shapes(param_init_net).get(str(param))
            if param_shape is not None and len(param_shape) != 1:
                weight_decay = self.weight_decay
            else:
                logger.warning(
                    "SKIPPING weight decay on 1d param: %s.shape is %s", param, param_shape
                )

        if isinstance(grad, core.GradientSlice):
            assert self.decay == 1.0, (
                "Decay is not implemented for SparseAdagrad and must be set to 1"
            )
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            input_args = [param, param_squared_sum, grad.indices, grad.values, lr]
            output_args = [param, param_squared_sum]
            if self.rowWise:
                if self.counter_halflife > 0:
                    input_args += [update_counter]
                op = "RowWiseSparseAdagrad"
            else:
                op = "SparseAdagrad"
            op_kwargs = {"epsilon": self.epsilon}
            if weight_decay > 0:
                op_kwargs["weight_decay"] = weight_decay
            op_kwargs["engine"] = self.engine
            if weight_decay > 0 and self.counter_halflife != -1:
                op_kwargs["counter_halflife"] = self.counter_halflife
            getattr(net, op)(input_args, output_args, **op_kwargs)
            if self.counter_halflife > 0:
                net.RowWiseCounter(
                    [prev_update_iter, update_counter, grad.indices, iteration],
                    [prev_update_iter, update_counter],
                    counter_halflife=self.counter_halflife,
                )
        else:
            input_args = [param, param_squared_sum, grad, lr]
            output_args = [param, param_squared_sum]
            if self.output_effective_lr_and_update:
                output_args.append(str(param) + "_effective_lr")
                output_args.append(str(param) + "_update")
            elif self.output_effective_lr:
                output_args.append(str(param) + "_effective_lr")
            op_kwargs = {"epsilon": self.epsilon, "decay": float(self.decay)}
            if weight_decay > 0:
                op_kwargs["weight_decay"] = weight_decay
            net.Adagrad(input_args, output_args, engine=self.engine, **op_kwargs)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class AdamOptimizer(Optimizer):
    """Adam: ``Adam`` / ``SparseAdam`` (``RowWiseSparseAdam`` with ``rowWise``,
    ``SmartDecaySparseAdam`` with ``use_smart_decay``) with moments ``<param>_first_moment``
    and ``<param>_second_moment`` (``_avg_second_moment`` row-wise); ``use_lr_adaption`` adds a
    ``LearningRateAdaption`` op driven by ``<param>_effective_grad``."""

    def __init__(
        self,
        alpha=0.001,
        beta1=0.9,
        beta2=0.999,
        epsilon=1e-8,
        policy="fixed",
        use_lr_adaption=False,
        lr_alpha=0.01,
        normalized_lr_adaption=True,
        sparse_dedup_aggregator=None,
        rowWise=False,
        engine="",
        enableRAdam=False,
        use_smart_decay=False,
        **kwargs,
    ):
        super().__init__()
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.policy = policy
        self.use_lr_adaption = use_lr_adaption
        self.lr_alpha = lr_alpha
        self.normalized_lr_adaption = normalized_lr_adaption
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.rowWise = rowWise
        self.engine = engine
        self.enableRAdam = enableRAdam
        if use_smart_decay:
            for flag, name in (
                (rowWise, "rowWise"),
                (enableRAdam, "RAdam"),
                (use_lr_adaption, "lr_adaption"),
            ):
                if flag:
                    raise ValueError(f"Smart decay is not implemented with {name}.")
        self.use_smart_decay = use_smart_decay
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param = param_info.blob
        grad = param_info.grad
        if self.alpha <= 0:
            return
        lr, iteration = self._alpha_lr(net, param_init_net)
        m1 = param_init_net.ConstantFill([param], param + "_first_moment", value=0.0)
        if self.rowWise:
            rows = _init_net_shapes(param_init_net)[str(param)][0]
            m2 = param_init_net.ConstantFill(
                [], param + "_avg_second_moment", shape=[rows], value=0.0
            )
        else:
            m2 = param_init_net.ConstantFill([param], param + "_second_moment", value=0.0)

        if self.use_smart_decay:
            rows = _init_net_shapes(param_init_net)[str(param)][0]
            last_seen = param_init_net.ConstantFill(
                [], param + "_last_seen", shape=[rows], value=0, dtype=core.DataType.INT64
            )
            self._aux_params.local.append(last_seen)

        self._aux_params.shared.append(iteration)
        self._aux_params.local.append(m1)
        self._aux_params.local.append(m2)

        if self.rowWise:
            assert isinstance(grad, core.GradientSlice), (
                "If SparseAdam with rowWise=True, gradient must be a gradientslice. PLease "
                "ensure that rowWise is not enabled for the dense Adam optimizer, as it is not "
                "supported."
            )

        output_blobs = [param, m1, m2]
        if self.use_smart_decay:
            output_blobs.append(last_seen)
        if self.use_lr_adaption:
            effective_grad = str(param) + "_effective_grad"
            output_blobs.append(effective_grad)

        moments = dict(beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon)
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            if self.rowWise:
                assert not self.enableRAdam, (
                    "Currently, RowWiseSparseAdam is not supported by RAdam!"
                )
                net.RowWiseSparseAdam(
                    [param, m1, m2, grad.indices, grad.values, lr, iteration],
                    output_blobs,
                    **moments,
                )
            elif self.use_smart_decay:
                net.SmartDecaySparseAdam(
                    [param, m1, m2, last_seen, grad.indices, grad.values, lr, iteration],
                    output_blobs,
                    **moments,
                )
            else:
                net.SparseAdam(
                    [param, m1, m2, grad.indices, grad.values, lr, iteration],
                    output_blobs,
                    **moments,
                    enableRAdam=self.enableRAdam,
                )
            adaption_grad = grad.values
        else:
            net.Adam([param, m1, m2, grad, lr, iteration], output_blobs, **moments)
            adaption_grad = grad
        if self.use_lr_adaption:
            net.LearningRateAdaption(
                [lr, adaption_grad, effective_grad],
                [lr],
                lr_alpha=self.lr_alpha,
                normalized_lr_adaption=self.normalized_lr_adaption,
            )

    def scale_learning_rate(self, scale):
        self.alpha *= scale


def _lars_if_dense(optimizer, net, param_init_net, param, grad):
    """Clear the previous parameter's local multiplier, then add a LARS one for a dense
    gradient when the optimizer has a ``lars`` offset."""
    optimizer._clear_local_lr_multiplier()
    if optimizer.lars is not None and not isinstance(grad, core.GradientSlice):
        optimizer._add_lars(net, param_init_net, param, grad)


class WngradOptimizer(Optimizer):
    """WNGrad: one scalar ``<param>_moment`` (initially ``moment_init``) per parameter that
    grows with the squared gradient norm; ``Wngrad`` / ``SparseWngrad``."""

    def __init__(
        self,
        alpha=1.0,
        epsilon=1e-9,
        policy="fixed",
        sparse_dedup_aggregator=None,
        engine="",
        moment_init=100.0,
        lars=None,
        output_effective_lr=False,
        output_effective_lr_and_update=False,
        **kwargs,
    ):
        super().__init__()
        self.alpha = alpha
        self.epsilon = epsilon
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine
        self.moment_init = moment_init
        self.lars = lars
        self.output_effective_lr = output_effective_lr
        self.output_effective_lr_and_update = output_effective_lr_and_update
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        _lars_if_dense(self, net, param_init_net, param, grad)
        lr, _ = self._alpha_lr(net, param_init_net)
        moment = param_init_net.ConstantFill(
            [], str(param) + "_moment", shape=[1], value=self.moment_init
        )
        self._aux_params.local.append(moment)
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseWngrad(
                [param, moment, grad.indices, grad.values, lr],
                [param, moment],
                epsilon=self.epsilon,
                engine=self.engine,
            )
            return
        outputs = [param, moment]
        if self.output_effective_lr_and_update:
            outputs += [str(param) + "_effective_lr", str(param) + "_update"]
        elif self.output_effective_lr:
            outputs.append(str(param) + "_effective_lr")
        net.Wngrad([param, moment, grad, lr], outputs, epsilon=self.epsilon, engine=self.engine)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class StormOptimizer(Optimizer):
    """STORM: a momentum ``<param>_moment`` and a scalar ``<param>_grad_sq_sum`` (initially
    ``grad_sq_init``); ``Storm`` / ``SparseStorm`` with ``momentum`` and ``beta``."""

    def __init__(
        self,
        lr=0.1,
        momentum=10.0,
        beta=0.1,
        grad_sq_init=0.01,
        policy="fixed",
        sparse_dedup_aggregator=None,
        lars=None,
        **kwargs,
    ):
        super().__init__()
        self.lr = lr
        self.momentum = momentum
        self.beta = beta
        self.grad_sq_init = grad_sq_init
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.lars = lars
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.lr <= 0:
            return
        _lars_if_dense(self, net, param_init_net, param, grad)
        lr, _ = self.build_lr(
            net,
            param_init_net,
            base_learning_rate=self.lr,
            policy=self.policy,
            **self.init_kwargs,
        )
        moment = param_init_net.ConstantFill(param, str(param) + "_moment", value=0.0)
        self._aux_params.local.append(moment)
        grad_sq_sum = param_init_net.ConstantFill(
            [], str(param) + "_grad_sq_sum", shape=[1], value=self.grad_sq_init
        )
        self._aux_params.local.append(grad_sq_sum)
        state = [param, moment, grad_sq_sum]
        args = dict(momentum=self.momentum, beta=self.beta)
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseStorm(state + [grad.values, grad.indices, lr], state, **args)
        else:
            net.Storm(state + [grad, lr], state, **args)

    def scale_learning_rate(self, scale):
        self.lr *= scale


class AdadeltaOptimizer(Optimizer):
    """Adadelta: ``<param>_squared_moment`` and ``<param>_squared_moment_update``;
    ``Adadelta`` / ``SparseAdadelta`` with ``epsilon`` and ``decay``."""

    def __init__(
        self,
        alpha=0.01,
        epsilon=1e-4,
        decay=0.95,
        policy="fixed",
        sparse_dedup_aggregator=None,
        engine="",
        **kwargs,
    ):
        super().__init__()
        self.alpha = alpha
        self.epsilon = epsilon
        self.decay = decay
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, _ = self._alpha_lr(net, param_init_net)
        moment = param_init_net.ConstantFill([param], str(param) + "_squared_moment", value=0.0)
        moment_update = param_init_net.ConstantFill(
            [param], str(param) + "_squared_moment_update", value=0.0
        )
        self._aux_params.local.append(moment)
        self._aux_params.local.append(moment_update)
        state = [param, moment, moment_update]
        args = dict(epsilon=self.epsilon, decay=self.decay, engine=self.engine)
        if isinstance(grad, core.GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseAdadelta(state + [grad.indices, grad.values, lr], state, **args)
        else:
            net.Adadelta(state + [grad, lr], state, **args)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class FtrlOptimizer(Optimizer):
    """FTRL-Proximal: ``<param>_ftrl_nz`` holds (n, z) per value (the parameter's shape plus a
    trailing 2); ``Ftrl`` / ``SparseFtrl``. No learning-rate blob: ``alpha`` is an argument."""

    _op = "Ftrl"
    _state_suffix = "_ftrl_nz"
    _sparse = True

    def __init__(
        self,
        alpha=0.01,
        beta=1e-4,
        lambda1=0,
        lambda2=0,
        sparse_dedup_aggregator=None,
        engine="",
    ):
        super().__init__()
        self.alpha = alpha
        self.beta = beta
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        nz = param_init_net.ConstantFill(
            [param], str(param) + self._state_suffix, extra_shape=[2], value=0.0
        )
        self._aux_params.local.append(nz)
        args = dict(
            engine=self.engine,
            alpha=self.alpha,
            beta=self.beta,
            lambda1=self.lambda1,
            lambda2=self.lambda2,
        )
        if isinstance(grad, core.GradientSlice) and self._sparse:
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseFtrl([param, nz, grad.indices, grad.values], [param, nz], **args)
        else:
            getattr(net, self._op)([param, nz, grad], [param, nz], **args)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class GFtrlOptimizer(FtrlOptimizer):
    """Group lasso FTRL (``GFtrl``, dense only): state ``<param>_gftrl_nz``."""

    _op = "GFtrl"
    _state_suffix = "_gftrl_nz"
    _sparse = False


class DecayAdagradOptimizer(Optimizer):
    """Decayed Adagrad: ``DecayAdagrad`` with ``<param>_first_mo1ment`` (Caffe2's spelling) and
    ``<param>_second_moment`` for dense gradients, ``SparseAdagrad`` with
    ``<param>_squared_sum`` for sparse ones."""

    def __init__(
        self,
        alpha=0.01,
        beta1=0.0,
        beta2=0.999,
        epsilon=0.1,
        weight_decay=0.0,
        ema_options=None,
        bias_correction_first=True,
        policy="fixed",
        engine="",
        **kwargs,
    ):
        super().__init__()
        if ema_options:
            raise ValueError("DecayAdagradOptimizer: ema_options are not supported")
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.weight_decay = weight_decay
        self.bias_correction_first = bias_correction_first
        self.policy = policy
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, iteration = self._alpha_lr(net, param_init_net)
        if isinstance(grad, core.GradientSlice):
            squared_sum = param_init_net.ConstantFill([param], param + "_squared_sum", value=0.0)
            self._aux_params.local.append(squared_sum)
            net.SparseAdagrad(
                [param, squared_sum, grad.indices, grad.values, lr],
                [param, squared_sum],
                epsilon=self.epsilon,
            )
            return
        m1 = param_init_net.ConstantFill([param], param + "_first_mo1ment", value=0.0)
        m2 = param_init_net.ConstantFill([param], param + "_second_moment", value=0.0)
        self._aux_params.shared.append(iteration)
        self._aux_params.local.append(m1)
        self._aux_params.local.append(m2)
        net.DecayAdagrad(
            [param, m1, m2, grad, lr, iteration],
            [param, m1, m2],
            beta1=self.beta1,
            beta2=self.beta2,
            epsilon=self.epsilon,
            weight_decay=self.weight_decay,
            bias_correction_first=self.bias_correction_first,
        )

    def scale_learning_rate(self, scale):
        self.alpha *= scale


# YellowFin keeps this many scalars per parameter (gradient norm, squared norm, curvature
# range ends, distance), in ``<param>_scalars_memory``.
_YELLOWFIN_SCALARS = 5


class YellowFinOptimizer(Optimizer):
    """YellowFin (https://arxiv.org/abs/1706.03471): momentum SGD whose rate and momentum are
    tuned per parameter by the ``YellowFin`` op (dense gradients only)."""

    def __init__(
        self,
        alpha=0.1,
        mu=0.0,
        beta=0.999,
        curv_win_width=20,
        zero_debias=True,
        epsilon=0.1**6,
        policy="fixed",
        sparse_dedup_aggregator=None,
        **kwargs,
    ):
        super().__init__()
        self.alpha = alpha
        self.mu = mu
        self.beta = beta
        self.curv_win_width = curv_win_width
        self.zero_debias = zero_debias
        self.epsilon = epsilon
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad

        def fill(suffix, **kwargs):
            inputs = [] if "shape" in kwargs else [param]
            return param_init_net.ConstantFill(inputs, param + suffix, **kwargs)

        moment = fill("_moment", value=0.0)
        curv_win = fill("_curv_win", shape=[self.curv_win_width], value=0.0)
        g_avg = fill("_g_avg", value=0.0)
        g2_avg = fill("_g2_avg", value=0.0)
        lr_avg = fill("_lr_avg", shape=[1], value=self.alpha)
        mu_avg = fill("_mu_avg", shape=[1], value=self.mu)
        scalars_memory = fill("_scalars_memory", shape=[_YELLOWFIN_SCALARS], value=0.0)
        assert self.alpha > 0
        assert not isinstance(grad, core.GradientSlice), (
            "YellowFin does not support sparse gradients"
        )
        iteration = utils.BuildUniqueMutexIter(param_init_net, net, iter_val=0)
        self._aux_params.shared.append(iteration)
        state = [param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars_memory]
        self._aux_params.local.extend(
            [moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars_memory]
        )
        net.YellowFin(
            state + [grad, iteration],
            state,
            beta=self.beta,
            epsilon=self.epsilon,
            curv_win_width=self.curv_win_width,
            zero_debias=self.zero_debias,
        )

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class RmsPropOptimizer(Optimizer):
    """RMSProp (dense only): ``RmsProp`` with a unit rate into ``<param>_grad_o``, then
    ``MomentumSGDUpdate`` with the learning rate; state ``<param>_mean_squares`` and
    ``<param>_momentum``."""

    def __init__(
        self,
        alpha=0.01,
        decay=0.9,
        momentum=0.0,
        epsilon=1e-5,
        policy="fixed",
        engine="",
        **kwargs,
    ):
        super().__init__()
        self.alpha = alpha
        self.decay = decay
        self.momentum = momentum
        self.epsilon = epsilon
        self.policy = policy
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        assert self.alpha > 0
        assert not isinstance(grad, core.GradientSlice), (
            "RmsPropOptimizer doesn't support sparse gradients"
        )
        dev = _device_or_cpu()
        one = param_init_net.ConstantFill(
            [], f"ONE_{dev.device_type}_{dev.device_id}", shape=[1], value=1.0
        )
        # MomentumSGDUpdate subtracts its step: the rate stays positive.
        lr, _ = self.build_lr(
            net,
            param_init_net,
            base_learning_rate=-self.alpha,
            policy=self.policy,
            **self.init_kwargs,
        )
        grad_o = param_init_net.ConstantFill([param], str(param) + "_grad_o", value=0.0)
        ms = param_init_net.ConstantFill([param], str(param) + "_mean_squares", value=0.0)
        mom = param_init_net.ConstantFill([param], str(param) + "_momentum", value=0.0)
        self._aux_params.local.append(ms)
        self._aux_params.local.append(mom)
        net.RmsProp(
            [grad, ms, mom, one],
            [grad_o, ms, mom],
            decay=self.decay,
            momentum=self.momentum,
            epsilon=self.epsilon,
            engine=self.engine,
        )
        net.MomentumSGDUpdate([grad_o, mom, lr, param], [grad_o, mom, param])

    def scale_learning_rate(self, scale):
        self.alpha *= scale


# ------------------------------------------------------------------------------- building
def _get_param_to_device(model):
    """Blob -> device option of the op that writes it (net first, then the init net)."""
    param_to_device = core.InferBlobDevices(model.net)
    param_to_device.update(core.InferBlobDevices(model.param_init_net))
    return param_to_device


def get_param_device(param_name, grad, param_to_device=None, default_device=None):
    """The device of ``param_name``'s producer, else of its gradient's (values, then indices
    for a GradientSlice), else ``default_device``; an AssertionError when none is known."""
    device = default_device
    param_to_device = param_to_device or {}
    if param_name in param_to_device:
        device = param_to_device[param_name]
    elif isinstance(grad, core.GradientSlice):
        if str(grad.values) in param_to_device:
            device = param_to_device[str(grad.values)]
        elif str(grad.indices) in param_to_device:
            device = param_to_device[str(grad.indices)]
    elif str(grad) in param_to_device:
        device = param_to_device[str(grad)]
    assert device is not None, f"Cannot infer device for {param_name}: no op creates it"
    return device


def get_lr_injection():
    """The current value of the learning-rate injection multiplier (models built with
    ``allow_lr_injection=True``)."""
    from ferrocaffe import workspace

    return workspace.FetchBlob(_LEARNING_RATE_INJECTION)


def set_lr_injection(lr_injection_value):
    """Set the multiplier applied to every learning rate (``allow_lr_injection=True``)."""
    from ferrocaffe import workspace

    workspace.FeedBlob(
        _LEARNING_RATE_INJECTION, np.array([float(lr_injection_value)], dtype=np.float32)
    )


def _calc_norm_ratio(model, params, name_scope, param_to_device, max_gradient_norm):
    """``clip_norm / max(global_norm, clip_norm)`` over the gradients of ``params``."""
    with scope.NameScope(name_scope):
        grad_squared_sums = []
        for i, param in enumerate(params):
            device = get_param_device(str(param.blob), param.grad, param_to_device)
            with scope.DeviceScope(device):
                grad = (
                    param.grad
                    if not isinstance(param.grad, core.GradientSlice)
                    else param.grad.values
                )
                grad_squared_sum = model.net.SumSqrElements(grad, f"grad_{i}_squared_sum")
                grad_squared_sums.append(model.net.EnsureCPUOutput(grad_squared_sum))
        with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
            full_sum = model.net.Sum(grad_squared_sums, "grad_squared_full_sum")
            global_norm = model.net.Pow(full_sum, "global_norm", exponent=0.5)
            clip_norm = model.param_init_net.ConstantFill(
                [], "clip_norm", shape=[], value=float(max_gradient_norm)
            )
            max_norm = model.net.Max([global_norm, clip_norm], "max_norm")
            return model.net.Div([clip_norm, max_norm], "norm_ratio")


def _build(
    model,
    optimizer,
    weights_only=False,
    use_param_info_optim=True,
    max_gradient_norm=None,
    allow_lr_injection=False,
):
    param_to_device = _get_param_to_device(model)
    model.Validate()

    params = [
        info
        for info in model.GetOptimizationParamInfo()
        if not weights_only or info.blob in model.weights
    ]

    lr_multiplier = None
    if max_gradient_norm is not None:
        lr_multiplier = _calc_norm_ratio(
            model, params, "norm_clipped_grad_update", param_to_device, max_gradient_norm
        )
    if allow_lr_injection:
        if not model.net.BlobIsDefined(_LEARNING_RATE_INJECTION):
            lr_injection = model.param_init_net.ConstantFill(
                [], _LEARNING_RATE_INJECTION, shape=[1], value=1.0
            )
        else:
            lr_injection = _LEARNING_RATE_INJECTION
        if lr_multiplier is None:
            lr_multiplier = lr_injection
        else:
            lr_multiplier = model.net.Mul(
                [lr_multiplier, lr_injection], "lr_multiplier", broadcast=1
            )
    optimizer.add_lr_multiplier(lr_multiplier)

    for param_info in params:
        device = get_param_device(str(param_info.blob), param_info.grad, param_to_device)
        with scope.DeviceScope(device):
            if param_info.optimizer and use_param_info_optim:
                param_info.optimizer(model.net, model.param_init_net, param_info)
            else:
                optimizer(model.net, model.param_init_net, param_info)
    return optimizer


def add_weight_decay(model, weight_decay):
    """L2 decay of the model's weights, added to their gradients (run before the optimizer)."""
    _build(
        model,
        WeightDecayBuilder(weight_decay=weight_decay),
        weights_only=True,
        use_param_info_optim=False,
    )


def build_sgd(
    model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs
):
    """SGD for every parameter with a gradient (``SgdOptimizer(base_learning_rate, **kwargs)``:
    ``policy``, ``momentum``, ``nesterov``, ``sparse_dedup_aggregator``, ``lars`` and
    LearningRate arguments). ``max_gradient_norm`` scales the rate for gradient clipping;
    ``allow_lr_injection`` multiplies it by the ``lr_injection`` blob. Returns the optimizer."""
    return _build(
        model,
        SgdOptimizer(base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_multi_precision_sgd(
    model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs
):
    return _build(
        model,
        MultiPrecisionSgdOptimizer(base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_fp16_sgd(model, base_learning_rate, **kwargs):
    return _build(model, FP16SgdOptimizer(base_learning_rate, **kwargs))


def build_adagrad(
    model,
    base_learning_rate,
    parameters=None,
    max_gradient_norm=None,
    allow_lr_injection=False,
    **kwargs,
):
    return _build(
        model,
        AdagradOptimizer(alpha=base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_adam(
    model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs
):
    return _build(
        model,
        AdamOptimizer(alpha=base_learning_rate, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def _build_with(
    cls, rate_name, model, base_learning_rate, max_gradient_norm, allow_lr_injection, kwargs
):
    return _build(
        model,
        cls(**{rate_name: base_learning_rate}, **kwargs),
        max_gradient_norm=max_gradient_norm,
        allow_lr_injection=allow_lr_injection,
    )


def build_ftrl(model, engine="SIMD", **kwargs):
    """FTRL for every parameter (``FtrlOptimizer(engine=engine, **kwargs)``)."""
    # Caffe2 checked its SIMD kernels here; ferrocaffe's CPU kernels serve engine "SIMD".
    if engine == "SIMD":
        assert core.IsOperator("Ftrl") and core.IsOperator("SparseFtrl")
    return _build(model, FtrlOptimizer(engine=engine, **kwargs))


def build_gftrl(model, engine="", **kwargs):
    """Group lasso FTRL for every parameter (``GFtrlOptimizer``)."""
    if engine == "SIMD":
        assert core.IsOperator("GFtrl")
    return _build(model, GFtrlOptimizer(engine=engine, **kwargs))


def build_wngrad(
    model,
    base_learning_rate,
    parameters=None,
    max_gradient_norm=None,
    allow_lr_injection=False,
    **kwargs,
):
    return _build_with(
        WngradOptimizer,
        "alpha",
        model,
        base_learning_rate,
        max_gradient_norm,
        allow_lr_injection,
        kwargs,
    )


def build_storm(
    model,
    base_learning_rate,
    parameters=None,
    max_gradient_norm=None,
    allow_lr_injection=False,
    **kwargs,
):
    return _build_with(
        StormOptimizer,
        "lr",
        model,
        base_learning_rate,
        max_gradient_norm,
        allow_lr_injection,
        kwargs,
    )


def build_adadelta(
    model,
    base_learning_rate,
    parameters=None,
    max_gradient_norm=None,
    allow_lr_injection=False,
    **kwargs,
):
    return _build_with(
        AdadeltaOptimizer,
        "alpha",
        model,
        base_learning_rate,
        max_gradient_norm,
        allow_lr_injection,
        kwargs,
    )


def build_decay_adagrad(
    model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs
):
    return _build_with(
        DecayAdagradOptimizer,
        "alpha",
        model,
        base_learning_rate,
        max_gradient_norm,
        allow_lr_injection,
        kwargs,
    )


def build_yellowfin(model, base_learning_rate=0.1, **kwargs):
    return _build(model, YellowFinOptimizer(alpha=base_learning_rate, **kwargs))


def build_rms_prop(
    model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs
):
    return _build_with(
        RmsPropOptimizer,
        "alpha",
        model,
        base_learning_rate,
        max_gradient_norm,
        allow_lr_injection,
        kwargs,
    )
