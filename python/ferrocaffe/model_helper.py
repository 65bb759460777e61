"""Caffe2's ``model_helper``: ``ModelHelper`` keeps a training net, its parameter init net and
the bookkeeping of parameters and their gradients; ``ExtractPredictorNet`` cuts an inference
net out of a training net.

A model is usually filled with the ``brew`` helpers (``brew.fc(model, 'x', 'y', 4, 2)`` adds
the ``XavierFill``/``ConstantFill`` ops to ``model.param_init_net`` and the ``FC`` op to
``model.net``). Other operators can be added directly: ``model.Relu('y', 'z')`` forwards to
``model.net``; operators outside Caffe2's list of known-safe ones log a warning (or raise with
``allow_not_known_ops=False``).
"""

import logging

from ferrocaffe import core, scope
from ferrocaffe.core.operator import _not_registered_message
from ferrocaffe.modeling import parameter_info
from ferrocaffe.modeling.parameter_sharing import parameter_sharing_context
from ferrocaffe.optimizer_context import DEFAULT_OPTIM, OptimizerContext
from ferrocaffe.regularizer_context import RegularizerContext

__all__ = ["ModelHelper", "ExtractPredictorNet"]

logger = logging.getLogger(__name__)

# Operators that ModelHelper forwards to its net without a warning (Caffe2's list).
_known_working_ops = [
    "Accuracy",
    "Adam",
    "Add",
    "Adagrad",
    "SparseAdagrad",
    "Adadelta",
    "SparseAdadelta",
    "AveragedLoss",
    "Cast",
    "Checkpoint",
    "ConstantFill",
    "Copy",
    "CopyGPUToCPU",
    "CopyCPUToGPU",
    "DequeueBlobs",
    "EnsureCPUOutput",
    "ExpandDims",
    "Flatten",
    "FlattenToVec",
    "LabelCrossEntropy",
    "LearningRate",
    "MakeTwoClass",
    "MatMul",
    "NCCLAllreduce",
    "NHWC2NCHW",
    "PackSegments",
    "Print",
    "PRelu",
    "ReduceFrontSum",
    "Scale",
    "ScatterWeightedSum",
    "Sigmoid",
    "SortedSegmentSum",
    "Snapshot",
    "Softmax",
    "SoftmaxWithLoss",
    "SquaredL2Distance",
    "Squeeze",
    "StopGradient",
    "Summarize",
    "Tanh",
    "Transpose",
    "UnpackSegments",
    "WeightedSum",
    "YellowFin",
]


def _normalize_tags(tags):
    tags = tags or []
    return set(tags) if isinstance(tags, list) else {tags}


class ModelHelper:
    """A net (``net``), its init net (``param_init_net``, named ``<name>_init``) and the model's
    parameters.

    ``arg_scope`` holds the keyword arguments every brew helper receives (by default
    ``order='NCHW'``, ``use_cudnn=True``, ``cudnn_exhaustive_search=False``).
    ``param_model`` shares the init net and parameter lists of another model.
    """

    def __init__(
        self,
        name=None,
        init_params=True,
        allow_not_known_ops=True,
        skip_sparse_optim=False,
        param_model=None,
        arg_scope=None,
    ):
        self.name = name or "model"
        self.net = core.Net(self.name)

        if param_model is not None:
            self.param_init_net = param_model.param_init_net
            self.param_to_grad = param_model.param_to_grad
            self.params = param_model.params
            self._parameters_info = param_model._parameters_info
            self._computed_params = param_model._computed_params
        else:
            self.param_init_net = core.Net(self.name + "_init")
            self.param_to_grad = {}
            self.params = []
            self._parameters_info = {}
            self._computed_params = []

        self._param_info_deprecated = []
        self._devices = []
        self.gradient_ops_added = False
        self.init_params = init_params
        self.allow_not_known_ops = allow_not_known_ops
        self.skip_sparse_optim = skip_sparse_optim
        self.weights = []
        self.biases = []
        self._arg_scope = {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": False}
        if arg_scope is not None:
            self._arg_scope.update(arg_scope)

    @property
    def arg_scope(self):
        return self._arg_scope

    def get_name(self):
        return self.name

    # ----------------------------------------------------------------------- parameters
    def _infer_param_shape(self, param):
        """The ``shape`` argument of the init-net op that writes ``param``, or None."""
        for op in self.param_init_net.Proto().op:
            if str(param) in op.output:
                for arg in op.arg:
                    if arg.name == "shape":
                        return list(arg.ints)
        return None

    def _update_param_info_deprecated(self):
        assert len(self._param_info_deprecated) <= len(self.params)
        for param in self.params[len(self._param_info_deprecated) :]:
            if not isinstance(param, core.BlobReference):
                raise ValueError(f"Param {param} must be a BlobReference!")
            self._param_info_deprecated.append(
                parameter_info.ParameterInfo(
                    param_id=len(self._param_info_deprecated),
                    param=param,
                    shape=self._infer_param_shape(param),
                )
            )
        for info in self._param_info_deprecated:
            info.grad = self.param_to_grad.get(info.name)

    def _normalize_tags(self, tags):
        return _normalize_tags(tags)

    def create_param(self, param_name, shape, initializer, tags=None):
        """Create (or, if it exists, return) the parameter ``param_name``.

        A string name is put in the current name scope, as changed by ``ParameterSharing``; a
        BlobReference is used as it is. ``initializer.create_param`` adds the fill op(s) to
        ``param_init_net``. The parameter gets the optimizer of the ``UseOptimizer`` context for
        one of its tags, else the context's default one, and is recorded under its tags.
        """
        if isinstance(param_name, core.BlobReference):
            param_name = str(param_name)
        elif isinstance(param_name, str):
            param_name = parameter_sharing_context.get_parameter_name(param_name)
        else:
            raise TypeError("Unsupported type for param_name")

        if param_name in self._parameters_info:
            assert self._parameters_info[param_name].shape == shape
            return self._parameters_info[param_name].blob

        param_info = initializer.create_param(
            param_name=core.BlobReference(param_name),
            init_net=self.param_init_net,
            shape=shape,
        )
        optim_context = OptimizerContext.current()
        for tag in _normalize_tags(tags):
            if optim_context.has_optimizer(tag):
                param_info.optimizer = optim_context.get_optimizer(tag)
        if not param_info.optimizer and optim_context.has_optimizer(DEFAULT_OPTIM):
            param_info.optimizer = optim_context.get_optimizer(DEFAULT_OPTIM)
        param_info.regularizer = RegularizerContext.current()

        self._parameters_info[param_name] = param_info
        self.AddParameter(param_info.blob, tags)
        return param_info.blob

    def get_param_info(self, param):
        """The ParameterInfo of ``param`` (a BlobReference), or None."""
        assert isinstance(param, core.BlobReference), f"Param {param} is not a BlobReference"
        return self._parameters_info.get(param, None)

    def add_param_DEPRECATED(self, param, key=None, shape=None, length=None):
        """Record an existing blob as a parameter (the old API; prefer ``create_param``)."""
        logger.warning("add_param method is DEPRECATED")
        self._update_param_info_deprecated()
        self.AddParameter(param)
        if key is not None and self.net.input_record() is not None:
            idx = self.net.input_record().field_blobs().index(key)
            key = self.net.input_record().field_names()[idx]
        shape = shape if shape is not None else self._infer_param_shape(param)
        if not isinstance(param, core.BlobReference):
            raise ValueError(f"Param {param} must be a BlobReference!")
        self._param_info_deprecated.append(
            parameter_info.ParameterInfo(
                param_id=len(self._param_info_deprecated),
                param=param,
                shape=shape,
                key=key,
                length=length,
            )
        )
        return self._param_info_deprecated[-1]

    def AddParameter(self, param, tags=None):
        """Record ``param`` (a BlobReference): in ``params``, or in the computed parameters with
        the COMPUTED_PARAM tag; also in ``weights`` / ``biases`` for those tags."""
        assert isinstance(param, core.BlobReference)
        tags = _normalize_tags(tags)
        if parameter_info.ParameterTags.COMPUTED_PARAM in tags:
            self._computed_params.append(param)
        else:
            self.params.append(param)
        if parameter_info.ParameterTags.WEIGHT in tags:
            self.weights.append(param)
        if parameter_info.ParameterTags.BIAS in tags:
            self.biases.append(param)

    @staticmethod
    def _NormalizeNamescope(namescope):
        if namescope is None:
            return scope.CurrentNameScope()
        if namescope == "" or namescope.endswith(scope._NAMESCOPE_SEPARATOR):
            return namescope
        return namescope + scope._NAMESCOPE_SEPARATOR

    @staticmethod
    def _in_namescope(blobs, namescope):
        if namescope == "":
            return blobs[:]
        return [p for p in blobs if p.GetNameScope().startswith(namescope)]

    def GetParams(self, namescope=None, top_scope=False):
        """The parameters whose name scope starts with ``namescope`` (default: the current
        scope; '' = all)."""
        return self._in_namescope(self.params, ModelHelper._NormalizeNamescope(namescope))

    def GetComputedParams(self, namescope=None):
        """Like GetParams, for the parameters computed from data rather than optimized (the
        running statistics of SpatialBN)."""
        return self._in_namescope(self._computed_params, ModelHelper._NormalizeNamescope(namescope))

    def GetAllParams(self, namescope=None):
        return self.GetParams(namescope) + self.GetComputedParams(namescope)

    def _Validate(self):
        """Names that appear more than once in ``params`` (sorted)."""
        names = [str(p) for p in self.params]
        if len(set(names)) == len(names):
            return []
        dupes = []
        names = sorted(names)
        for previous, current in zip(names, names[1:], strict=False):
            if previous == current and current not in dupes:
                dupes.append(current)
        return dupes

    def Validate(self):
        dupes = self._Validate()
        assert dupes == [], f"Duplicate params: {dupes}"

    # ------------------------------------------------------------------------- nets
    def Proto(self):
        return self.net.Proto()

    def InitProto(self):
        return self.param_init_net.Proto()

    def RunAllOnGPU(self, *args, **kwargs):
        self.param_init_net.RunAllOnGPU(*args, **kwargs)
        self.net.RunAllOnGPU(*args, **kwargs)

    def CreateDB(self, blob_out, db, db_type, **kwargs):
        return self.param_init_net.CreateDB([], blob_out, db=db, db_type=db_type, **kwargs)

    def TensorProtosDBInput(self, unused_blob_in, blob_out, batch_size, db, db_type, **kwargs):
        """A ``CreateDB`` reader in the init net and a ``TensorProtosDBInput`` op reading it."""
        assert len(unused_blob_in) == 0, (
            "You cannot pass reader to model_helper.TensorProtosDBInput. "
            "Use model.net.TensorProtosDBInput instead to create the op."
        )
        from ferrocaffe.helpers.db_input import db_input

        return db_input(self, blob_out, batch_size, db, db_type, **kwargs)

    def GetDevices(self):
        assert len(self._devices) > 0, "Use data_parallel_model to run model on multiple GPUs."
        return self._devices

    def GetCompleteNet(self):
        """One net: a copy of ``param_init_net`` (each op's debug_info ending with
        '/param_init_net') followed by ``net``'s ops."""
        new_net = self.param_init_net.Clone(self.name + "_complete_net", keep_schema=True)
        for op in new_net.Proto().op:
            op.debug_info = op.debug_info + "/param_init_net"
        new_net.AppendNet(self.net)
        if self.net.Proto().HasField("type"):
            new_net.Proto().type = self.net.Proto().type
        return new_net

    def ConstructInitTrainNetfromNet(self, net):
        """Split a net made by ``GetCompleteNet`` back into ``param_init_net`` and ``net``."""
        param_op_mask = []
        train_op_mask = []
        for idx, op in enumerate(net.Proto().op):
            if op.debug_info.endswith("/param_init_net"):
                param_op_mask.append(idx)
            else:
                train_op_mask.append(idx)
        self.param_init_net = net.Clone(
            net.Name() + "/generated_param_init_net",
            keep_schema=True,
            op_id_mask=param_op_mask,
            update_external_list=True,
        )
        self.net = net.Clone(
            net.Name() + "/generated_net",
            keep_schema=True,
            op_id_mask=train_op_mask,
            update_external_list=True,
        )

    # -------------------------------------------------------------------- gradients
    def AddGradientOperators(self, *args, **kwargs):
        """Append the gradient ops of ``net`` (arguments as ``Net.AddGradientOperators``), fill
        ``param_to_grad`` and every parameter's ``ParameterInfo.grad``; returns the gradient
        map. Only once per model."""
        if self.gradient_ops_added:
            raise RuntimeError("You cannot run AddGradientOperators twice.")
        self.Validate()

        self.gradient_ops_added = True
        self.grad_map = self.net.AddGradientOperators(*args, **kwargs)
        self.param_to_grad = self.get_param_to_grad(self.params)

        for param, grad in self.param_to_grad.items():
            param_info = self.get_param_info(param)
            if param_info:
                param_info.grad = grad
            else:
                self._parameters_info[param] = parameter_info.ParameterInfo(
                    param_id=None, param=param, grad=grad
                )
        return self.grad_map

    def get_param_to_grad(self, params):
        """{param: gradient} for those of ``params`` that have a gradient."""
        if not self.gradient_ops_added:
            raise RuntimeError("You need to run AddGradientOperators first.")
        return {p: self.grad_map[str(p)] for p in params if str(p) in self.grad_map}

    def GetOptimizationParamInfo(self, params=None):
        """ParameterInfos of the parameters with a gradient (all, or those in ``params``);
        sparse ones are left out with ``skip_sparse_optim``."""
        if not self.gradient_ops_added:
            raise RuntimeError("Need to call AddGradientOperators first")
        param_to_grad = self.param_to_grad
        if params:
            param_to_grad = self.get_param_to_grad(params)
        return [
            self.get_param_info(param)
            for param, grad in param_to_grad.items()
            if not self.skip_sparse_optim or not isinstance(grad, core.GradientSlice)
        ]

    # --------------------------------------------------------------- op forwarding
    def __getattr__(self, op_type):
        """``model.OpType(...)`` adds that operator to ``model.net``."""
        if op_type.startswith("__"):
            raise AttributeError(op_type)
        state = self.__dict__
        if "net" not in state:
            raise AttributeError(op_type)
        if not core.IsOperator(op_type):
            raise AttributeError(_not_registered_message(op_type))
        if op_type not in _known_working_ops:
            if not state.get("allow_not_known_ops", True):
                raise AttributeError(f"Operator {op_type} is not known to be safe")
            logger.warning(
                "You are creating an op that the ModelHelper does not recognize: %s.", op_type
            )
        return state["net"].__getattr__(op_type)

    def __dir__(self):
        return sorted(set(dir(type(self))) | set(self.__dict__) | set(_known_working_ops))


def ExtractPredictorNet(
    net_proto,
    input_blobs,
    output_blobs,
    device=None,
    renames=None,
    disabled_inputs=None,
):
    """An inference net cut out of a training NetDef: returns ``(predict_net, params)``.

    Keeps, in order, the ops between the first one reading an input (StopGradient aside) and
    the last one writing an output whose inputs are all known (external inputs of the training
    net and ``input_blobs``, minus ``disabled_inputs``, plus what kept ops write). Gradient and
    data-reading ops fall out this way. ``device`` sets every kept op's device type and id
    (step nets of RecurrentNetwork ops too, whose ``backward_step_net`` is cleared);
    ``renames`` renames blobs. An op with ``is_test=0`` is an error: a training-mode net. The
    second result lists the predict net's external inputs that are not ``input_blobs``.

    Note that the ops kept are the training net's own messages (edited in place for
    RecurrentNetwork step nets and device options) as in Caffe2; external input and output
    lists come from Python sets and have no defined order.
    """
    predict_net = core.Net(net_proto.name + "_predict")
    predict_proto = predict_net.Proto()

    orig_external_inputs = set(net_proto.external_input)
    orig_external_outputs = set(net_proto.external_output)
    input_blobs = {str(b) for b in input_blobs}
    known_blobs = set(orig_external_inputs).union(input_blobs)
    output_blobs = {str(b) for b in output_blobs}
    external_inputs = set(input_blobs)
    external_outputs = set(output_blobs)
    renames = renames or {}
    if disabled_inputs is not None:
        known_blobs = known_blobs - set(disabled_inputs)

    ops = list(net_proto.op)
    readers = [
        j
        for j, op in enumerate(ops)
        if input_blobs.intersection(op.input) and op.type != "StopGradient"
    ]
    if not readers:
        raise Exception(f"No ops with input={input_blobs}")
    writers = [j for j, op in enumerate(ops) if output_blobs.intersection(op.output)]
    if not writers:
        raise Exception(f"No ops with output={output_blobs}")
    first_op_with_input, last_op_with_output = min(readers), max(writers)

    def rename_list(proto_list):
        renamed = [renames.get(b, b) for b in proto_list]
        del proto_list[:]
        proto_list.extend(renamed)

    def set_device(op):
        op.device_option.device_type = device.device_type
        op.device_option.device_id = device.device_id

    for op in ops[first_op_with_input : last_op_with_output + 1]:
        if not known_blobs.issuperset(op.input):
            logger.debug(
                "Op %s had unknown inputs: %s", op.type, set(op.input).difference(known_blobs)
            )
            continue
        if op.type == "RecurrentNetwork":
            for arg in op.arg:
                if arg.name == "backward_step_net":
                    arg.ClearField("n")
                elif arg.name == "step_net":
                    for step_op in arg.n.op:
                        rename_list(step_op.input)
                        rename_list(step_op.output)
                        if device is not None:
                            set_device(step_op)
                    rename_list(arg.n.external_input)
                    rename_list(arg.n.external_output)
                    external_inputs.update(
                        set(arg.n.external_input).intersection(orig_external_inputs)
                    )
        if device is not None:
            set_device(op)
        for arg in op.arg:
            if arg.name == "is_test" and arg.i == 0:
                raise Exception(
                    "An operator had is_test=0, did you try to extract a "
                    "predictor from a train model (instead of test model)?"
                    f" Op was: {op}"
                )
        predict_proto.op.extend([op])
        known_blobs.update(op.output)
        external_inputs.update(set(op.input).intersection(orig_external_inputs))
        external_outputs.update(set(op.output).intersection(orig_external_outputs))

    predict_proto.external_input.extend(external_inputs)
    predict_proto.external_output.extend(external_outputs)
    rename_list(predict_proto.external_input)
    rename_list(predict_proto.external_output)

    renamed_input_blobs = [renames.get(b, b) for b in input_blobs]
    for op in predict_proto.op:
        rename_list(op.input)
        rename_list(op.output)

    return predict_net, list(set(predict_proto.external_input) - set(renamed_input_blobs))
