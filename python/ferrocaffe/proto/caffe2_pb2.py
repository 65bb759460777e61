"""Caffe2's protobuf message classes, built at import from the schema compiled into the native
module, so Rust and Python always agree on the wire format.

Names match ``caffe2.proto.caffe2_pb2``: messages (``NetDef``, ``OperatorDef``, ...), top-level
enum values (``PROTO_CPU``, ...) and the device type constants Caffe2 patched in (``CPU``,
``CUDA``, ...).
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

from ferrocaffe import _native

_fds = descriptor_pb2.FileDescriptorSet.FromString(_native.file_descriptor_set())
_pool = descriptor_pool.DescriptorPool()
for _f in _fds.file:
    _pool.Add(_f)
DESCRIPTOR = _pool.FindFileByName(_fds.file[0].name)


def _export():
    g = globals()
    for name, desc in DESCRIPTOR.message_types_by_name.items():
        g[name] = message_factory.GetMessageClass(desc)
    for name, enum in DESCRIPTOR.enum_types_by_name.items():
        g[name] = enum_type_wrapper.EnumTypeWrapper(enum)
        for v in enum.values:
            g[v.name] = v.number


_export()

# Device types as Caffe2 exposed them on caffe2_pb2 (from its C++ DeviceType enum).
CPU = 0
CUDA = 1
MKLDNN = 2
OPENGL = 3
OPENCL = 4
IDEEP = 5
HIP = 6
FPGA = 7
ORT = 8
XLA = 9
MLC = 10
COMPILE_TIME_MAX_DEVICE_TYPES = 11
