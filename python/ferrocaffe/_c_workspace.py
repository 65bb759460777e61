"""``workspace.C``: the native module as Caffe2's pybind module ``caffe2_pybind11_state``
looked to Python code, with its ``Workspace`` class: a workspace object of its own (not the
current one) whose blobs are ``Blob`` handles (``ws.create_blob("X").feed(x)``,
``ws.blobs["X"].fetch()``) and which runs operators, nets and plans given as protos or
``core.Net`` objects (``ws.run(op)``, ``ws.create_net(net).run()``)."""

from ferrocaffe import _native
from ferrocaffe.proto import caffe2_pb2


def _proto_bytes(obj):
    """(kind, serialized proto) of an OperatorDef, NetDef, PlanDef or an object with
    ``Proto()`` (core.Net, core.Plan)."""
    if hasattr(obj, "Proto") and callable(obj.Proto):
        obj = obj.Proto()
    for kind, cls in (
        ("op", caffe2_pb2.OperatorDef),
        ("net", caffe2_pb2.NetDef),
        ("plan", caffe2_pb2.PlanDef),
    ):
        if isinstance(obj, cls):
            return kind, obj.SerializeToString()
    raise TypeError(
        "expected an OperatorDef, NetDef, PlanDef or an object with Proto(), got %s"
        % type(obj).__name__
    )


class Blob:
    """One named blob of a ``Workspace``."""

    def __init__(self, ws, name):
        self._ws = ws
        self._name = name

    def feed(self, arg, device_option=None):
        """Puts ``arg`` (numpy array, bytes/str, TensorProto) into the blob."""
        self._ws.feed_blob(self._name, arg, device_option)
        return True

    def fetch(self):
        return self._ws.fetch_blob(self._name)

    def is_tensor(self):
        return self._ws._native.blob_type(self._name) != "nullptr"

    def __repr__(self):
        return "<Blob %r>" % self._name


class Net:
    """A net created in a ``Workspace``."""

    def __init__(self, ws, name):
        self._ws = ws
        self.name = name

    def run(self):
        self._ws._native.run_net(self.name, 1)

    def __repr__(self):
        return "<Net %r>" % self.name


class Workspace:
    """Caffe2's ``C.Workspace``: a workspace separate from the current one."""

    def __init__(self):
        self._native = _native.Workspace()

    @property
    def blobs(self):
        return {name: Blob(self, name) for name in self._native.blobs()}

    @property
    def nets(self):
        return {name: Net(self, name) for name in self._native.nets()}

    def create_blob(self, name):
        self._native.create_blob(str(name))
        return Blob(self, str(name))

    def has_blob(self, name):
        return self._native.has_blob(str(name))

    def remove_blob(self, name):
        return self._native.remove_blob(str(name))

    def fetch_blob(self, name):
        return self._native.fetch(str(name))

    def feed_blob(self, name, arg, device_option=None):
        from ferrocaffe import workspace

        workspace._feed(self._native, str(name), arg)
        if device_option is not None and device_option.device_type == caffe2_pb2.CUDA:
            self._native.to_device(str(name), int(device_option.device_id))
        return True

    def create_net(self, net, overwrite=False):
        proto = net.Proto() if hasattr(net, "Proto") and callable(net.Proto) else net
        if not isinstance(proto, caffe2_pb2.NetDef):
            raise TypeError("create_net takes a NetDef or a core.Net")
        self._native.create_net(proto.SerializeToString(), bool(overwrite))
        return Net(self, proto.name)

    def run(self, obj):
        """Runs an operator, a net (once) or a plan in this workspace."""
        if isinstance(obj, Net):
            obj.run()
            return
        kind, data = _proto_bytes(obj)
        if kind == "op":
            self._native.run_operator_once(data)
        elif kind == "net":
            self._native.run_net_once(data)
        else:
            self._native.run_plan(data)

    def reset(self):
        self._native.reset()


class CModule:
    """The native module, with ``Workspace``, ``Blob`` and ``Net`` as Caffe2's pybind module
    has them; every other attribute is the native module's."""

    Workspace = Workspace
    Blob = Blob
    Net = Net

    def __getattr__(self, name):
        return getattr(_native, name)


C = CModule()
