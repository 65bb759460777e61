"""Type stubs for ``ferrocaffe._native``, the compiled binding (rust/ferrocaffe-python).

Keep in step with the ``#[pyfunction]``s registered in rust/ferrocaffe-python/src/lib.rs;
tests/test_native_stubs.py checks that every public name here exists there and vice versa.
"""

__version__: str

class DecodeError(ValueError):
    """Bytes that are not a valid serialization of the expected protobuf message."""

def file_descriptor_set() -> bytes:
    """The encoded ``FileDescriptorSet`` of caffe2.proto (``caffe2_pb2`` is built from it)."""

def registered_operators() -> list[str]:
    """Every operator type the engine knows, sorted."""

def roundtrip(kind: str, data: bytes) -> bytes:
    """Decodes ``data`` as the caffe2 message ``kind`` (``"NetDef"`` or ``"caffe2.NetDef"``)
    in Rust and returns Rust's encoding of it. Unknown fields are dropped.

    Raises ``DecodeError`` for malformed bytes, ``ValueError`` for an unknown ``kind``."""

def message_names() -> list[str]:
    """Full names of every message in caffe2.proto, in schema order."""
