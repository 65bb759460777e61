"""Caffe2's ``_import_c_extension`` (``workspace.C``): the native module's names and the
object API Caffe2's extension had, ``C.Workspace`` with its ``Blob``, ``TensorCPU`` and ``Net``
handles, written over ``ferrocaffe._native.Workspace``.

Caffe2 loaded the CUDA build of its extension, else the ROCm one, else the CPU one; here the
native module is always ``ferrocaffe._native`` and its names are re-exported. The cuDNN-only
names of Caffe2's CUDA build (``cudnn_convolution_fwd_algo_count``, ...) do not exist, as on
a CPU-only Caffe2. ``use_mkldnn`` is True: IDEEP device options are accepted and run the CPU
kernels (there is no separate MKL-DNN backend: ``has_mkldnn`` is False).
"""

import numpy as np

from ferrocaffe import _native
from ferrocaffe._native import *  # noqa: F401,F403
from ferrocaffe.proto import caffe2_pb2

has_gpu_support = bool(_native.cuda_built()) and _native.num_cuda_devices() > 0
has_cuda_support = has_gpu_support
has_hip_support = False
use_mkldnn = True
has_mkldnn = False


def register_python_op(func, pass_workspace=False, name=""):
    """Registers the function of ``Python`` ops; returns the token they name it by."""
    from ferrocaffe import _python_op

    return _python_op.register_python_op(func, pass_workspace, name)


def register_python_gradient_op(token, func):
    """Registers the function of the ``PythonGradient`` ops of ``token``."""
    from ferrocaffe import _python_op

    _python_op.register_python_gradient_op(token, func)


def _workspace_module():
    from ferrocaffe import workspace

    return workspace


def _serialized(obj, expected):
    """Bytes of a protobuf message (or of ``.Proto()``) of one of the ``expected`` types."""
    if hasattr(obj, "Proto") and callable(obj.Proto):
        obj = obj.Proto()
    if isinstance(obj, expected):
        return obj.SerializeToString()
    raise TypeError(
        "expected %s, got %s" % (" or ".join(t.__name__ for t in expected), type(obj).__name__)
    )


class TensorCPU:
    """A tensor blob seen from Python (Caffe2's ``TensorCPU``): ``data`` is a writable numpy
    view of its elements, ``shape`` its dims; ``reshape``, ``init``, ``feed`` and ``fetch``
    change or copy it. It names its blob: it sees what the blob holds when used."""

    __slots__ = ("_ws", "_name")

    def __init__(self, ws, name):
        self._ws = ws
        self._name = name

    @property
    def data(self):
        return self._ws.tensor_data(self._name)

    @property
    def _shape(self):
        dims = self._ws.tensor_dims(self._name)
        return tuple(dims) if dims is not None else ()

    shape = _shape

    def reshape(self, dims):
        self._ws.tensor_reshape(self._name, [int(d) for d in dims])

    _reshape = reshape
    resize = reshape

    def init(self, dims, caffe_type):
        self._ws.tensor_init(self._name, [int(d) for d in dims], int(caffe_type))

    def feed(self, value):
        """Copies ``value`` (array-like, strings included) into the tensor."""
        _workspace_module()._feed(self._ws, self._name, _copied(value))
        return True

    def fetch(self):
        """A copy of the elements."""
        return _fetched_copy(self._ws.fetch(self._name))

    def __repr__(self):
        return "TensorCPU(%r, shape=%r)" % (self._name, self._shape)


def _copied(value):
    if isinstance(value, (bytes, str)):
        return value
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().cpu().clone().numpy()
    return np.array(value, copy=True)


def _fetched_copy(value):
    return value.copy() if isinstance(value, np.ndarray) else value


class Blob:
    """A blob of a workspace (Caffe2's ``Blob`` handle)."""

    __slots__ = ("_ws", "_name")

    def __init__(self, ws, name):
        self._ws = ws
        self._name = name

    def fetch(self):
        """A copy of the value (numpy array, or bytes for a string blob)."""
        return _fetched_copy(self._ws.fetch(self._name))

    def feed(self, arg, device_option=None):
        """Copies ``arg`` into the blob (onto the device ``device_option`` names)."""
        _workspace_module()._feed_on(self._ws, self._name, _copied(arg), device_option)
        return True

    _feed = feed

    def tensor(self):
        return TensorCPU(self._ws, self._name)

    def is_tensor(self):
        return self._ws.blob_type(self._name) == "Tensor"

    def serialize(self, name):
        """The serialized BlobProto of this blob, recorded under ``name``."""
        data = self._ws.serialize_blob(self._name)
        if name != self._name:
            proto = caffe2_pb2.BlobProto.FromString(data)
            proto.name = name
            data = proto.SerializeToString()
        return data

    def deserialize(self, serialized):
        self._ws.deserialize_blob(self._name, bytes(serialized))

    def to_torch(self):
        """A torch tensor bound to this blob (see ``workspace.FetchTorch``)."""
        return _workspace_module()._fetch_torch(self._ws, self._name)

    def __repr__(self):
        return "Blob(%r)" % (self._name,)


class Net:
    """A net created in a workspace (Caffe2's ``NetBase`` handle)."""

    __slots__ = ("_ws", "name")

    def __init__(self, ws, name):
        self._ws = ws
        self.name = name

    def run(self):
        self._ws.run_net(self.name, 1)
        return True

    def __repr__(self):
        return "Net(%r)" % (self.name,)


class _WorkspaceType(type):
    @property
    def current(cls):
        """The current workspace of the ``workspace`` module."""
        return cls._wrap(_workspace_module()._ws())


class Workspace(metaclass=_WorkspaceType):
    """A workspace (Caffe2's ``C.Workspace``): a new empty one, or with ``Workspace(other)``
    a handle on ``other``'s blobs and nets."""

    __slots__ = ("_ws", "__weakref__")

    def __init__(self, other=None):
        if other is None:
            self._ws = _native.Workspace()
        elif isinstance(other, Workspace):
            self._ws = other._ws
        else:
            raise TypeError("Workspace() takes another Workspace or nothing")

    @classmethod
    def _wrap(cls, native):
        w = cls.__new__(cls)
        w._ws = native
        return w

    def __eq__(self, other):
        return isinstance(other, Workspace) and other._ws is self._ws

    def __hash__(self):
        return id(self._ws)

    @property
    def blobs(self):
        return {n: Blob(self._ws, n) for n in self._ws.blobs()}

    @property
    def nets(self):
        return {n: Net(self._ws, n) for n in self._ws.nets()}

    @property
    def root_folder(self):
        return self._ws.root_folder

    # Caffe2 recorded where a failed net stopped; runs here report the op in the error.
    _last_failed_op_net_position = -1

    def create_blob(self, name):
        name = str(name)
        self._ws.create_blob(name)
        return Blob(self._ws, name)

    def has_blob(self, name):
        return self._ws.has_blob(str(name))

    def fetch_blob(self, name):
        return _fetched_copy(self._ws.fetch(str(name)))

    def feed_blob(self, name, arr, device_option=None):
        _workspace_module()._feed_on(self._ws, str(name), arr, device_option)
        return True

    def _remove_blob(self, name):
        return self._ws.remove_blob(str(name))

    def create_net(self, net, overwrite=False):
        """Instantiates ``net`` (NetDef or core.Net); returns its handle."""
        data = _serialized(net, (caffe2_pb2.NetDef,))
        return self._create_net(data, overwrite)

    def _create_net(self, data, overwrite=False):
        name = caffe2_pb2.NetDef.FromString(data).name
        self._ws.create_net(bytes(data), bool(overwrite))
        return Net(self._ws, name)

    def run(self, obj):
        """Runs an OperatorDef, a NetDef or core.Net (once, not kept), or a PlanDef, core.Plan
        or core.ExecutionStep."""
        from ferrocaffe import core

        if isinstance(obj, core.ExecutionStep):
            obj = core.Plan(obj)
        if hasattr(obj, "Proto") and callable(obj.Proto):
            obj = obj.Proto()
        if isinstance(obj, caffe2_pb2.OperatorDef):
            return self._run_operator(obj.SerializeToString())
        if isinstance(obj, caffe2_pb2.NetDef):
            return self._run_net(obj.SerializeToString())
        if isinstance(obj, caffe2_pb2.PlanDef):
            return self._run_plan(obj.SerializeToString())
        raise TypeError(
            "Workspace.run takes an operator, a net or a plan, got %s" % type(obj).__name__
        )

    def _run_operator(self, data):
        self._ws.run_operator_once(bytes(data))
        return True

    def _run_net(self, data):
        self._ws.run_net_once(bytes(data))
        return True

    def _run_plan(self, data):
        self._ws.run_plan(bytes(data))
        return True

    def __repr__(self):
        return "Workspace(blobs=%d, nets=%d)" % (len(self._ws.blobs()), len(self._ws.nets()))
