"""Synchronous data-parallel training over several devices (and machines), as Caffe2's
``data_parallel_model``.

``Parallelize(model, input_builder_fun, forward_pass_builder_fun, optimizer_builder_fun=...)``
builds one copy of the model per device, under ``DeviceScope(device)`` and the name scope
``<prefix>_<id>`` (``cpu_0``, ``gpu_1``, ...), adds the gradient operators of every copy, sums
the gradients across the devices (and the shards of a ``rendezvous``), adds the parameter
updates and, in ``param_init_net``, copies the first device's initial parameters to the others.
The nets are the ones Caffe2 built, op for op.

Blob bookkeeping on the model:

* ``model._device_grouped_blobs``: unscoped name -> ``{device: BlobReference or GradientSlice}``
  for parameters, computed parameters, gradients and everything ``param_init_net`` writes per
  device;
* ``model._param_names``, ``model._computed_param_names``, ``model._grad_names``;
* ``model._devices``, ``model._device_prefix``, ``model._device_type``, ``model._rendezvous``,
  ``model._shared_model``, ``model._losses_by_gpu``, ``model._optimizer``;
* ``model._data_parallel_model_init_nets`` / ``_data_parallel_model_nets`` for ``RunInitNet``
  and ``RunNet``.

Several machines: ``rendezvous=dict(engine=..., shard_id=..., num_shards=..., kv_handler=...)``
adds ``CreateCommonWorld`` ops to ``param_init_net`` and ``Allreduce`` / ``Broadcast`` /
``Barrier`` ops with that engine to the nets. Each collective op takes every device's blob of
a group at once (inputs ``[common_world] + blobs``, outputs ``blobs``), the layout Caffe2 used
for its Gloo engine. The engines ferrocaffe runs are listed in ``COLLECTIVE_ENGINES`` (``MPI``);
any other engine is refused when the model is parallelized. An optional ``timeout_ms`` in the
rendezvous (not in Caffe2) sets the timeout of the common worlds of the Allreduce / Broadcast
ops (30 s otherwise); a shard that dies makes the others fail with an error naming the op once
it passes. The barrier before each training run keeps ``barrier_net_timeout_sec``.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections import OrderedDict

import numpy as np

from ferrocaffe import core, memonger, model_helper, scope, utils, workspace
from ferrocaffe.proto import caffe2_pb2

log = logging.getLogger("data_parallel_model")
log.setLevel(logging.INFO)

_DEFAULT_TIMEOUT_SEC = 30
_DEFAULT_BARRIER_NET_TIMEOUT_SEC = 300

# Engines whose collective operators (CreateCommonWorld, Allreduce, Broadcast, Allgather,
# Barrier) exist in ferrocaffe.
COLLECTIVE_ENGINES = ("MPI",)


def _check_rendezvous(rendezvous):
    """Refuse a rendezvous whose engine has no collective operators here (before any op is
    built), naming the engines there are."""
    if rendezvous is None:
        return
    for key in ("engine", "shard_id", "num_shards"):
        if key not in rendezvous:
            raise ValueError(f"data_parallel_model: rendezvous lacks {key!r}: {rendezvous!r}")
    engine = rendezvous["engine"]
    if engine not in COLLECTIVE_ENGINES:
        raise ValueError(
            f"data_parallel_model: rendezvous engine {engine!r} is not available in "
            f"ferrocaffe; the collective engines available are "
            f"{', '.join(repr(e) for e in COLLECTIVE_ENGINES)}"
        )


def _collective(net, op_type, inputs, outputs, **kwargs):
    """Add a collective operator to ``net``. It is built whether or not this process has the
    operator registered: the net is a description, run where the engine exists."""
    return net._CreateAndAddToSelf(op_type, inputs, outputs, **kwargs)


# ------------------------------------------------------------------------------ entry points
def Parallelize_GPU(*args, **kwargs):
    kwargs["cpu_device"] = False
    Parallelize(*args, **kwargs)


def Parallelize_CPU(*args, **kwargs):
    kwargs["cpu_device"] = True
    Parallelize(*args, **kwargs)


def Parallelize_iDeep(*args, **kwargs):
    kwargs["ideep"] = True
    Parallelize(*args, **kwargs)


def _assert_no_device_scope():
    current = scope.CurrentDeviceScope()
    assert current is None or current.device_type == caffe2_pb2.CPU, (
        f"Parallelize must be called without device-scope, device scope was: {current}"
    )


def _device_scoped(model, device):
    return core.DeviceScope(core.DeviceOption(model._device_type, device))


def _name_scoped(model, device):
    return core.NameScope(f"{model._device_prefix}_{device}")


def Parallelize(
    model_helper_obj,
    input_builder_fun,
    forward_pass_builder_fun,
    param_update_builder_fun=None,
    optimizer_builder_fun=None,
    post_sync_builder_fun=None,
    pre_grad_net_transformer_fun=None,
    net_transformer_fun=None,
    devices=None,
    rendezvous=None,
    net_type="dag",
    broadcast_computed_params=True,
    optimize_gradient_memory=False,
    dynamic_memory_management=False,
    blobs_to_keep=None,
    use_nccl=False,
    max_concurrent_distributed_ops=16,
    cpu_device=False,
    ideep=False,
    num_threads_per_device=4,
    shared_model=False,
    combine_spatial_bn=False,
    barrier_net_timeout_sec=_DEFAULT_BARRIER_NET_TIMEOUT_SEC,
):
    """Make ``model_helper_obj`` train on ``devices`` (GPU ids, or CPU ids with
    ``cpu_device=True``; default: every GPU, or one CPU device per core).

    ``input_builder_fun(model)`` and ``forward_pass_builder_fun(model, loss_scale)`` run once
    per device in its device and name scope; the latter returns the list of losses, which it
    should scale by ``loss_scale`` (1 / number of devices over all shards).
    ``optimizer_builder_fun(model)`` runs once, outside any scope, after the gradients are
    all-reduced (or ``param_update_builder_fun(model)`` once per device, in its scopes).
    ``pre_grad_net_transformer_fun(model)`` runs before the gradient ops are added,
    ``net_transformer_fun(model, num_devices, device_prefix, device_type)`` after;
    ``post_sync_builder_fun(model)`` runs per device after the initial parameter sync.
    ``shared_model`` (CPU only): every device computes with the first device's parameters.
    ``combine_spatial_bn``: training-mode SpatialBN statistics over all devices' batches.
    ``optimize_gradient_memory`` shares gradient blobs with ``memonger``.
    """
    _assert_no_device_scope()
    _check_rendezvous(rendezvous)
    model = model_helper_obj

    if devices is None:
        if cpu_device or ideep:
            devices = list(range(os.cpu_count() or 1))
        else:
            devices = list(range(workspace.NumCudaDevices()))

    if not (cpu_device or ideep):
        if any(d >= workspace.NumGpuDevices() for d in devices):
            log.warning(
                "** Only %d GPUs available, GPUs %s requested", workspace.NumGpuDevices(), devices
            )
        model._device_type = workspace.GpuDeviceType
        model._device_prefix = "gpu"
        model._shared_model = False
        device_name = "GPU"
        assert shared_model is False, "Shared model only supported on CPU"
    elif ideep:
        model._device_type = caffe2_pb2.IDEEP
        model._device_prefix = "ideep"
        model._shared_model = shared_model
        device_name = "IDEEP"
    else:
        model._device_type = caffe2_pb2.CPU
        model._device_prefix = "cpu"
        model._shared_model = shared_model
        device_name = "CPU"
    if shared_model and rendezvous is not None:
        log.warning("Shared model only supported on single-node currently")

    log.info("Parallelizing model for devices: %s", devices)
    num_workers = len(devices) * num_threads_per_device + (8 if rendezvous is not None else 0)
    max_concurrent_distributed_ops = min(max_concurrent_distributed_ops, num_workers - 1)
    model.net.Proto().num_workers = num_workers
    model.net.Proto().type = net_type

    model._devices = devices
    model._rendezvous = rendezvous
    model._sync_barrier_net = None
    model._broadcast_context = None
    model._grad_names = []

    assert isinstance(model, model_helper.ModelHelper)

    # Parameters the model had before: not data parallel.
    non_datapar_params = copy.copy(model.params)

    num_shards = 1 if rendezvous is None else rendezvous["num_shards"]
    loss_scale = 1.0 / (len(devices) * num_shards)

    has_parameter_updates = (
        param_update_builder_fun is not None or optimizer_builder_fun is not None
    )
    assert param_update_builder_fun is None or optimizer_builder_fun is None, (
        "Can only specify one of param_update_builder_fun, optimizer_builder_fun"
    )
    if not has_parameter_updates and model.init_params:
        log.warning(
            "Model %s is used for testing/validation but has init_params=True: running its "
            "param_init_net would overwrite the trained parameters; use "
            "ModelHelper(init_params=False)",
            model.name,
        )

    losses_by_gpu = {}
    for device in devices:
        with _device_scoped(model, device), _name_scoped(model, device):
            log.info("Model for %s : %s", device_name, device)
            input_builder_fun(model)
            losses = forward_pass_builder_fun(model, loss_scale)
            if has_parameter_updates:
                assert isinstance(losses, list), (
                    "Model builder function must return list of loss blobs"
                )
                for loss in losses:
                    assert isinstance(loss, core.BlobReference), (
                        "Model builder func must return list of loss blobs"
                    )
            losses_by_gpu[device] = losses
    _ValidateParams(model.params)

    model._device_grouped_blobs = _GroupByDevice(model, devices, model.params, non_datapar_params)
    computed_params_grouped = _GroupByDevice(model, devices, model.GetComputedParams(""), [])
    model._device_grouped_blobs.update(computed_params_grouped)
    model._param_names = list(model._device_grouped_blobs)
    model._computed_param_names = list(computed_params_grouped)

    if pre_grad_net_transformer_fun:
        pre_grad_net_transformer_fun(model)

    if has_parameter_updates:
        log.info("Adding gradient operators")
        _AddGradientOperators(devices, model, losses_by_gpu)

    if net_transformer_fun:
        net_transformer_fun(model, len(devices), model._device_prefix, model._device_type)

    if not has_parameter_updates:
        log.info("Parameter update function not defined --> only forward")
        _InferBlobDevice(model)
        return

    if combine_spatial_bn:
        _InterleaveOps(model)
        if cpu_device:
            _CPUInterDeviceBatchNormalization(model)
        else:
            _GPUInterDeviceBatchNormalization(model)

    _ValidateParams(model.params)

    param_to_grad = model.param_to_grad
    grads_ordered = [param_to_grad[p] for p in model.params if p in param_to_grad]
    non_datapar_grads = [param_to_grad[p] for p in non_datapar_params]
    gradients_grouped = _GroupByDevice(model, devices, grads_ordered, non_datapar_grads)
    model._device_grouped_blobs.update(gradients_grouped)
    model._grad_names = list(gradients_grouped)
    model._losses_by_gpu = losses_by_gpu

    _InferBlobDevice(model)

    log.info("Add gradient all-reduces for SyncSGD")
    if broadcast_computed_params:
        _BroadcastComputedParams(devices, model, rendezvous, use_nccl)

    if model._grad_names:
        reverse_ordered_grads = _GetReverseOrderedGrads(model)
        _AllReduceBlobs(
            reverse_ordered_grads,
            devices,
            model,
            model.net,
            rendezvous,
            use_nccl,
            max_concurrent_distributed_ops,
        )
    else:
        log.info("NOTE: Param builder function did not create any parameters.")

    all_params = set(model.GetParams(""))
    if shared_model:
        _PruneParametersForSharing(model)

    if param_update_builder_fun is not None:
        for device in devices:
            with _device_scoped(model, device), _name_scoped(model, device):
                param_update_builder_fun(model)
    else:
        log.info("Calling optimizer builder function")
        model._optimizer = optimizer_builder_fun(model)

    sync_blobs, sync_names = _ComputeBlobsToSync(model)
    model._device_grouped_blobs.update(_GroupByDevice(model, devices, sync_blobs, []))

    _InferBlobDevice(model)
    _AnalyzeOperators(model)

    # The dag net runs its first iteration on one worker (allocations, NCCL).
    model.Proto().arg.extend([utils.MakeArgument("first_iter_only_one_worker", 1)])

    log.info("Add initial parameter sync")
    _SyncAllParams(
        devices,
        model,
        model.param_init_net,
        model.param_init_net,
        rendezvous,
        sync_names,
        max_concurrent_distributed_ops=1,
    )

    if post_sync_builder_fun is not None:
        for device in devices:
            with _device_scoped(model, device), _name_scoped(model, device):
                post_sync_builder_fun(model)

    assert not (optimize_gradient_memory and dynamic_memory_management), (
        "It is not advised to use gradient optimization ('memonger') with dynamic memory "
        "management."
    )
    if optimize_gradient_memory:
        _OptimizeGradientMemorySimple(model, losses_by_gpu, devices)
    if dynamic_memory_management:
        _AddDynamicMemoryOptimization(model, blobs_to_keep, devices)

    model._data_parallel_model_init_nets = [model.param_init_net]
    model._data_parallel_model_nets = [model.net]
    _AddBarrierToModelNets(model, barrier_net_timeout_sec)

    if shared_model:
        _RemapParameterBlobsForSharedModel(model, all_params)


def Parallelize_GPU_BMUF(*args, **kwargs):
    kwargs["cpu_device"] = False
    Parallelize_BMUF(*args, **kwargs)


def Parallelize_CPU_BMUF(*args, **kwargs):
    kwargs["cpu_device"] = True
    Parallelize_BMUF(*args, **kwargs)


def Parallelize_BMUF(
    model_helper_obj,
    input_builder_fun,
    forward_pass_builder_fun,
    param_update_builder_fun,
    block_learning_rate=1.0,
    block_momentum=None,
    devices=None,
    rendezvous=None,
    net_type="dag",
    master_device=None,
    use_nccl=False,
    nesterov=False,
    optimize_gradient_memory=False,
    reset_momentum_sgd=False,
    warmup_iterations=None,
    max_concurrent_distributed_ops=4,
    add_blobs_to_sync=None,
    num_threads_per_device=4,
    cpu_device=False,
    barrier_net_timeout_sec=_DEFAULT_BARRIER_NET_TIMEOUT_SEC,
):
    """Block-wise model-update filtering (Chen & Huo, ICASSP 2016): every device trains its own
    copy with ``param_update_builder_fun`` for a number of iterations of ``model.net``; then
    ``model._global_model_param_updates_net`` (run once) averages the copies and applies a
    block momentum step to the global model (``<param>_g``, momentum ``<param>_v``), which is
    copied back to every device. ``model._global_model_init_net`` initializes the global model
    (run with ``param_init_net``: ``RunInitNet``)."""
    _assert_no_device_scope()
    _check_rendezvous(rendezvous)
    model = model_helper_obj
    assert isinstance(model, model_helper.ModelHelper)

    if devices is None:
        devices = list(range(workspace.NumGpuDevices()))
    if master_device is None:
        master_device = devices[0]

    if not cpu_device:
        if any(d >= workspace.NumGpuDevices() for d in devices):
            log.warning(
                "** Only %d GPUs available, GPUs %s requested", workspace.NumGpuDevices(), devices
            )
        model._device_type = workspace.GpuDeviceType
        model._device_prefix = "gpu"
    else:
        model._device_type = caffe2_pb2.CPU
        model._device_prefix = "cpu"

    model._devices = devices
    model._rendezvous = rendezvous
    model._sync_barrier_net = None
    model._broadcast_context = None
    model._shared_model = False
    master_dev_opt = core.DeviceOption(model._device_type, master_device)

    num_shards = rendezvous["num_shards"] if rendezvous else 1
    num_devices = len(devices) * num_shards
    num_workers = num_threads_per_device * len(devices) + (8 if rendezvous else 0)
    loss_scale = 1.0 / num_devices
    if block_momentum is None:
        block_momentum = 1.0 - 1.0 / num_devices
    max_concurrent_distributed_ops = min(max_concurrent_distributed_ops, num_workers - 1)

    model.net.Proto().num_workers = num_workers
    model.net.Proto().type = net_type

    def side_net(name):
        net = core.Net(name)
        net.Proto().type = net_type
        net.Proto().num_workers = num_workers
        return net

    model._global_model_init_net = side_net("global_model_init")
    model._global_model_param_updates_net = side_net("global_model")

    def velocity(p):
        return f"{p}_v"

    def global_copy(p):
        return f"{p}_g"

    def previous_velocity(p):
        return f"{p}_prev"

    non_datapar_params = copy.copy(model.params)
    model._losses_by_gpu = {}

    def build_model(device):
        input_builder_fun(model)
        model._losses_by_gpu[device] = forward_pass_builder_fun(model, loss_scale)

    _ForEachDevice(devices, build_model, model._device_type, model._device_prefix, scoped=True)
    _ValidateParams(model.params)

    model._device_grouped_blobs = _GroupByDevice(model, devices, model.params, non_datapar_params)
    model._param_names = list(model._device_grouped_blobs)

    _AddGradientOperators(devices, model, model._losses_by_gpu)
    _ValidateParams(model.params)
    _InferBlobDevice(model)

    _ForEachDevice(
        devices,
        lambda _device: param_update_builder_fun(model),
        model._device_type,
        model._device_prefix,
        scoped=True,
    )

    param_names = list(model._device_grouped_blobs)
    if warmup_iterations is not None:
        model._warmup_iterations = warmup_iterations
        model._warmup_broadcast = side_net("warmup-broadcast")
        _SyncAllParams(
            devices,
            model,
            model.param_init_net,
            model._warmup_broadcast,
            rendezvous,
            param_names,
            max_concurrent_distributed_ops,
        )
        for name in param_names:
            param = model._device_grouped_blobs[name][master_device]
            with core.DeviceScope(master_dev_opt):
                model._warmup_broadcast.Copy(param, global_copy(param))

    init_net = model._global_model_init_net
    for name in param_names:
        param = model._device_grouped_blobs[name][master_device]
        with core.DeviceScope(master_dev_opt):
            init_net.ConstantFill(param, velocity(param), value=0.0)
            init_net.Copy(param, global_copy(param))
            if nesterov:
                init_net.ConstantFill(param, previous_velocity(param), value=0.0)

    updates = model._global_model_param_updates_net
    # The sum of every device's (and shard's) copy, on each device.
    _AllReduceBlobs(
        param_names,
        devices,
        model,
        updates,
        rendezvous,
        use_nccl,
        max_concurrent_distributed_ops,
    )
    for name in param_names:
        param = model._device_grouped_blobs[name][master_device]
        v, g, v_prev = velocity(param), global_copy(param), previous_velocity(param)
        with core.DeviceScope(master_dev_opt):
            # param <- block_lr * (mean - global); v <- block_momentum * v + param
            updates.Scale(param, param, scale=1.0 / num_devices)
            updates.Sub([param, g], param)
            updates.Scale(param, param, scale=block_learning_rate)
            updates.Scale(v, v, scale=block_momentum)
            updates.Add([v, param], v)
            updates.Add([g, v], g)
            if nesterov:
                updates.Sub([v, v_prev], v_prev)
                updates.Scale(v_prev, v_prev, scale=block_momentum)
                updates.Sub([g, v_prev], g)
                updates.Copy(v, v_prev)
            updates.Copy(g, param)

    _SyncAllParams(
        devices,
        model,
        model.param_init_net,
        updates,
        rendezvous,
        param_names,
        max_concurrent_distributed_ops,
    )

    if add_blobs_to_sync is not None:
        AddBlobSync(model, add_blobs_to_sync, net=updates)

    if reset_momentum_sgd:
        for op in [op for op in model.net.Proto().op if op.type == "MomentumSGDUpdate"]:
            momentum_blob = op.input[1]
            with core.DeviceScope(op.device_option):
                updates.ConstantFill([momentum_blob], momentum_blob, value=0.0)

    if optimize_gradient_memory:
        _OptimizeGradientMemorySimple(model, model._losses_by_gpu, devices)

    model._data_parallel_model_init_nets = [model.param_init_net, model._global_model_init_net]
    model._data_parallel_model_nets = [model.net, (updates, 1)]
    _AddBarrierToModelNets(model, barrier_net_timeout_sec)


# ------------------------------------------------------------------------- running the nets
def CreateNet(model, overwrite=False):
    for entry in model._data_parallel_model_nets:
        net = entry[0] if isinstance(entry, tuple) else entry
        workspace.CreateNet(net, overwrite=overwrite)


def RunInitNet(model):
    for init_net in model._data_parallel_model_init_nets:
        workspace.RunNetOnce(init_net)
    CreateNet(model)


def RunWarmup(model):
    workspace.RunNet(model.net, model._warmup_iterations)
    workspace.RunNetOnce(model._warmup_broadcast)


def RunNet(model, num_iterations):
    """Run each of the model's nets: the training net ``num_iterations`` times, a net listed
    with its own count (BMUF's global update net) that many times."""
    for entry in model._data_parallel_model_nets:
        if isinstance(entry, tuple):
            workspace.RunNet(entry[0].Proto().name, entry[1])
        else:
            workspace.RunNet(entry, num_iterations)


def GetDevices(model):
    return model.GetDevices()


# ----------------------------------------------------------------------------- barrier nets
def _AddBarrierToModelNets(model, barrier_net_timeout_sec):
    """With a rendezvous, put a barrier before the training net (and the common world it uses
    before the init nets), so that the shards start each run together."""
    if model._rendezvous is None or model._rendezvous["engine"] not in COLLECTIVE_ENGINES:
        return
    model._barrier_init_net = core.Net("barrier_init_net")
    model._barrier_net = _CreateBarrierNet(
        model, model._barrier_init_net, "pre_training", barrier_net_timeout_sec
    )
    model._data_parallel_model_init_nets.insert(0, model._barrier_init_net)
    model._data_parallel_model_nets.insert(0, model._barrier_net)


def _CreateBarrierNet(model, init_net, name_prefix, timeout_sec):
    log.info("Creating barrier net")
    _check_rendezvous(model._rendezvous)
    comm_world = _CreateOrCloneCommonWorld(
        init_net,
        name_prefix + "_barrier_cw",
        rendezvous=model._rendezvous,
        timeout_sec=timeout_sec,
    )
    barrier_net = core.Net(name_prefix + "_barrier_net")
    _collective(barrier_net, "Barrier", [comm_world], [], engine=model._rendezvous["engine"])
    return barrier_net


def Synchronize(model, timeout_sec=_DEFAULT_BARRIER_NET_TIMEOUT_SEC):
    """Deprecated: run a barrier over the shards (Parallelize adds one before training)."""
    warnings.warn(
        "data_parallel_model.Synchronize is deprecated: Parallelize adds a barrier net that "
        "runs before training (timeout: its barrier_net_timeout_sec argument, 300 s)",
        category=DeprecationWarning,
        stacklevel=2,
    )
    if model._rendezvous is None or model._rendezvous["num_shards"] <= 1:
        return
    if model._sync_barrier_net is None:
        barrier_init_net = core.Net("sync_barrier_init_net")
        model._sync_barrier_net = _CreateBarrierNet(model, barrier_init_net, "sync", timeout_sec)
        workspace.RunNetOnce(barrier_init_net)
        workspace.CreateNet(model._sync_barrier_net)
        model._sync_barrier_net_timeout = timeout_sec
    assert model._sync_barrier_net_timeout == timeout_sec, (
        f"Must use fixed timeout, {model._sync_barrier_net_timeout} != {timeout_sec}"
    )
    log.info("Synchronize run barrier net.")
    workspace.RunNet(model._sync_barrier_net)


# --------------------------------------------------------------------------- net utilities
def ConvertNetForDevice(net, device=None):
    """A copy of ``net`` whose blobs get the name scope of ``device`` (default: the current
    device scope), ``gpu_<id>/``, ``ideep_<id>/`` or ``cpu_<id>/``, and whose ops run on it;
    for appending another model's nets inside a forward-pass builder."""
    converted = copy.deepcopy(net)
    if device is None:
        device = scope.CurrentDeviceScope()
    if device is None:
        raise ValueError("ConvertNetForDevice: no device given and no current device scope")
    if core.IsGPUDeviceType(device.device_type):
        prefix = "gpu"
    elif device.device_type == caffe2_pb2.IDEEP:
        prefix = "ideep"
    else:
        prefix = "cpu"
    namescope = f"{prefix}_{device.device_id}/"
    proto = converted.Proto()
    for op in proto.op:
        if "RecurrentNetwork" in op.type:
            # Deliberate, as in Caffe2: a RecurrentNetwork's step nets live in its arguments
            # and are not renamed here, so converting it would leave them on the old device.
            # Caffe2 raised this type and message, which callers may catch.
            raise NotImplementedError("RecurrentNetwork conversion not yet supported")
        for field in (op.input, op.output, op.control_input):
            _prefix_all(field, namescope)
        op.device_option.CopyFrom(device)
    for field in (proto.external_input, proto.external_output):
        _prefix_all(field, namescope)
    return converted


def _prefix_all(field, prefix):
    names = [prefix + b for b in field]
    del field[:]
    field.extend(names)


def _ForEachDevice(devices, f, device_type, device_prefix, scoped=False, *args, **kwargs):
    for device in devices:
        with core.DeviceScope(core.DeviceOption(device_type, device)):
            if scoped:
                with core.NameScope(f"{device_prefix}_{device}"):
                    f(device, *args, **kwargs)
            else:
                f(device, *args, **kwargs)


def _AddGradientOperators(devices, model, losses_by_gpu):
    """Seed each device's losses with a ConstantFill of 1 on that device, then add the
    gradient operators of all of them at once."""
    loss_grad = {}
    for device in devices:
        with core.DeviceScope(core.DeviceOption(model._device_type, device)):
            for loss in losses_by_gpu[device]:
                seed = model.ConstantFill(loss, str(loss) + "_grad", value=1.0)
                loss_grad[str(loss)] = str(seed)
    model.AddGradientOperators(loss_grad)


def ExtractPredictorNet(model, inputs, outputs, device):
    """``(predict_net, export_blobs)``: the first device's forward pass with ``inputs`` and
    ``outputs`` (unscoped names) renamed to drop the device prefix."""
    prefix = f"{model._device_prefix}_{model._devices[0]}/"
    scoped_inputs = [prefix + str(b) for b in inputs]
    scoped_outputs = [prefix + str(b) for b in outputs]
    renames = dict(
        zip(
            scoped_inputs + scoped_outputs,
            [str(b) for b in inputs] + [str(b) for b in outputs],
            strict=True,
        )
    )
    return model_helper.ExtractPredictorNet(
        net_proto=model.net.Proto(),
        input_blobs=scoped_inputs,
        output_blobs=scoped_outputs,
        device=device,
        renames=renames,
    )


def GetCheckpointParams(model):
    """The blobs a checkpoint needs (a set): the first device's synchronized blobs and the
    iteration counters written outside the device scopes."""
    all_blobs, _ = _ComputeBlobsToSync(model)
    first = f"{model._device_prefix}_{model._devices[0]}/"
    blobs = {b for b in all_blobs if str(b).startswith(first)}
    for op in model.net.Proto().op:
        if op.type in ("Iter", "AtomicIter"):
            if not op.output[0].startswith(model._device_prefix + "_"):
                blobs.add(op.output[0])
    return blobs


def FinalizeAfterCheckpoint(model, blobs=None, cpu_mode=False):
    """After loading a checkpoint (the first device's blobs), copy them to the other devices
    (and shards): builds ``checkpoint_sync_net`` on the first call, then runs it."""
    if not hasattr(model, "_checkpoint_net"):
        if blobs is None:
            _, names = _ComputeBlobsToSync(model)
        else:
            names = [stripBlobName(b) for b in blobs]
        devices = model.GetDevices()
        # The blobs may be more than parameters (momentum, ...): group them too.
        for name in names:
            if name not in model._device_grouped_blobs:
                model._device_grouped_blobs[name] = {
                    d: core.BlobReference(
                        f"{model._device_prefix}_{d}{scope._NAMESCOPE_SEPARATOR}{name}"
                    )
                    for d in devices
                }
        log.info("Creating checkpoint synchronization net")
        model._checkpoint_net = core.Net("checkpoint_sync_net")
        if not cpu_mode:
            model._checkpoint_net.RunAllOnGPU()
        checkpoint_init_net = None
        if model._rendezvous is not None and model._rendezvous["num_shards"] > 1:
            checkpoint_init_net = core.Net("checkpoint_init_net")
            if not cpu_mode:
                checkpoint_init_net.RunAllOnGPU()
        _SyncAllParams(
            devices,
            model,
            checkpoint_init_net,
            model._checkpoint_net,
            model._rendezvous,
            names,
            max_concurrent_distributed_ops=1,
        )
        if checkpoint_init_net is not None:
            workspace.RunNetOnce(checkpoint_init_net)
        workspace.CreateNet(model._checkpoint_net)
    log.info("Run checkpoint net")
    workspace.RunNet(model._checkpoint_net.Proto().name)


def GetLearningRateBlobNames(model):
    """The learning-rate blobs of the model's optimizer: one on the CPU, or one per GPU;
    without an optimizer object, the outputs of the net's LearningRate ops."""
    opt = getattr(model, "_optimizer", None)
    if opt is not None:
        if model._device_type in (caffe2_pb2.CPU, caffe2_pb2.IDEEP):
            return [opt.get_cpu_blob_name("lr")]
        if core.IsGPUDeviceType(model._device_type):
            return [opt.get_gpu_blob_name("lr", gpu, "") for gpu in model._devices]
        raise Exception(f"Unsupported device type : {model._device_type}")
    return [op.output[0] for op in model.net.Proto().op if op.type == "LearningRate"]


# ------------------------------------------------------------------ reductions and copies
def _Broadcast(devices, model, net, param, use_nccl=False):
    """Copy the first device's ``param`` to the other devices."""
    master = devices[0]
    group = model._device_grouped_blobs[param]
    if use_nccl and _IsGPUBlob(model, param):
        with core.DeviceScope(core.DeviceOption(model._device_type, master)):
            # root is a rank in the group, not a device id.
            blobs = list(group.values())
            _collective(net, "NCCLBroadcast", blobs, blobs, root=0)
            return
    for device in devices[1:]:
        if _IsGPUBlob(model, param):
            option = core.DeviceOption(workspace.GpuDeviceType, device)
        elif _IsIDEEPBlob(model, param):
            option = core.DeviceOption(caffe2_pb2.IDEEP, 0)
        else:
            option = core.DeviceOption(caffe2_pb2.CPU, 0)
        with core.DeviceScope(option):
            net.Copy(group[master], group[device])


def _AllReduce(devices, model, net, param, use_nccl=False, control_input=None):
    """Sum the GPU copies of ``param`` into the first device's (a tree of Sum ops for 4, 8 and
    16 devices) and broadcast the result."""
    blobs_group = list(model._device_grouped_blobs[param].values())
    if model._device_type == caffe2_pb2.CUDA and use_nccl:
        _collective(
            model.net, "NCCLAllreduce", blobs_group, blobs_group, control_input=control_input
        )
        return

    peer_access = None
    if model._device_type == workspace.GpuDeviceType:
        peer_access = workspace.GetGpuPeerAccessPattern()

    def sum_into_first(*indices):
        targets = [model._devices[i] for i in indices]
        blobs = [blobs_group[i] for i in indices]
        with core.DeviceScope(core.DeviceOption(model._device_type, targets[0])):
            for k, peer in enumerate(targets[1:], 1):
                if (
                    peer_access is not None
                    and peer_access.size
                    and not peer_access[targets[0], peer]
                ):
                    blobs[k] = model.Copy(blobs[k], f"gpu_{targets[0]}/{param}_gpu{peer}_copy")
            net.Sum(blobs, [blobs[0]], name="dpm")

    n = len(devices)
    if n in (4, 8, 16):
        # Pairwise tree: stride 1, 2, 4, ... within the group.
        stride = 1
        while stride < n:
            for start in range(0, n, 2 * stride):
                sum_into_first(start, start + stride)
            stride *= 2
    else:
        sum_into_first(*range(n))
    _Broadcast(devices, model, net, param)


def _SyncAllParams(
    devices,
    model,
    init_net,
    net,
    rendezvous,
    unique_param_names,
    max_concurrent_distributed_ops=4,
):
    if rendezvous is None or rendezvous["num_shards"] <= 1:
        _SyncAllParamsSingleHost(devices, model, net, unique_param_names)
    else:
        _SyncAllParamsDistributed(
            devices,
            model,
            init_net,
            net,
            rendezvous,
            unique_param_names,
            max_concurrent_distributed_ops,
        )


def AddBlobSync(model, blobs, net=None):
    """Keep the unscoped ``blobs`` in sync across devices (and shards): the first device's copy
    is broadcast in ``net`` (default: the training net)."""
    if len(blobs) == 0:
        return
    net = model.net if net is None else net
    for b in blobs:
        assert not b.startswith(model._device_prefix), f"Provide unprefixed blob name: {b}"
        model._device_grouped_blobs[b] = {
            d: core.BlobReference(f"{model._device_prefix}_{d}/{b}") for d in model._devices
        }
    _SyncAllParams(model._devices, model, model.param_init_net, net, model._rendezvous, set(blobs))


def AddDistributedBlobSync(model, blobs):
    """All-reduce ``blobs`` across the shards (not across the devices of one shard)."""
    if model._rendezvous is None:
        return
    synth_name = "_".join(str(b) for b in blobs)
    comm_world = _CreateOrCloneCommonWorld(
        model.param_init_net, "blob_sync_cw_" + synth_name, rendezvous=model._rendezvous
    )
    _collective(
        model.net,
        "Allreduce",
        [comm_world] + list(blobs),
        list(blobs),
        engine=model._rendezvous["engine"],
    )


def _device_option_of(model, blob_name):
    if _IsGPUBlob(model, blob_name):
        return core.DeviceOption(model._device_type, model._devices[0])
    if _IsIDEEPBlob(model, blob_name):
        return core.DeviceOption(caffe2_pb2.IDEEP)
    return core.DeviceOption(caffe2_pb2.CPU)


def _SyncAllParamsDistributed(
    devices,
    model,
    init_net,
    net,
    rendezvous,
    unique_param_names,
    max_concurrent_distributed_ops,
):
    """One Broadcast op per blob (all devices' copies, from rank 0), with the engine of the
    rendezvous, in sorted name order; the common worlds go to ``init_net``."""
    assert rendezvous["num_shards"] > 1
    _check_rendezvous(rendezvous)
    if model._broadcast_context is None:
        model._broadcast_context = CollectivesConcurrencyControl(
            "broadcast", max_concurrent_distributed_ops, init_net, rendezvous
        )
    context = model._broadcast_context
    for name in sorted(unique_param_names):
        group = list(model._device_grouped_blobs[name].values())
        with core.DeviceScope(_device_option_of(model, name)):
            comm_world, control_input = context.get_control_and_context(group)
            _collective(
                net,
                "Broadcast",
                [comm_world] + group,
                group,
                name=name,
                engine=rendezvous["engine"],
                control_input=control_input,
            )


def _SyncAllParamsSingleHost(devices, model, net, unique_param_names):
    for param in unique_param_names:
        _Broadcast(devices, model, net, param)


def _AllReduceBlobs(
    blob_names, devices, model, net, rendezvous, use_nccl, max_concurrent_distributed_ops
):
    if rendezvous is None or rendezvous["num_shards"] <= 1:
        _AllReduceBlobsSingleHost(blob_names, devices, model, net, use_nccl)
    else:
        _AllReduceBlobsDistributed(
            blob_names, devices, model, net, rendezvous, max_concurrent_distributed_ops
        )


def _PruneParametersForSharing(model):
    """Shared model: only the first device's parameters get updates."""
    assert model._shared_model
    master_prefix = f"{model._device_prefix}_{model._devices[0]}/"
    model.params = model.GetParams(master_prefix)
    kept = set(model.params)
    model.param_to_grad = {p: g for p, g in model.param_to_grad.items() if p in kept}
    model.weights = [w for w in model.weights if w in kept]
    model.biases = [b for b in model.biases if b in kept]


def _RemapParameterBlobsForSharedModel(model, all_params):
    """Shared model: drop the ops that write another device's parameters and make every op
    read the first device's parameters instead."""
    assert model._shared_model
    master_prefix = f"{model._device_prefix}_{model._devices[0]}/"
    log.info("Remapping param blobs to master -> %s", master_prefix)
    master_params = set(model.GetParams())
    others = {str(p) for p in all_params} - {str(p) for p in master_params}

    def remap(net):
        kept = []
        for op in net.Proto().op:
            if any(o in others for o in op.output):
                continue
            op.input[:] = [master_prefix + stripBlobName(i) if i in others else i for i in op.input]
            kept.append(op)
        del net.Proto().op[:]
        net.Proto().op.extend(kept)

    remap(model.param_init_net)
    remap(model.net)


class CollectivesConcurrencyControl:
    """Hands out common worlds for collective ops: up to ``max_concurrent_context`` of them are
    created (``<name>_<slot>_cw``, in ``param_init_net``); after that they are reused in turn,
    each new op getting the previous user of its world as control input, so that the ops of
    one world run one after the other."""

    def __init__(self, name, max_concurrent_context, param_init_net, rendezvous):
        self.name = name
        self.param_init_net = param_init_net
        self.max_concurrent_context = max_concurrent_context
        self.counter = 0
        self.common_worlds = []
        self.control_inputs = []
        self.rendezvous = rendezvous

    def get_control_and_context(self, control_output_blob):
        slot = self.counter % self.max_concurrent_context
        control_input = None
        if len(self.common_worlds) < self.max_concurrent_context:
            common_world = _CreateOrCloneCommonWorld(
                self.param_init_net, f"{self.name}_{slot}_cw", rendezvous=self.rendezvous
            )
            self.common_worlds.append(common_world)
            self.control_inputs.append(control_output_blob)
        else:
            common_world = self.common_worlds[slot]
            control_input = self.control_inputs[slot]
            self.control_inputs[slot] = control_output_blob
        self.counter += 1
        return common_world, control_input


def _AllReduceBlobsDistributed(
    blob_names, devices, model, net, rendezvous, max_concurrent_distributed_ops
):
    """One Allreduce op per gradient over every device's copy and every shard, on the first
    device, with the engine of the rendezvous."""
    _check_rendezvous(rendezvous)
    assert model.net.Proto().num_workers > 1, "Please specify more than 1 worker"
    engine = rendezvous["engine"]
    master_device_opt = core.DeviceOption(model._device_type, devices[0])
    context = CollectivesConcurrencyControl(
        "allreduce", max_concurrent_distributed_ops, model.param_init_net, rendezvous
    )
    for blob_name in blob_names:
        master_blob = model._device_grouped_blobs[blob_name][devices[0]]
        group = list(model._device_grouped_blobs[blob_name].values())
        assert master_blob in group
        assert not isinstance(group[0], core.GradientSlice), (
            f"Synchronizing gradient slices not supported across shards ({blob_name})"
        )
        with core.DeviceScope(master_device_opt):
            comm_world, control_input = context.get_control_and_context(group[0])
            _collective(
                net,
                "Allreduce",
                [comm_world] + group,
                group,
                name=blob_name,
                engine=engine,
                control_input=control_input,
                gpu_direct=(rendezvous.get("transport", None) == "ibverbs"),
            )


def _AllReduceBlobsSingleHost(blob_names, devices, model, net, use_nccl):
    """Sum each gradient over the devices into the first device's copy and copy it back
    (GPU dense: ``_AllReduce``; GPU sparse: Concat of the slices, copied to every device)."""
    if len(devices) == 1:
        return
    master_device_opt = core.DeviceOption(model._device_type, devices[0])
    last_out = None
    concatenated_idx = set()

    for blob_name in blob_names:
        group = model._device_grouped_blobs[blob_name]
        blobs_group = list(group.values())
        if len(blobs_group) == 1:
            continue
        assert len(blobs_group) == len(devices), (
            f"Each GPU from {devices}, should have a copy of {blob_name}."
        )
        if _IsGPUBlob(model, blob_name):
            with core.DeviceScope(master_device_opt):
                if not isinstance(blobs_group[0], core.GradientSlice):
                    _AllReduce(devices, model, net, blob_name, use_nccl, last_out)
                    # Serializes the NCCL ops.
                    last_out = blobs_group[0]
                    continue
                master_ns = f"{model._device_prefix}_{devices[0]}"
                # Slices gathered with the same indices blob share one concatenation.
                if not any(g.indices in concatenated_idx for g in blobs_group):
                    idx_concat, _ = net.Concat(
                        [g.indices for g in blobs_group],
                        [
                            f"{master_ns}/{blob_name}_index_concat",
                            f"{master_ns}/{blob_name}_index_splitinfo",
                        ],
                        axis=0,
                        name="note:data_parallel_model",
                    )
                    for gpu, g in group.items():
                        with core.DeviceScope(core.DeviceOption(model._device_type, gpu)):
                            model.Copy(idx_concat, g.indices)
                            concatenated_idx.add(g.indices)
                val_concat, _ = net.Concat(
                    [g.values for g in blobs_group],
                    [
                        f"{master_ns}/{blob_name}_val_concat",
                        f"{master_ns}/{blob_name}_val_splitinfo",
                    ],
                    axis=0,
                    name="note:data_parallel_model",
                )
                for gpu, g in group.items():
                    with core.DeviceScope(core.DeviceOption(model._device_type, gpu)):
                        model.Copy(val_concat, g.values)
        else:
            assert not isinstance(blobs_group[0], core.GradientSlice), (
                "Synchronizing gradient slices not supported"
            )
            device_type = caffe2_pb2.IDEEP if _IsIDEEPBlob(model, blob_name) else caffe2_pb2.CPU
            with core.DeviceScope(core.DeviceOption(device_type)):
                net.Sum(blobs_group, [blobs_group[0]])
                if not model._shared_model:
                    _Broadcast(devices, model, net, blob_name)


def _BroadcastComputedParams(devices, model, rendezvous, use_nccl=False):
    _BroadcastComputedParamsSingleHost(devices, model, use_nccl)
    if rendezvous is not None and model._computed_param_names:
        # As in Caffe2: each shard keeps its own computed parameters (e.g. SpatialBN's running
        # statistics); warn only where there are some.
        log.warning(
            "Distributed broadcast of computed params is not implemented yet: each shard "
            "keeps its own %s",
            ", ".join(sorted(model._computed_param_names)),
        )


def _BroadcastComputedParamsSingleHost(devices, model, use_nccl=False):
    """Computed parameters (running statistics) take the first device's values."""
    if len(devices) == 1:
        return
    for name in model._computed_param_names:
        _Broadcast(devices, model, model.net, name, use_nccl)


def _GetReverseOrderedGrads(model):
    """The gradient names (unscoped) last first: the order in which backward produces them."""
    return list(reversed(model._grad_names))


def stripBlobName(param):
    """The name without its first scope: ``cpu_0/fc/w`` -> ``fc/w``; a GradientSlice gives
    ``<indices>:<values>``."""
    if isinstance(param, core.GradientSlice):
        return stripBlobName(param.indices) + ":" + stripBlobName(param.values)
    name = str(param)
    return name[name.index(scope._NAMESCOPE_SEPARATOR) + 1 :]


def _AnalyzeOperators(model):
    """Every GPU op (collectives, copies and the reduction Sums aside) must only touch blobs of
    its own device's name scope."""
    for op in model.Proto().op:
        if "NCCL" in op.type or "Copy" in op.type or "Concat" in op.type:
            continue
        if op.type == "Sum" and op.name == "dpm":
            continue
        if "Allreduce" in op.type and any(e in op.engine for e in ("GLOO",) + COLLECTIVE_ENGINES):
            continue
        device = op.device_option
        if not core.IsGPUDeviceType(device.device_type):
            continue
        namescope = f"{model._device_prefix}_{device.device_id}/"
        for blob in list(op.input) + list(op.output):
            if blob.startswith(model._device_prefix + "_") and not blob.startswith(namescope):
                raise Exception(
                    f"Blob {blob} of op {op.type}, should have namescope {namescope}. Op: {op}"
                )


def _InferBlobDevice(model):
    """``model._blob_to_device``: each blob's device, from the first op (of param_init_net,
    then net, step nets included) that reads or writes it; Iter counters live on the CPU."""
    mapping = {}

    def visit(proto):
        for op in proto.op:
            device = op.device_option
            if op.type == "Iter":
                device = caffe2_pb2.DeviceOption()
                device.device_type = caffe2_pb2.CPU
            for b in list(op.input) + list(op.output):
                mapping.setdefault(b, device)
            if op.type.startswith("RecurrentNetwork"):
                for a in op.arg:
                    if a.name.endswith("step_net"):
                        visit(a.n)

    visit(model.param_init_net.Proto())
    visit(model.net.Proto())
    model._blob_to_device = mapping


def _blob_device_type(model, blob_name):
    if blob_name in model._blob_to_device:
        return model._blob_to_device[blob_name].device_type
    scoped = f"{model._device_prefix}_{model._devices[0]}/{blob_name}"
    if scoped in model._blob_to_device:
        return model._blob_to_device[scoped].device_type
    return model._device_type


def _IsIDEEPBlob(model, blob_name):
    return _blob_device_type(model, blob_name) == caffe2_pb2.IDEEP


def _IsGPUBlob(model, blob_name):
    return core.IsGPUDeviceType(_blob_device_type(model, blob_name))


def _device_of_scoped(model, ref, what):
    namescope = ref.GetNameScope()
    try:
        device = int(namescope.split("_")[1].split("/")[0])
    except (IndexError, ValueError):
        raise AssertionError(
            f"{what} {ref} expected to have namescope '{model._device_prefix}_<device>'"
        ) from None
    assert f"{model._device_prefix}_{device}/" in namescope, (
        f"{what} {ref} expected to have namescope '{model._device_prefix}_{device}'"
    )
    return device


def _GroupByDevice(model, devices, params, non_data_params):
    """``OrderedDict``: unscoped name -> ``{device: blob}``, for the blobs of ``params`` after
    the first ``len(non_data_params)`` (those are not data parallel), in their order."""
    grouped = OrderedDict()
    for p in params[len(non_data_params) :]:
        assert isinstance(p, (core.BlobReference, core.GradientSlice)), (
            f"Param {p} is not BlobReference or GradientSlice"
        )
        if isinstance(p, core.BlobReference):
            device = _device_of_scoped(model, p, "Param")
        else:
            device = _device_of_scoped(model, p.indices, "Indices")
            assert f"{model._device_prefix}_{device}/" in p.values.GetNameScope(), (
                f"Values {p} expected to have namescope '{model._device_prefix}_{device}'"
            )
        grouped.setdefault(stripBlobName(p), {})[device] = p
    return grouped


def _ValidateParams(params):
    if len(params) > len(set(params)):
        ordered = sorted(params)
        dupes = [p for j, p in enumerate(ordered) if j > 0 and ordered[j - 1] == p]
        raise AssertionError(f"Duplicate entries in params: {dupes}")


def _ComputeBlobsToSync(model):
    """``(blobs, names)``: the per-device blobs to keep in sync (what ``param_init_net`` writes
    in a device scope; with a shared model only the computed parameters), sorted by device id
    then name, and their unscoped names."""
    prefix = model._device_prefix
    if model._shared_model:
        blobs = [str(p) for p in model.GetComputedParams("")]
        names = [stripBlobName(b) for b in blobs]
    else:
        blobs = []
        names = {}
        for op in model.param_init_net.Proto().op:
            scoped = [o for o in op.output if o.startswith(prefix + "_")]
            for o in scoped:
                names.setdefault(stripBlobName(o), None)
            blobs.extend(scoped)
        missing = set(model._param_names) - set(names)
        assert not missing, f"Some params not instantiated in param init net: {missing}"
        names = list(names)

    start = len(prefix) + 1

    def device_then_name(b):
        return (int(b[start : b.index(scope._NAMESCOPE_SEPARATOR)]), b)

    blobs = sorted(set(blobs), key=device_then_name)
    return [core.BlobReference(b) for b in blobs], names


# -------------------------------------------------------------------------- memory (memonger)
def _OptimizeGradientMemorySimple(model, losses_by_gpu, devices):
    log.warning(
        "------- DEPRECATED API, please use data_parallel_model.OptimizeGradientMemory() -----"
    )
    for device in devices:
        namescope = f"{model._device_prefix}_{device}/"
        model.net._net = memonger.share_grad_blobs(
            model.net,
            losses_by_gpu[device],
            set(model.param_to_grad.values()),
            namescope,
            share_activations=False,
        )


def _AddDynamicMemoryOptimization(model, blobs_to_keep, devices):
    keep = set()
    for device in devices:
        for name in blobs_to_keep or []:
            keep.add(f"{model._device_prefix}_{device}/{name}")
    if model._rendezvous is not None:
        # Collective ops expect the gradient tensors to stay where they are between runs.
        keep.update(str(g) for g in model.param_to_grad.values())
    model.net._net = memonger.release_blobs_when_used(model.net.Proto(), keep)


def OptimizeGradientMemory(model, input_shapes, excluded_blobs, recycle_activations):
    """Share the blobs of the backward pass (and, with ``recycle_activations``, of the forward
    activations) on every device with ``memonger.share_grad_blobs``.

    ``input_shapes``: unscoped input name -> shape (``{}`` if unknown; None: no shape
    inference); ``excluded_blobs``: unscoped names that must keep their own memory."""
    shapes = None
    if input_shapes is not None:
        scoped_shapes = {
            f"{model._device_prefix}_{d}/{b}": shape
            for b, shape in input_shapes.items()
            for d in model._devices
        }
        shapes, _ = workspace.InferShapesAndTypes([model.param_init_net, model.net], scoped_shapes)
    for device in model._devices:
        namescope = f"{model._device_prefix}_{device}/"
        model.net._net = memonger.share_grad_blobs(
            model.net,
            model._losses_by_gpu[device],
            set(model.param_to_grad.values()),
            namescope,
            dont_share_blobs={namescope + b for b in excluded_blobs},
            share_activations=recycle_activations,
            blob_shapes=shapes,
        )


# ---------------------------------------------------------------------------- common worlds
def _CreateOrCloneCommonWorld(net, common_world_blob, rendezvous, name=None, timeout_sec=None):
    """A common world for collective ops in ``net``: a CloneCommonWorld of the first
    CreateCommonWorld there with the same timeout, else a new CreateCommonWorld (size
    ``num_shards``, rank ``shard_id``, ``timeout_ms``, inputs: the ``kv_handler``). Without
    ``timeout_sec``, the timeout is the rendezvous's ``timeout_ms`` if it has one, else 30 s."""
    _check_rendezvous(rendezvous)
    if timeout_sec is not None:
        timeout_ms = int(timeout_sec * 1000)
    else:
        timeout_ms = int(rendezvous.get("timeout_ms", _DEFAULT_TIMEOUT_SEC * 1000))

    existing = None
    for op in net.Proto().op:
        if op.type != "CreateCommonWorld":
            continue
        op_timeout = next((a.i for a in op.arg if a.name == "timeout_ms"), -1)
        if op_timeout == timeout_ms:
            existing = op.output[0]
            break

    if name is None:
        name = f"{common_world_blob}_op"
    if existing is not None:
        return _collective(
            net,
            "CloneCommonWorld",
            [existing],
            common_world_blob,
            name=name,
            engine=rendezvous["engine"],
        )
    extra = {
        k: rendezvous[k] for k in ("transport", "interface", "mpi_rendezvous") if k in rendezvous
    }
    return _collective(
        net,
        "CreateCommonWorld",
        rendezvous.get("kv_handler") or [],
        common_world_blob,
        name=name,
        size=rendezvous["num_shards"],
        rank=rendezvous["shard_id"],
        engine=rendezvous["engine"],
        timeout_ms=timeout_ms,
        **extra,
    )


def _RunComparison(model, blob_name, device=None):
    """Check that ``blob_name`` holds the same value on every shard (sum of squares gathered
    with an Allreduce); True on one shard."""
    if device is None:
        device = model._blob_to_device[blob_name]
    with core.DeviceScope(device):
        rendezvous = model._rendezvous
        if rendezvous is None or rendezvous["num_shards"] == 1:
            return True
        _check_rendezvous(rendezvous)
        one_hot = np.zeros(rendezvous["num_shards"], dtype=np.float32)
        one_hot[rendezvous["shard_id"]] = 1
        workspace.FeedBlob("compare_arr", one_hot)

        net = core.Net("allcompare_net")
        extra = (
            {"mpi_rendezvous": rendezvous["mpi_rendezvous"]}
            if "mpi_rendezvous" in rendezvous
            else {}
        )
        comm_world = _collective(
            net,
            "CreateCommonWorld",
            rendezvous.get("kv_handler") or [],
            "initial_sync",
            name=model.net.Proto().name + ".cw_master_select",
            size=rendezvous["num_shards"],
            rank=rendezvous["shard_id"],
            engine=rendezvous["engine"],
            **extra,
        )
        checksum = blob_name + "_checksum"
        net.SumSqrElements([blob_name], [checksum], average=False)
        gathered = blob_name + "_gather"
        net.Mul(inputs=["compare_arr", checksum], outputs=gathered, broadcast=1)
        _collective(
            net, "Allreduce", [comm_world, gathered], [gathered], engine=rendezvous["engine"]
        )
        workspace.RunNetOnce(net)
        values = workspace.FetchBlob(gathered)
        for i in range(rendezvous["num_shards"]):
            assert values[i] == values[0], f"allcompare failed on shard {rendezvous['shard_id']}."
        return True


# ------------------------------------------------------------- batch norm across the devices
def _InterleaveOps(model):
    """Reorder the net so that the devices' copies of each op follow each other (op 0 of
    every device, then op 1, ...): the devices progress together, as the statistics of
    combined SpatialBN need."""
    ops = list(model.net.Proto().op)
    num_devices = len(model._devices)
    per_device = len(ops) // num_devices
    assert num_devices * per_device == len(ops), (
        "Number of ops per device in original net is not uniform"
    )
    by_device = {d: [] for d in range(num_devices)}
    for op in ops:
        by_device[op.device_option.device_id].append(op)
    interleaved = []
    for j in range(per_device):
        first_type = None
        for d in model._devices:
            op = by_device[d][j]
            if first_type is None:
                first_type = op.type
            assert op.type == first_type, f"Type mismatch {first_type} / {op.type}"
            interleaved.append(op)
    del model.net.Proto().op[:]
    model.net.Proto().op.extend(interleaved)


def _CPUInterDeviceBatchNormalization(model):
    """Rewrite each run of (interleaved) SpatialBN ops so that the statistics cover every
    device's batch: ChannelStats per device, two Sums into ``<first input>_sums_combined`` /
    ``_sumsq_combined``, extra inputs and ``num_batches`` on SpatialBN; the same for
    SpatialBNGradient with ChannelBackpropStats and the scale/bias gradients summed into
    ``cpu_0/<name>_combined`` and copied back."""
    num_devices = len(model._devices)

    def reduce_ops(param, sources, destinations):
        combined = "cpu_0/" + param + "_combined"
        ops = [core.CreateOperator("Sum", sources, combined)]
        ops += [core.CreateOperator("Copy", combined, d) for d in destinations]
        return ops

    new_ops = []
    held = []  # the SpatialBN(Gradient) ops of the current run
    injected = []
    phase = None
    first_input = None
    sums, sumsqs, scale_grads, bias_grads = [], [], [], []

    # A None at the end flushes a gradient run that ends the net.
    for op in [*model.net.Proto().op, None]:
        if op is not None and op.type == "SpatialBN":
            phase = "forward"
            name = op.input[0]
            if first_input is None:
                first_input = name
            injected.append(
                core.CreateOperator("ChannelStats", name, [name + "_sums", name + "_sumsq"])
            )
            sums.append(name + "_sums")
            sumsqs.append(name + "_sumsq")
            op.input.extend([first_input + "_sums_combined", first_input + "_sumsq_combined"])
            op.arg.extend([utils.MakeArgument("num_batches", num_devices)])
            held.append(op)
            continue
        if op is not None and op.type == "SpatialBNGradient":
            phase = "backward"
            injected.append(
                core.CreateOperator(
                    "ChannelBackpropStats",
                    [op.input[0], op.input[3], op.input[4], op.input[2]],
                    [op.output[1], op.output[2]],
                )
            )
            scale_grads.append(op.output[1])
            bias_grads.append(op.output[2])
            op.arg.extend([utils.MakeArgument("num_batches", num_devices)])
            op.input.extend([op.output[1], op.output[2]])
            held.append(op)
            continue
        assert op is not None or phase != "forward", (
            "Net modification for cpu inter-device batch normalization failed"
        )
        if phase == "forward":
            new_ops += injected
            new_ops.append(core.CreateOperator("Sum", sums, first_input + "_sums_combined"))
            new_ops.append(core.CreateOperator("Sum", sumsqs, first_input + "_sumsq_combined"))
            new_ops += held
        elif phase == "backward":
            new_ops += injected
            new_ops += reduce_ops(stripBlobName(scale_grads[0]), scale_grads, scale_grads)
            new_ops += reduce_ops(stripBlobName(bias_grads[0]), bias_grads, bias_grads)
            new_ops += held
        if phase is not None:
            held, injected = [], []
            sums, sumsqs, scale_grads, bias_grads = [], [], [], []
            first_input = None
            phase = None
        if op is not None:
            new_ops.append(op)
    del model.net.Proto().op[:]
    model.net.Proto().op.extend(new_ops)


def _GPUInterDeviceBatchNormalization(model):
    """The GPU version of ``_CPUInterDeviceBatchNormalization``: the per-device statistics are
    copied to the CPU (``cpu_0/<name>_gpu_<i>_copy``), summed there and copied back to every
    GPU (``gpu_<i>/<name>_combined``, or the scale/bias gradients)."""
    num_devices = len(model._devices)
    cpu = core.DeviceOption(caffe2_pb2.CPU)

    def gpu_reduce(param, result_blobs=None):
        if result_blobs is None:
            result_blobs = [f"gpu_{i}/{param}_combined" for i in range(num_devices)]
        ops = []
        staged = []
        for i in range(num_devices):
            staged.append(f"cpu_0/{param}_gpu_{i}_copy")
            ops.append(
                core.CreateOperator(
                    "CopyGPUToCPU",
                    f"gpu_{i}/{param}",
                    staged[i],
                    device_option=core.DeviceOption(model._device_type, i),
                )
            )
        combined = f"cpu_0/{param}_combined"
        ops.append(core.CreateOperator("Sum", staged, combined, device_option=cpu))
        for i in range(num_devices):
            ops.append(
                core.CreateOperator(
                    "CopyCPUToGPU",
                    combined,
                    result_blobs[i],
                    device_option=core.DeviceOption(model._device_type, i),
                )
            )
        return ops

    new_ops = []
    held = []
    injected = []
    phase = None
    first_input = None
    scale_grads, bias_grads = [], []

    # A None at the end flushes a gradient run that ends the net.
    for op in [*model.net.Proto().op, None]:
        if op is not None and op.type == "SpatialBN":
            phase = "forward"
            name = op.input[0]
            if first_input is None:
                first_input = name
            injected.append(
                core.CreateOperator(
                    "ChannelStats",
                    name,
                    [name + "_sums", name + "_sumsq"],
                    device_option=core.DeviceOption(model._device_type, op.device_option.device_id),
                )
            )
            op.input.extend([name + "_sums_combined", name + "_sumsq_combined"])
            op.arg.extend([utils.MakeArgument("num_batches", num_devices)])
            held.append(op)
            continue
        if op is not None and op.type == "SpatialBNGradient":
            phase = "backward"
            injected.append(
                core.CreateOperator(
                    "ChannelBackpropStats",
                    [op.input[0], op.input[3], op.input[4], op.input[2]],
                    [op.output[1], op.output[2]],
                    device_option=core.DeviceOption(model._device_type, op.device_option.device_id),
                )
            )
            scale_grads.append(op.output[1])
            bias_grads.append(op.output[2])
            op.arg.extend([utils.MakeArgument("num_batches", num_devices)])
            op.input.extend([op.output[1], op.output[2]])
            held.append(op)
            continue
        assert op is not None or phase != "forward", (
            "Net modification for gpu inter-device batch normalization failed"
        )
        if phase == "forward":
            new_ops += injected
            new_ops += gpu_reduce(stripBlobName(first_input) + "_sums")
            new_ops += gpu_reduce(stripBlobName(first_input) + "_sumsq")
            new_ops += held
        elif phase == "backward":
            new_ops += injected
            new_ops += gpu_reduce(stripBlobName(scale_grads[0]), scale_grads)
            new_ops += gpu_reduce(stripBlobName(bias_grads[0]), bias_grads)
            new_ops += held
        if phase is not None:
            held, injected = [], []
            scale_grads, bias_grads = [], []
            first_input = None
            phase = None
        if op is not None:
            new_ops.append(op)
    del model.net.Proto().op[:]
    model.net.Proto().op.extend(new_ops)
