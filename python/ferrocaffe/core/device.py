"""Device options and cross-device copy injection (Caffe2's ``core`` device helpers).

Everything here is a pure graph rewrite over protobuf messages: deciding on which device
each blob lives, and inserting ``CopyCPUToGPU`` / ``CopyGPUToCPU`` / ``Copy`` operators
where an operator reads a blob that was produced on another device. No accelerator is
needed to run any of it.
"""

from collections import defaultdict

from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "DeviceOption",
    "IsGPUDeviceType",
    "device_option_equal",
    "device_equal",
    "InferBlobDevices",
    "InferOpBlobDevices",
    "InferOpBlobDevicesAsDict",
    "InferOpDeviceAsBlobDevices",
    "RemapEntry",
    "copy_func_between_devices",
    "InjectCrossDeviceCopies",
    "InjectDeviceCopiesAmongNets",
    "InjectDeviceCopiesAmongNetsWithoutB2D",
]

_GPU_DEVICE_TYPES = frozenset((caffe2_pb2.CUDA, caffe2_pb2.HIP))


def IsGPUDeviceType(device_type):
    """True for the device types that denote a GPU (CUDA and HIP)."""
    return device_type in _GPU_DEVICE_TYPES


def DeviceOption(
    device_type,
    device_id=0,
    random_seed=None,
    node_name=None,
    numa_node_id=None,
    extra_info=None,
):
    """Build a ``caffe2_pb2.DeviceOption``; ``device_type`` and ``device_id`` are always set."""
    option = caffe2_pb2.DeviceOption()
    option.device_type = device_type
    option.device_id = device_id
    if node_name is not None:
        option.node_name = node_name
    if random_seed is not None:
        option.random_seed = random_seed
    if numa_node_id is not None:
        # NUMA placement only makes sense for host memory.
        assert device_type == caffe2_pb2.CPU
        option.numa_node_id = numa_node_id
    if extra_info is not None:
        option.extra_info.extend(extra_info)
    return option


def device_option_equal(opt1, opt2, ignore_node_name=True, ignore_random_seed=True):
    """Whether two device options denote the same device.

    Any two CPU options are equal whatever their ``device_id``; GPU options compare by
    ``device_id`` only (so CUDA 1 equals HIP 1, as in Caffe2). ``None`` only equals ``None``.
    """
    if not opt1 or not opt2:
        return opt1 == opt2
    if not ignore_node_name and opt1.node_name != opt2.node_name:
        return False
    if not ignore_random_seed and opt1.random_seed != opt2.random_seed:
        return False
    if not opt1.device_type or not opt2.device_type:
        # CPU is device type 0: equal only when both are on the CPU.
        return not opt1.device_type and not opt2.device_type
    return opt1.device_id == opt2.device_id


def device_equal(src, dst):
    """Compare device type and id only (an empty option equals ``{CPU, 0}``)."""
    return src.device_type == dst.device_type and src.device_id == dst.device_id


def InferBlobDevices(net):
    """Map every blob an operator of ``net`` writes to that operator's device option.

    A later writer overrides an earlier one. The values are the operators' own
    ``device_option`` messages (not copies).
    """
    mapping = {}
    for op in net.Proto().op:
        op_device = op.device_option
        for b in op.output:
            mapping[b] = op_device
    return mapping


# Per-op device inference: op type -> (where inputs live, where outputs live). "op" means
# the operator's own device option, "cpu" an empty DeviceOption. Ops not listed keep every
# blob on the operator's device.
_DEVICE_INFERENCE = {
    "CopyCPUToGPU": ("cpu", "op"),
    "CopyGPUToCPU": ("op", "cpu"),
    "CopyFromCPUInput": ("cpu", "op"),
    "EnsureCPUOutput": ("op", "cpu"),
}
# These two copy ops refuse to infer anything without an explicit device option.
_NEEDS_DEVICE_OPTION = frozenset(("CopyCPUToGPU", "CopyGPUToCPU"))


def _device_for(rule, op):
    option = caffe2_pb2.DeviceOption()
    if rule == "op" and op.HasField("device_option"):
        option.CopyFrom(op.device_option)
    return option


def InferOpBlobDevices(op):
    """Return ``(input_devices, output_devices)``: one fresh DeviceOption per input/output."""
    in_rule, out_rule = _DEVICE_INFERENCE.get(op.type, ("op", "op"))
    if op.type in _NEEDS_DEVICE_OPTION and not op.HasField("device_option"):
        raise RuntimeError(f"{op.type} op should have cuda device option.")
    input_info = [_device_for(in_rule, op) for _ in op.input]
    output_info = [_device_for(out_rule, op) for _ in op.output]
    return input_info, output_info


def InferOpBlobDevicesAsDict(op):
    """Like :func:`InferOpBlobDevices`, keyed by blob name."""
    input_dev_list, output_dev_list = InferOpBlobDevices(op)
    input_dict = {op.input[i]: input_dev_list[i] for i in range(len(op.input))}
    output_dict = {op.output[i]: output_dev_list[i] for i in range(len(op.output))}
    return input_dict, output_dict


def InferOpDeviceAsBlobDevices(op):
    """Place every input and output on the operator's own device (placeholder ops)."""
    op_dev = op.device_option if op.HasField("device_option") else caffe2_pb2.DeviceOption()
    return [op_dev] * len(op.input), [op_dev] * len(op.output)


class RemapEntry:
    """Key of the cache of already copied blobs: (blob name, device it was copied to)."""

    def __init__(self, blob, device):
        self.blob = blob
        self.device = device

    def __eq__(self, other):
        return self.blob == other.blob and self.device == other.device

    def __hash__(self):
        return hash(self.blob + str(self.device))


def _device_scope(option):
    from ferrocaffe.scope import DeviceScope

    return DeviceScope(option)


def _scoped_op_adder(op_type, device):
    # Same as ``net.<op_type>(...)`` inside ``DeviceScope(device)``. The GPU copy ops are
    # created through the builder directly: they need not be in this build's operator
    # registry for a graph rewrite (a CPU-only build still writes nets for a GPU machine).
    def add(net, *args, **kwargs):
        with _device_scope(device):
            return net._CreateAndAddToSelf(op_type, *args, **kwargs)

    return add


def copy_func_between_devices(src, dst):
    """Return ``f(net, *args, **kw)`` that adds the op copying a blob from ``src`` to ``dst``.

    ``None`` when no copy is needed (CPU to CPU, or the same GPU).
    """
    cpu = caffe2_pb2.CPU
    is_src_gpu = IsGPUDeviceType(src.device_type)
    is_dst_gpu = IsGPUDeviceType(dst.device_type)

    if src.device_type == cpu and dst.device_type == cpu:
        return None
    if is_src_gpu and is_dst_gpu:
        if src.device_id == dst.device_id:
            return None
        return _scoped_op_adder("Copy", dst)
    if is_src_gpu and dst.device_type == cpu:
        return _scoped_op_adder("CopyGPUToCPU", src)
    if src.device_type == cpu and is_dst_gpu:
        return _scoped_op_adder("CopyCPUToGPU", dst)
    raise ValueError(f"Non-supported devices: {src} and {dst}")


def _gen_new_name(blob, device_option):
    """Name of the copy of ``blob`` on ``device_option``: ``x_cpu`` or ``x_gpu_<id>``."""
    if device_option.device_type == caffe2_pb2.CPU:
        suffix = "_cpu"
    elif IsGPUDeviceType(device_option.device_type):
        suffix = "_gpu_" + str(device_option.device_id)
    else:
        raise RuntimeError(f"Unknown device type: {device_option.device_type}")
    return blob + suffix


def InjectCrossDeviceCopies(net, blob_to_device=None, blob_remap=None, placeHolderOps=None):
    """Return ``(new_net, blob_to_device)``: a copy of ``net`` named ``<name>_cross_device``
    with copy operators inserted wherever an op reads a blob that lives on another device.

    ``blob_to_device`` (updated in place and returned) maps blob names to the device they
    live on; external inputs missing from it are placed on the net's device option.
    ``blob_remap`` maps ``RemapEntry(blob, device)`` to the name of an existing copy, which
    is then reused instead of copying again. Ops whose type is in ``placeHolderOps`` are
    taken to keep all their blobs on their own device and are copied unchanged.
    """
    from ferrocaffe.core.clone import _remap_input_copy

    new_net = net.Clone(net.Proto().name + "_cross_device", keep_schema=True)
    del new_net.Proto().op[:]
    if blob_to_device is None:
        blob_to_device = {}
    if blob_remap is None:
        blob_remap = {}
    temp_remap = {}
    src_proto = net.Proto()
    net_option = (
        src_proto.device_option
        if src_proto.HasField("device_option")
        else caffe2_pb2.DeviceOption()
    )

    # Copies made for earlier nets of the same blobs become external inputs too.
    all_remaps = defaultdict(list)
    for entry, mapped_blob in blob_remap.items():
        all_remaps[entry.blob].append(mapped_blob)
    new_proto = new_net.Proto()
    mapped_external_inputs = []
    for name in new_proto.external_input:
        mapped_external_inputs.extend(all_remaps.get(name) or [])
    new_proto.external_input.extend(mapped_external_inputs)

    for op in src_proto.op:
        temp_remap.clear()
        placeholder = placeHolderOps is not None and op.type in placeHolderOps
        if placeholder:
            input_dev, output_dev = InferOpDeviceAsBlobDevices(op)
        else:
            input_dev, output_dev = InferOpBlobDevices(op)

        for dev, name in zip(input_dev, op.input, strict=True):
            assert net.BlobIsDefined(name), f"input {name} should be defined in the net."
            if name not in blob_to_device:
                if net.is_external_input(name):
                    blob_to_device[name] = net_option
                else:
                    raise AttributeError(f"No device information found for blob {name}.")

            if device_equal(blob_to_device[name], dev):
                continue
            entry = RemapEntry(name, dev)
            if entry in blob_remap and blob_to_device[blob_remap[entry]] == dev:
                temp_remap[name] = blob_remap[entry]
                continue
            copy_func = copy_func_between_devices(blob_to_device[name], dev)
            new_name = _gen_new_name(name, dev)
            copy_func(new_net, name, new_name)
            blob_remap[entry] = new_name
            temp_remap[name] = new_name
            blob_to_device[new_name] = dev

        # A blob may only be rewritten on another device by an in-place op.
        for dev, output in zip(output_dev, op.output, strict=True):
            if (
                output in blob_to_device
                and output not in op.input
                and not device_equal(blob_to_device[output], dev)
            ):
                raise RuntimeError(
                    f"In-place blob: {output} is not supported between operators with "
                    f"different device option previous:{blob_to_device[output]} now: {dev}. "
                    f"Failed op:\n {op}"
                )

        new_op = _remap_input_copy(op, temp_remap)
        # In-place outputs follow their (possibly renamed) input.
        original_inputs = list(op.input)
        for i, out in enumerate(new_op.output):
            if out in original_inputs:
                new_op.output[i] = new_op.input[original_inputs.index(out)]

        blob_to_device.update({o: d for d, o in zip(output_dev, new_op.output, strict=True)})
        _append_op(new_net, new_op)

    return new_net, blob_to_device


def _append_op(net, op):
    """Append ``op`` to ``net`` keeping the net's bookkeeping of defined blobs."""
    extend = getattr(net, "_ExtendOps", None)
    if extend is not None:
        extend([op])
    else:
        net.Proto().op.extend([op])


def InjectDeviceCopiesAmongNets(nets, blob_to_device_init=None):
    """Inject cross-device copies into each net of ``nets`` (given in execution order),
    resolving blobs that one net produces and a later one reads on another device.

    Returns ``(new_nets, blob_to_device)``.
    """
    from ferrocaffe.core.net import Net

    assert isinstance(nets, list), f"nets {nets} should be a list of nets."
    assert all(isinstance(net, Net) for net in nets), f"nets {nets} should be a list of nets."
    blob_to_device = blob_to_device_init or {}
    blob_remap = {}
    new_nets = []
    for net in nets:
        new_net, blob_to_device = InjectCrossDeviceCopies(
            net, blob_to_device=blob_to_device, blob_remap=blob_remap
        )
        new_nets.append(new_net)
    return new_nets, blob_to_device


def InjectDeviceCopiesAmongNetsWithoutB2D(nets, blob_to_device_init=None):
    """:func:`InjectDeviceCopiesAmongNets` returning only the new nets."""
    new_nets, _ = InjectDeviceCopiesAmongNets(nets, blob_to_device_init)
    return new_nets
