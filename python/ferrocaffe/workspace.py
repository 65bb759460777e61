"""Caffe2's ``workspace`` module: a facade over Rust workspaces (``ferrocaffe._native.Workspace``).

Blobs live in Rust. ``FeedBlob`` hands a numeric numpy array over without copying when it is
C-contiguous and aligned (the workspace then reads that memory: change the array after feeding
and the blob sees it, until an op writes the blob, which copies first). ``FetchBlob`` returns an
array of its own, as Caffe2 did (callers write into it and feed it back); later runs never
change it. Strings come back as object arrays of bytes.

Nets, ops and plans are accepted as protobuf messages or as anything with ``.Proto()``
(``core.Net``, ``core.Plan``, ``core.ExecutionStep``...). Every run releases the GIL, so several
Python threads can run different nets on one workspace.
"""

import collections
import contextlib
import shutil
import tempfile
from collections import defaultdict

import numpy as np

from ferrocaffe import _import_c_extension as C
from ferrocaffe import _native, torch_ops
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "Blobs",
    "C",
    "CreateBlob",
    "CreateNet",
    "CurrentWorkspace",
    "DeserializeBlob",
    "FeedBlob",
    "FetchBlob",
    "FetchBlobs",
    "FetchTorch",
    "GetBlobSizeBytes",
    "GetOperatorCost",
    "GetCuDNNVersion",
    "GetNetName",
    "GlobalInit",
    "ApplyTransform",
    "ApplyTransformIfFaster",
    "IsImmediate",
    "Predictor",
    "StartImmediate",
    "StopImmediate",
    "HasBlob",
    "Nets",
    "RegisteredOperators",
    "RemoveBlob",
    "ResetBlob",
    "ResetWorkspace",
    "RootFolder",
    "RunNet",
    "RunNetOnce",
    "RunOperatorMultiple",
    "RunOperatorOnce",
    "RunOperatorsOnce",
    "RunPlan",
    "RunPlanInBackground",
    "SerializeBlob",
    "StringifyBlobName",
    "StringifyNetName",
    "StringifyProto",
    "SwitchWorkspace",
    "GpuDeviceType",
    "Workspaces",
    "blobs",
]

# Caffe2's flags. Caffe2 had CPU-only and CUDA builds, and code (its own test helpers
# included) reads `has_cuda_support` to decide whether to put ops on CUDA; the one wheel
# carries CUDA and loads the driver at run time, so both flags say whether a GPU can be used
# here and now: on a machine without one, code sees what a CPU-only Caffe2 showed it.
# `_native.cuda_built()` says whether the build carries the backend.
has_gpu_support = bool(_native.cuda_built()) and _native.num_cuda_devices() > 0
has_cuda_support = has_gpu_support
has_hip_support = False
is_asan = False
# net name -> op index -> Python stack where the op was added (filled by core.Net)
operator_tracebacks = defaultdict(dict)

_workspaces = {"default": _native.Workspace()}
_current = "default"


def _ws():
    return _workspaces[_current]


def GlobalInit(args):
    """Accepts Caffe2's command-line flags (``['caffe2', '--caffe2_log_level=0', ...]``).
    Flags only tune Caffe2's own logging and threading; they are checked for form and kept."""
    for a in list(args)[1:]:
        if not isinstance(a, str) or not a.startswith("--"):
            raise RuntimeError(
                "GlobalInit: unexpected argument %r (expected --flag[=value])" % (a,)
            )
    GlobalInit.flags = list(args)
    return True


def NumCudaDevices():
    """The number of CUDA devices (0 without a driver or GPU)."""
    return _native.num_cuda_devices()


NumGpuDevices = NumCudaDevices


def GetCuDNNVersion():
    """The cuDNN version the CUDA backend found (as Caffe2's integer, e.g. 8005); 0 where
    there is none, as on a CPU-only Caffe2."""
    if not has_cuda_support:
        return 0
    return _native.cuda_cudnn_version() or 0


# The device type of "the GPU" in Caffe2's device-generic code (CUDA; HIP builds are not made).
GpuDeviceType = caffe2_pb2.CUDA


def GetCudaPeerAccessPattern():
    return np.zeros((0, 0), dtype=bool)


GetGpuPeerAccessPattern = GetCudaPeerAccessPattern


def StringifyBlobName(name):
    return name if isinstance(name, str) else str(name)


def StringifyNetName(name):
    if type(name) is str:
        return name
    if hasattr(name, "Name") and callable(name.Name):
        return name.Name()
    if isinstance(name, caffe2_pb2.NetDef):
        return name.name
    return str(name)


def GetNetName(net):
    """The name of a net given as a name, a ``core.Net`` or a ``NetDef``; an error otherwise."""
    if isinstance(net, str):
        return net
    if type(net).__name__ in ("Net", "NetWithShapeInference"):
        return net.Name()
    if isinstance(net, caffe2_pb2.NetDef):
        return net.name
    raise Exception(f"Not a Net object: {net!s}")


def StringifyProto(obj):
    """Serialized bytes of a protobuf message, of anything with ``.Proto()``, or bytes/str as is."""
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode()
    if hasattr(obj, "Proto") and callable(obj.Proto):
        obj = obj.Proto()
    if hasattr(obj, "SerializeToString"):
        return obj.SerializeToString()
    raise ValueError("Unexpected argument to StringifyProto of type " + type(obj).__name__)


# -- workspaces ---------------------------------------------------------------------------


def ResetWorkspace(root_folder=None):
    """Empties the current workspace (blobs and nets); optionally sets its root folder."""
    ws = _ws()
    for key in [k for k, (_, owner) in _torch_bound.items() if owner is ws]:
        del _torch_bound[key]
    ws.reset()
    _native.cuda_empty_cache()
    ws.root_folder = "." if root_folder is None else str(root_folder)
    return True


def SwitchWorkspace(name, create_if_missing=False):
    global _current
    name = str(name)
    if name not in _workspaces:
        if not create_if_missing:
            raise RuntimeError(
                "Workspace %s does not exist (pass create_if_missing=True to create it)" % name
            )
        _workspaces[name] = _native.Workspace()
    _current = name


def CurrentWorkspace():
    return _current


def Workspaces():
    return list(_workspaces)


def RootFolder():
    return _ws().root_folder


# -- blobs ----------------------------------------------------------------------------------


def _to_bytes(v):
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytearray, memoryview, np.bytes_)):
        return bytes(v)
    raise TypeError("string tensors hold bytes or str, got %s" % type(v).__name__)


def _feed(ws, name, arr):
    name = StringifyBlobName(name)
    if isinstance(arr, caffe2_pb2.TensorProto):
        arr = _tensor_proto_to_array(arr)
    if isinstance(arr, (bytes, str)):
        ws.feed_bytes(name, _to_bytes(arr))
        return True
    if not isinstance(arr, np.ndarray):
        arr = np.asarray(arr)
    if arr.dtype.kind in "OSU":
        ws.feed_strings(name, list(arr.shape), [_to_bytes(v) for v in arr.reshape(-1)])
        return True
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    arr = np.require(arr, requirements=["C", "A"])
    try:
        ws.feed(name, arr)
    except TypeError as e:
        raise TypeError("FeedBlob(%r): %s" % (name, e)) from None
    return True


def _tensor_proto_to_array(t):
    dtypes = {
        caffe2_pb2.TensorProto.FLOAT: (np.float32, "float_data"),
        caffe2_pb2.TensorProto.DOUBLE: (np.float64, "double_data"),
        caffe2_pb2.TensorProto.INT32: (np.int32, "int32_data"),
        caffe2_pb2.TensorProto.INT64: (np.int64, "int64_data"),
        caffe2_pb2.TensorProto.BOOL: (np.bool_, "int32_data"),
        caffe2_pb2.TensorProto.UINT8: (np.uint8, "int32_data"),
        caffe2_pb2.TensorProto.INT8: (np.int8, "int32_data"),
        caffe2_pb2.TensorProto.INT16: (np.int16, "int32_data"),
        caffe2_pb2.TensorProto.UINT16: (np.uint16, "int32_data"),
    }
    if t.data_type == caffe2_pb2.TensorProto.STRING:
        return np.array(list(t.string_data), dtype=object).reshape(tuple(t.dims))
    if t.data_type not in dtypes:
        raise TypeError("unsupported TensorProto data type %d" % t.data_type)
    dt, field = dtypes[t.data_type]
    return np.asarray(list(getattr(t, field)), dtype=dt).reshape(tuple(t.dims))


def FeedBlob(name, arr, device_option=None):
    """Puts ``arr`` (numpy array, bytes/str, TensorProto) into blob ``name``, on the device
    ``device_option`` names (by default the current device scope's). Returns True."""
    if device_option is None:
        from . import scope

        device_option = scope.CurrentDeviceScope()
    return _feed_on(_ws(), name, arr, device_option)


def _is_torch_tensor(arr):
    module = getattr(type(arr), "__module__", None) or ""
    return module.startswith("torch") and hasattr(arr, "numpy")


def _feed_on(ws, name, arr, device_option=None):
    """Feeds ``arr`` into blob ``name`` of native workspace ``ws``, on the device
    ``device_option`` names (the host for CPU-like types)."""
    torch_tensor = None
    if _torch_bound:
        _torch_bound.pop((id(ws), StringifyBlobName(name)), None)
    if _is_torch_tensor(arr):
        torch_tensor = arr
        arr = arr.detach().cpu().clone().numpy()
    _feed(ws, name, arr)
    if torch_tensor is not None and torch_tensor.device.type == "cpu":
        _bind_torch(ws, StringifyBlobName(name), torch_tensor)
    if device_option is not None and device_option.device_type == caffe2_pb2.CUDA:
        ws.to_device(StringifyBlobName(name), int(device_option.device_id))
    return True


def _fetched(value):
    """A fetched value the caller owns: Caffe2's FetchBlob returned a copy, which callers write."""
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        return value.copy()
    return value


def FetchBlob(name):
    """The value of blob ``name`` as a numpy array of its own (bytes for a string blob)."""
    ws = _ws()
    name = StringifyBlobName(name)
    if _torch_bound:
        _torch_to_blobs(ws, name)
    return _fetched(ws.fetch(name))


def FetchBlobs(names):
    return [FetchBlob(n) for n in names]


def GetBlobSizeBytes(name):
    """The bytes blob ``name`` holds: its elements' size (plus the characters of strings)."""
    return _ws().blob_nbytes(StringifyBlobName(name))


# -- torch tensors bound to blobs ------------------------------------------------------------
#
# In Caffe2 a torch tensor from FetchTorch, or fed with FeedBlob, was the blob's own tensor.
# Here memory is never shared with torch (torch may reallocate a tensor's storage under a
# blob): a bound tensor and its blob hold copies, made equal at every workspace call of this
# module: the tensor's values go to the blob before a run or a fetch, the blob's (shape
# included) come back to the tensor after a run. A later FeedBlob of something else, or a
# reset, unbinds it; so does the tensor's death. (Values leave a torch tensor through a clone:
# torch makes a storage that numpy has seen non-resizable.)

# (id of native workspace, blob name) -> (weak reference to the tensor, the workspace)
_torch_bound = {}


def _bind_torch(ws, name, tensor):
    import weakref

    _torch_bound[(id(ws), name)] = (weakref.ref(tensor), ws)


def _bound_tensors(ws, name=None):
    for key, (ref, owner) in list(_torch_bound.items()):
        if owner is not ws or (name is not None and key[1] != name):
            continue
        t = ref()
        if t is None:
            del _torch_bound[key]
            continue
        yield key[1], t


def _torch_to_blobs(ws, name=None):
    for blob, t in _bound_tensors(ws, name):
        _feed(ws, blob, t.detach().cpu().clone().numpy())


def _blobs_to_torch(ws):
    import torch

    for blob, t in _bound_tensors(ws):
        value = ws.fetch(blob) if ws.has_blob(blob) else None
        if not isinstance(value, np.ndarray) or value.dtype == object:
            del _torch_bound[(id(ws), blob)]
            continue
        if tuple(t.shape) != value.shape:
            t.resize_(value.shape)
        with torch.no_grad():
            t.copy_(torch.from_numpy(value.copy()))


def _run(ws, method, *args):
    """``method(*args)`` (a run on ``ws``), with bound torch tensors synced around it."""
    if not _torch_bound:
        return method(*args)
    _torch_to_blobs(ws)
    try:
        return method(*args)
    finally:
        _blobs_to_torch(ws)


def _fetch_torch(ws, name):
    import torch

    if _torch_bound:
        _torch_to_blobs(ws, name)
    value = ws.fetch(name)
    if not isinstance(value, np.ndarray) or value.dtype == object:
        raise TypeError("blob %r does not hold a numeric tensor" % (name,))
    t = torch.tensor(value)
    _bind_torch(ws, name, t)
    return t


def FetchTorch(name):
    """The tensor of blob ``name`` as a (CPU) torch tensor bound to the blob (see above)."""
    return _fetch_torch(_ws(), StringifyBlobName(name))


def HasBlob(name):
    return _ws().has_blob(StringifyBlobName(name))


def CreateBlob(name):
    _ws().create_blob(StringifyBlobName(name))
    return True


def RemoveBlob(name):
    return _ws().remove_blob(StringifyBlobName(name))


def Blobs():
    return _ws().blobs()


def SerializeBlob(name):
    """The serialized BlobProto of blob ``name`` (as one record, the way Save writes it)."""
    return _ws().serialize_blob(StringifyBlobName(name))


def DeserializeBlob(name, serialized_blob):
    """Creates or replaces blob ``name`` from serialized BlobProto bytes."""
    _ws().deserialize_blob(StringifyBlobName(name), bytes(serialized_blob))


class _BlobsDict:
    """``workspace.blobs``: a dict-like view of the current workspace's blobs."""

    def __getitem__(self, name):
        return FetchBlob(name)

    def __setitem__(self, name, value):
        FeedBlob(name, value)

    def __delitem__(self, name):
        if not RemoveBlob(name):
            raise KeyError(name)

    def __contains__(self, name):
        return HasBlob(name)

    def __len__(self):
        return len(Blobs())

    def __iter__(self):
        return iter(Blobs())

    def keys(self):
        return Blobs()


blobs = _BlobsDict()


# -- nets, ops, plans -----------------------------------------------------------------------


def _net_proto(net):
    if hasattr(net, "Proto") and callable(net.Proto):
        net = net.Proto()
    return net


def CreateNet(net, overwrite=False, input_blobs=None):
    """Instantiates ``net`` (core.Net or NetDef) in the current workspace. Returns True."""
    ws = _ws()
    for b in input_blobs or []:
        ws.create_blob(StringifyBlobName(b))
    ws.create_net(StringifyProto(_net_proto(net)), bool(overwrite))
    return True


def Nets():
    return _ws().nets()


def RunNet(name, num_iter=1, allow_fail=False):
    """Runs a created net ``num_iter`` times. Returns True (False on failure with allow_fail)."""
    # The common call (a name, one iteration, no bound torch tensors) goes straight to the
    # native run: serving loops call this for nets that run in a few microseconds.
    if type(name) is not str:
        name = StringifyNetName(name)
    if type(num_iter) is not int:
        num_iter = int(num_iter)
    ws = _workspaces[_current]
    try:
        if _torch_bound:
            _run(ws, ws.run_net, name, num_iter)
        else:
            ws.run_net(name, num_iter)
    except RuntimeError:
        if allow_fail:
            return False
        raise
    return True


def RunNetOnce(net):
    ws = _ws()
    _run(ws, ws.run_net_once, StringifyProto(_net_proto(net)))
    return True


def RunOperatorOnce(operator):
    ws = _ws()
    _run(ws, ws.run_operator_once, StringifyProto(operator))
    return True


_Cost = collections.namedtuple("Cost", ["flops", "bytes_written", "bytes_read"])


def GetOperatorCost(operator, blobs):
    """Caffe2's cost estimate of ``operator`` over the current shapes of its input ``blobs``:
    ``Cost(flops, bytes_written, bytes_read)``; a RuntimeError for an op type Caffe2 had no
    cost function for."""
    return _Cost(
        *_native.get_operator_cost(
            _ws(), StringifyProto(operator), [StringifyBlobName(b) for b in blobs]
        )
    )


def InferShapesAndTypes(nets, blob_dimensions=None, nets_proto=False, blob_types=None):
    """Static shapes and types of the blobs of ``nets`` (``core.Net``s, or NetDefs with
    ``nets_proto=True``), from ``blob_dimensions``/``blob_types`` when given, else from the
    current workspace's blobs. Returns ``(shapes, types)``: dicts keyed by blob name of dims
    lists and ``TensorProto.DataType`` numbers; blobs whose shape is unknown are left out."""
    protos = [StringifyProto(n if nets_proto else n.Proto()) for n in nets]
    if blob_dimensions is None:
        assert blob_types is None
        rows = _native.infer_shapes_and_types(protos, workspace=_ws())
    else:
        dims = {str(k): [int(d) for d in v] for k, v in blob_dimensions.items()}
        types = None
        if blob_types is not None:
            types = {str(k): int(v) for k, v in blob_types.items()}
        rows = _native.infer_shapes_and_types(protos, dims=dims, types=types)
    shapes = {name: dims for name, dims, _ in rows}
    types_out = {name: t for name, _, t in rows}
    return shapes, types_out


def RunOperatorsOnce(operators):
    for op in operators:
        RunOperatorOnce(op)
    return True


def RunPlan(plan_or_step):
    """Runs a plan (core.Plan, PlanDef, or a core.ExecutionStep wrapped into a plan)."""
    try:
        from ferrocaffe import core
    except ImportError:  # pragma: no cover - core always ships with the package
        core = None
    if core is not None and isinstance(plan_or_step, getattr(core, "ExecutionStep", ())):
        plan_or_step = core.Plan(plan_or_step)
    ws = _ws()
    _run(ws, ws.run_plan, StringifyProto(plan_or_step))
    return True


def RunOperatorMultiple(operator, num_runs):
    """Runs one instance of ``operator`` ``num_runs`` times."""
    op = operator.Proto() if hasattr(operator, "Proto") else operator
    net = caffe2_pb2.NetDef(name="__run_operator_multiple__", op=[op])
    ws = _ws()
    ws.create_net(StringifyProto(net), True)
    try:
        ws.run_net(net.name, int(num_runs))
    finally:
        ws.delete_net(net.name)
    return True


def ResetBlob(name):
    """Empties blob ``name`` (it keeps existing, holding nothing)."""
    op = caffe2_pb2.OperatorDef(
        type="Free", input=[StringifyBlobName(name)], output=[StringifyBlobName(name)]
    )
    return RunOperatorOnce(op)


class _PlanRun:
    """A plan running on a background thread (``RunPlanInBackground``)."""

    def __init__(self, plan):
        import threading

        self._error = None
        self._done = threading.Event()
        data = StringifyProto(plan)
        ws = _ws()

        def target():
            try:
                ws.run_plan(data)
            except Exception as e:  # noqa: BLE001 - reported through is_succeeded()
                self._error = e
            finally:
                self._done.set()

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def is_done(self):
        return self._done.is_set()

    def is_succeeded(self):
        return self._done.is_set() and self._error is None

    def wait(self, timeout=None):
        return self._done.wait(timeout)

    @property
    def error(self):
        return self._error


def RunPlanInBackground(plan_or_step):
    """Starts a plan on a background thread; returns an object with ``is_done()``,
    ``is_succeeded()`` and ``wait()``."""
    try:
        from ferrocaffe import core
    except ImportError:  # pragma: no cover
        core = None
    if core is not None and isinstance(plan_or_step, getattr(core, "ExecutionStep", ())):
        plan_or_step = core.Plan(plan_or_step)
    return _PlanRun(plan_or_step)


# -- immediate mode: ops run in a workspace of their own as they are created -----------------

_immediate_mode = False
_immediate_workspace_name = "_CAFFE2_IMMEDIATE"
_immediate_root_folder = ""


class _WorkspaceGuard:
    """Makes workspace ``name`` current (created if missing) for the duration of a block."""

    def __init__(self, name):
        self._name = name
        self._saved = None

    def __enter__(self):
        self._saved = _current
        SwitchWorkspace(self._name, True)

    def __exit__(self, *exc):
        SwitchWorkspace(self._saved)
        return False


def IsImmediate():
    """Whether immediate mode is on (``core.CreateOperator`` then also runs each op)."""
    return _immediate_mode


def StartImmediate(i_know=False):
    """Turns immediate mode on: each operator created runs at once in a separate workspace
    (``_CAFFE2_IMMEDIATE``, rooted in a new temporary folder); read it with
    ``FetchImmediate``/``ImmediateBlobs``."""
    global _immediate_mode, _immediate_root_folder
    if IsImmediate():
        StopImmediate()
    _immediate_mode = True
    with _WorkspaceGuard(_immediate_workspace_name):
        _immediate_root_folder = tempfile.mkdtemp()
        ResetWorkspace(_immediate_root_folder)
    if not i_know:
        print("Immediate mode is on: every operator created also runs (a debugging aid).")


def StopImmediate():
    """Turns immediate mode off, emptying its workspace and removing its root folder."""
    global _immediate_mode, _immediate_root_folder
    if not IsImmediate():
        return
    with _WorkspaceGuard(_immediate_workspace_name):
        ResetWorkspace()
    shutil.rmtree(_immediate_root_folder, ignore_errors=True)
    _immediate_root_folder = ""
    _immediate_mode = False


def ImmediateBlobs():
    with _WorkspaceGuard(_immediate_workspace_name):
        return Blobs()


def RunOperatorImmediate(op):
    with _WorkspaceGuard(_immediate_workspace_name):
        RunOperatorOnce(op)


def FetchImmediate(*args, **kwargs):
    with _WorkspaceGuard(_immediate_workspace_name):
        return FetchBlob(*args, **kwargs)


def FeedImmediate(*args, **kwargs):
    with _WorkspaceGuard(_immediate_workspace_name):
        return FeedBlob(*args, **kwargs)


# -- transforms ------------------------------------------------------------------------------


def ApplyTransform(transform_key, net):
    """``net`` (NetDef or core.Net) rewritten by the registered transform ``transform_key``,
    as a new NetDef; an unknown key is a RuntimeError."""
    data = _native.apply_transform(str(transform_key), StringifyProto(_net_proto(net)))
    return caffe2_pb2.NetDef.FromString(data)


def _mean_run_seconds(ws, name, warmup_runs, main_runs):
    import time

    if warmup_runs > 0:
        ws.run_net(name, int(warmup_runs))
    start = time.perf_counter()
    if main_runs > 0:
        ws.run_net(name, int(main_runs))
    return (time.perf_counter() - start) / max(int(main_runs), 1)


def ApplyTransformIfFaster(
    transform_key, net, init_net, warmup_runs=5, main_runs=10, improvement_threshold=1.0
):
    """The transformed ``net`` when it runs faster than ``net`` by ``improvement_threshold``
    (its time times the threshold is below the original's), else ``net`` itself (a copy).
    Both are timed in a new workspace after ``init_net`` ran there."""
    original = caffe2_pb2.NetDef()
    original.CopyFrom(_net_proto(net))
    transformed = ApplyTransform(transform_key, original)
    init = StringifyProto(_net_proto(init_net))
    times = []
    for candidate in (original, transformed):
        ws = _native.Workspace()
        ws.run_net_once(init)
        ws.create_net(candidate.SerializeToString(), True)
        times.append(_mean_run_seconds(ws, candidate.name, warmup_runs, main_runs))
    if times[1] * float(improvement_threshold) < times[0]:
        return transformed
    return original


# -- Predictor -------------------------------------------------------------------------------


class Predictor:
    """Caffe2's ``Predictor`` over the current workspace: runs ``init_net`` once, creates
    ``predict_net``; ``run(inputs)`` feeds its inputs (the external inputs the init net does
    not produce, in order; or a dict by name), runs it and returns its external outputs."""

    def __init__(self, init_net, predict_net):
        ws = _ws()
        init = caffe2_pb2.NetDef.FromString(StringifyProto(init_net))
        net = caffe2_pb2.NetDef.FromString(StringifyProto(predict_net))
        ws.run_net_once(init.SerializeToString())
        made = {b for op in init.op for b in op.output}
        self._ws = ws
        self._inputs = [b for b in net.external_input if b not in made]
        self._outputs = list(net.external_output)
        for b in self._inputs:
            ws.create_blob(b)
        self._name = net.name
        ws.create_net(net.SerializeToString(), True)

    def run(self, inputs):
        if isinstance(inputs, dict):
            items = list(inputs.items())
        else:
            inputs = list(inputs)
            if len(inputs) > len(self._inputs):
                raise RuntimeError(
                    "Predictor.run: %d inputs given, the net has %d (%s)"
                    % (len(inputs), len(self._inputs), ", ".join(self._inputs))
                )
            items = list(zip(self._inputs, inputs, strict=False))
        for name, value in items:
            _feed(self._ws, StringifyBlobName(name), value)
        self._ws.run_net(self._name, 1)
        return [_fetched(self._ws.fetch(b)) for b in self._outputs]


def RegisteredOperators():
    """Every operator type the engine knows (with a kernel or a schema), sorted."""
    return sorted(set(_native.kernel_types()) | set(_native.registered_operators()))


@contextlib.contextmanager
def WorkspaceGuard(workspace_name):
    """Within the block, workspace ``workspace_name`` (created if missing) is the current one;
    the previous one is current again afterwards."""
    previous = CurrentWorkspace()
    SwitchWorkspace(workspace_name, True)
    try:
        yield
    finally:
        SwitchWorkspace(previous)


# Caffe2 exported some operators to PyTorch (torch.ops._caffe2.*) when its library loaded.
torch_ops.install()
