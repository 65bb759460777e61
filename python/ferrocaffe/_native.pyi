"""Type stubs for ``ferrocaffe._native``, the compiled binding (rust/ferrocaffe-python).

Keep in step with the ``#[pyfunction]``s registered in rust/ferrocaffe-python/src/lib.rs;
tests/test_native_stubs.py checks that every public name here exists there and vice versa.
"""

import os

__version__: str

class DecodeError(ValueError):
    """Bytes that are not a valid serialization of the expected protobuf message."""

def file_descriptor_set() -> bytes:
    """The encoded ``FileDescriptorSet`` of caffe2.proto (``caffe2_pb2`` is built from it)."""

def registered_operators() -> list[str]:
    """Every operator type the engine knows, sorted."""

def op_schema(op_type: str) -> dict[str, object] | None:
    """The schema of an operator type (input/output count bounds and count masks, in-place
    pairs, argument and blob names), or None for an unknown type."""

def roundtrip(kind: str, data: bytes) -> bytes:
    """Decodes ``data`` as the caffe2 message ``kind`` (``"NetDef"`` or ``"caffe2.NetDef"``)
    in Rust and returns Rust's encoding of it. Unknown fields are dropped.

    Raises ``DecodeError`` for malformed bytes, ``ValueError`` for an unknown ``kind``."""

def message_names() -> list[str]:
    """Full names of every message in caffe2.proto, in schema order."""

class InternalError(RuntimeError):
    """A bug in the engine (a Rust panic) caught at the boundary: the message names the entry
    point (``"Workspace.run_net: internal error (panic): ..."``). Every entry point that calls
    into the engine raises it instead of letting the panic through as pyo3's
    ``PanicException`` (a ``BaseException``, which ``except Exception`` would miss). Starting
    the process with ``FERROCAFFE_TEST_PANIC=<entry point>`` (or ``<entry point>/detached``,
    with the GIL released) makes that entry point panic, for tests."""

class IllegalGraphTransformError(ValueError):
    """A graph edit that would change what other ops read (see ``ferrocaffe.graph``)."""

# --- SSA (``ferrocaffe.core.ssa`` wraps these) ---------------------------------------------
Versioned = tuple[str, int]
SsaOp = tuple[list[Versioned], list[Versioned]]

def ssa_get_ssa(
    net: bytes, start: list[Versioned] | None = None
) -> tuple[list[SsaOp], dict[str, int]]:
    """``core.get_ssa`` on a serialized NetDef; ``start`` holds the starting blob versions."""

def ssa_get_op_ids_in_path(
    ssa: list[SsaOp], inputs: list[Versioned], outputs: list[Versioned]
) -> list[int]:
    """Indices of the ops on a path from ``inputs`` to ``outputs``, sorted."""

# --- Graph surgery (``ferrocaffe.graph`` wraps these; nets cross as NetDef bytes) -----------
def graph_producer_map(net: bytes) -> dict[Versioned, tuple[int, int]]: ...
def graph_consumer_map(net: bytes) -> dict[Versioned, list[tuple[int, int]]]: ...
def graph_rename_op_input(
    net: bytes,
    init_net: bytes | None,
    op: int,
    input: int,
    new_name: str,
    at_producer: bool,
) -> tuple[bytes, bytes | None]: ...
def graph_rename_op_output(net: bytes, op: int, output: int, new_name: str) -> bytes: ...
def graph_remove_dead_end_ops(net: bytes) -> tuple[bytes, list[int]]: ...
def graph_remove_ops(net: bytes, ops: list[int]) -> bytes: ...
def graph_sub_graph_io(net: bytes, ops: list[int]) -> tuple[list[Versioned], list[Versioned]]: ...
def graph_find_chains(net: bytes, op_type: str, min_length: int) -> list[list[int]]: ...
def graph_versioned_external_outputs(net: bytes) -> list[Versioned]: ...

# --- Memonger (``ferrocaffe.memonger`` wraps these) --------------------------------------------
def memonger_optimize_inference_net(net: bytes, static_blobs: list[str]) -> bytes: ...
def memonger_compute_blob_recycling_for_dag(
    net: bytes,
    heads: list[str],
    op_indices: list[int],
    shareable_blobs: set[str],
    namescope: str,
    dont_share_blobs: set[str],
    blob_shapes: dict[str, list[int]],
) -> bytes: ...

# --- Autodiff (``ferrocaffe.core.gradients`` wraps these) ----------------------------------
# A gradient crossing the boundary: None, a blob name, or an (indices, values) pair.
Grad = str | tuple[str, str] | None
GradientFunction = tuple[str, object]

def backward_pass(
    ops: list[bytes],
    ys: list[tuple[str, object]],
    functions: list[GradientFunction] = ...,
    adapter: object | None = None,
    next_net_name: object | None = None,
    name_scope: str = "",
    device_scope: bytes | None = None,
    with_state: bool = False,
    slice_type: type | None = None,
    blob_ref: type | None = None,
) -> tuple[bytes, dict[object, object], object]:
    """Backward pass of serialized forward ops: (gradient NetDef bytes, grad map, IR state).
    With ``blob_ref`` (``BlobReference``), the names of the map are instances of it."""

def backward_pass_net(
    net: bytes,
    skip: int,
    ys: list[tuple[str, object]],
    functions: list[GradientFunction] = ...,
    adapter: object | None = None,
    next_net_name: object | None = None,
    name_scope: str = "",
    device_scope: bytes | None = None,
    slice_type: type | None = None,
    blob_ref: type | None = None,
    outputs: set[str] | list[tuple[str, bytes]] | None = None,
    lazy: bool = False,
) -> tuple[bytes, dict[object, object] | GradientMap]:
    """Backward pass of a serialized NetDef's ops from ``skip`` on: (gradient NetDef bytes,
    grad map). The output names of the gradient ops are added to ``outputs`` if it is a set,
    or appended to it as one ``(names, ends)`` pair if it is a list (see ``add_names``). With
    ``lazy``, the map is a ``GradientMap`` whose ``fill`` sets the entries in a dict."""

def add_names(set: set[str], names: str, ends: bytes) -> None:
    """Adds to ``set`` the names of a ``(names, ends)`` pair from ``backward_pass_net``: the
    names concatenated, and the UTF-8 byte offset where each ends (u64 little-endian)."""

def time_backward_pass_net(net: bytes, skip: int, ys: list[str], repeat: int = 1) -> float:
    """Best time (seconds) of the Rust side alone of ``backward_pass_net`` (built-in makers,
    no Python objects made), for ``benchmarks/bench_gradients.py``."""

def gradient_for_op(
    op: bytes,
    g_output: list[Grad],
    functions: list[GradientFunction] = ...,
    adapter: object | None = None,
    next_net_name: object | None = None,
    name_scope: str = "",
    device_scope: bytes | None = None,
) -> tuple[bytes, list[Grad]]:
    """Gradient ops (as NetDef bytes) and input gradients of one serialized operator."""

def ir_state(ops: list[bytes], check: bool = True) -> object:
    """Caffe2's IR state (ssa, frontier, input usages...) after playing serialized ops."""

# --- Runtime (``ferrocaffe.workspace`` wraps these) ------------------------------------------
class TensorBuffer:
    """Keeps a tensor's memory alive as the base of a zero-copy numpy array."""

# --- CUDA (``ferrocaffe.workspace``, ``ferrocaffe.cuda_check``) ---------------------------
def cuda_built() -> bool: ...
def num_cuda_devices() -> int: ...
def cuda_unavailable_reason() -> str | None: ...
def cuda_cudnn_version() -> int | None: ...
def cuda_kernel_sources() -> list[tuple[str, str]]: ...
def cuda_nvrtc_options() -> list[str]: ...
def cuda_empty_cache() -> None: ...
def cuda_memory_stats(ordinal: int) -> tuple[int, int]: ...
def cuda_synchronize() -> None: ...
def cuda_native_operators() -> list[str]: ...
def cuda_placement(op_type: str) -> str: ...
def cuda_sgemm_seconds(
    m: int, n: int, k: int, iters: int = 20, ordinal: int = 0, trans_b: bool = False
) -> float: ...

class Workspace:
    """A Rust workspace: named blobs, created nets. Every run releases the GIL."""

    def __init__(self) -> None: ...
    def feed(self, name: str, array: object) -> None: ...
    def to_device(self, name: str, ordinal: int | None) -> None: ...
    def blob_device(self, name: str) -> int | None: ...
    def feed_strings(self, name: str, dims: list[int], values: list[bytes]) -> None: ...
    def feed_bytes(self, name: str, value: bytes) -> None: ...
    def fetch(self, name: str) -> object: ...
    def serialize_blob(self, name: str) -> bytes: ...
    def deserialize_blob(self, name: str, data: bytes) -> None: ...
    def blob_type(self, name: str) -> str: ...
    def tensor_dims(self, name: str) -> list[int] | None: ...
    def tensor_data(self, name: str) -> object: ...
    def tensor_reshape(self, name: str, dims: list[int]) -> None: ...
    def tensor_init(self, name: str, dims: list[int], data_type: int) -> None: ...
    def blob_nbytes(self, name: str) -> int: ...
    def has_blob(self, name: str) -> bool: ...
    def remove_blob(self, name: str) -> bool: ...
    def blobs(self) -> list[str]: ...
    def create_blob(self, name: str) -> None: ...
    def create_net(self, net: bytes, overwrite: bool) -> str: ...
    def run_net(self, name: str, num_iter: int = 1) -> None: ...
    def run_net_once(self, net: bytes) -> None: ...
    def run_operator_once(self, op: bytes) -> None: ...
    def run_plan(self, plan: bytes) -> None: ...
    def nets(self) -> list[str]: ...
    def has_net(self, name: str) -> bool: ...
    def delete_net(self, name: str) -> bool: ...
    def reset(self) -> None: ...
    root_folder: str

def kernel_types() -> list[str]:
    """Op types that have a kernel, sorted."""

# --- blas ---
def blas_load(path: str | os.PathLike[str]) -> None: ...
def blas_set_enabled(enabled: bool) -> None: ...
def blas_backend() -> str: ...
def num_threads() -> int:
    """Threads of the compute team, the caller included: the machine's cores, capped by
    ``FERROCAFFE_NUM_THREADS``."""
    ...

def blas_set_small_kernels(enabled: bool) -> None: ...
def blas_set_blocked(enabled: bool) -> None: ...

class BlobName:
    """The native base of ``core.BlobReference``: a name that hashes and compares like its
    string (equal to a str, bytes or BlobName holding the same name)."""

    _name: str
    def __new__(cls, name: object, *args: object, **kwargs: object) -> BlobName: ...
    def __hash__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def __getnewargs__(self) -> tuple[str]: ...

class GradientMap:
    """A gradient map held natively (``(blob, gradient)`` name pairs), converted to a dict by
    the same code as ``backward_pass_net``'s result: ``backward_pass_net(..., lazy=True)``
    returns one, and the benchmarks' result floor makes one from names."""

    def __new__(cls, entries: list[tuple[str, str]]) -> GradientMap: ...
    def __len__(self) -> int: ...
    def to_dict(self, slice_type: object = None, blob_ref: type | None = None) -> dict: ...
    def fill(self, d: dict) -> None:
        """Sets the entries in ``d`` (with the slice type and reference class of the call
        that made this map)."""

# Collectives (MPI, loaded at run time; see ferrocaffe/collective.py).
def mpi_set_library_candidates(paths: list[str]) -> None:
    """MPI libraries to try (after ``FERROCAFFE_MPI_LIBRARY`` and one already loaded in the
    process) before the default names."""
    ...

def mpi_library() -> tuple[str, str, bool] | None:
    """``(path, abi, initialized_here)`` of the loaded MPI library (``abi``: ``'standard'`` or
    ``'mpich'``), or None before the first collective op ran."""
    ...

def mpi_finalize() -> bool:
    """Finalizes MPI if ferrocaffe initialized it and no request was abandoned."""
    ...

def set_python_op_factory(factory: object) -> None:
    """Installs the maker of `Python`/`PythonGradient` kernels: `factory(op_type, op_bytes)`
    returns a callable the op calls with its `Workspace` each time it runs."""
    ...

def apply_transform(name: str, net: bytes) -> bytes:
    """The serialized NetDef `net` rewritten by the transform registered as `name`."""
    ...

# Static shape/type inference and operator cost (ferrocaffe::shape_infer).
def infer_shapes_and_types(
    nets: list[bytes],
    workspace: Workspace | None = None,
    dims: dict[str, list[int]] | None = None,
    types: dict[str, int] | None = None,
) -> list[tuple[str, list[int], int]]:
    """``(name, dims, dtype)`` of every blob whose shape the nets' ops determine, starting from
    ``dims``/``types`` when given, else from the blobs of ``workspace``."""
    ...

def get_operator_cost(workspace: Workspace, op: bytes, blobs: list[str]) -> tuple[int, int, int]:
    """``(flops, bytes_written, bytes_read)`` of a serialized operator over the shapes of the
    workspace blobs ``blobs``."""
    ...
