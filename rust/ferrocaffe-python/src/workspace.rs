//! `_native.Workspace`: a handle on a Rust workspace. numpy ↔ Tensor conversion (zero-copy
//! where the layout allows), protobuf bytes in, and nothing else: every run releases the GIL
//! and no panic crosses into Python.

use std::ffi::c_void;
use std::sync::Arc;

use numpy::npyffi::{self, flags, npy_intp, NpyTypes, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use ferrocaffe::proto::{self, NetDef, OperatorDef, PlanDef};

use ferrocaffe::tensor::{DataType, Snapshot, Tensor};
use ferrocaffe::workspace::{Blob, Workspace as CoreWorkspace};

use crate::errors::{detach_guarded, guard, guard_ok, IntoPy};

/// Runs core call `f` of entry point `what` without the GIL (see [`detach_guarded`]).
fn guarded<T: Send>(
    py: Python<'_>,
    what: &str,
    f: impl FnOnce() -> ferrocaffe::Result<T> + Send,
) -> PyResult<T> {
    detach_guarded(py, what, f).py()
}

/// Keeps a snapshot alive as the base object of a zero-copy numpy array.
#[pyclass(module = "ferrocaffe._native", frozen)]
struct TensorBuffer {
    _snap: Snapshot,
}

/// Keeps a fed numpy array alive while a tensor reads its memory.
struct ArrayOwner(#[allow(dead_code)] Py<PyAny>);

fn dtype_of(d: &Bound<'_, PyArrayDescr>) -> Option<DataType> {
    Some(match (d.kind(), d.itemsize()) {
        (b'f', 2) => DataType::Float16,
        (b'f', 4) => DataType::Float,
        (b'f', 8) => DataType::Double,
        (b'i', 1) => DataType::Int8,
        (b'i', 2) => DataType::Int16,
        (b'i', 4) => DataType::Int32,
        (b'i', 8) => DataType::Int64,
        (b'u', 1) => DataType::Uint8,
        (b'u', 2) => DataType::Uint16,
        (b'b', 1) => DataType::Bool,
        _ => return None,
    })
}

fn array_to_tensor(arr: &Bound<'_, PyUntypedArray>) -> PyResult<Tensor> {
    let descr = arr.dtype();
    let dt = dtype_of(&descr).ok_or_else(|| {
        PyTypeError::new_err(format!("cannot feed a numpy array of dtype {descr}"))
    })?;
    if !arr.is_c_contiguous() || !arr.is_aligned() || descr.is_native_byteorder() == Some(false) {
        return Err(PyTypeError::new_err(
            "internal: feed needs a C-contiguous, aligned, native-order array",
        ));
    }
    let dims: Vec<usize> = arr.shape().to_vec();
    if dt == DataType::Bool {
        // numpy can hold bytes other than 0/1 in a bool array (views of uint8); those are not
        // valid Rust bools, so such arrays are copied and normalised.
        let n: usize = dims.iter().product();
        // SAFETY: a C-contiguous bool array has n readable bytes at `data`.
        let bytes = unsafe {
            std::slice::from_raw_parts((*arr.as_array_ptr()).fields.data as *const u8, n)
        };
        if bytes.iter().any(|&b| b > 1) {
            let v: Vec<bool> = bytes.iter().map(|&b| b != 0).collect();
            return Tensor::from_vec(&dims, v).py();
        }
    }
    // SAFETY: the array object stays alive in the owner; numpy guarantees `data` is valid for
    // the contiguous, aligned extent checked above.
    unsafe {
        let data = (*arr.as_array_ptr()).fields.data as *const u8;
        let owner = ArrayOwner(arr.clone().into_any().unbind());
        Tensor::from_external(dt, &dims, data, Box::new(owner)).py()
    }
}

fn snapshot_to_array<'py>(py: Python<'py>, snap: Snapshot) -> PyResult<Bound<'py, PyAny>> {
    array_over(py, snap, false)
}

/// A numpy array over the snapshot's memory: read-only, or writable for a buffer the caller
/// has just made this tensor's alone (strings always come back as a new object array).
fn array_over<'py>(py: Python<'py>, snap: Snapshot, writable: bool) -> PyResult<Bound<'py, PyAny>> {
    if snap.dtype() == DataType::String {
        let items: Vec<Bound<'py, PyBytes>> =
            snap.strings().iter().map(|s| PyBytes::new(py, s)).collect();
        let list = PyList::new(py, items)?;
        let np = py.import("numpy")?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("dtype", "object")?;
        let flat = np.getattr("array")?.call((list,), Some(&kwargs))?;
        let dims: Vec<usize> = snap.dims().to_vec();
        return flat.call_method1("reshape", (dims,));
    }
    let descr = PyArrayDescr::new(py, snap.dtype().name())?;
    let mut dims: Vec<npy_intp> = snap.dims().iter().map(|&d| d as npy_intp).collect();
    let nd = dims.len() as i32;
    let data = snap.as_ptr() as *mut c_void;
    let owner = Bound::new(py, TensorBuffer { _snap: snap })?;
    let mut npy_flags = flags::NPY_ARRAY_C_CONTIGUOUS | flags::NPY_ARRAY_ALIGNED;
    if writable {
        npy_flags |= flags::NPY_ARRAY_WRITEABLE;
    }
    // SAFETY: standard numpy C-API use: a new C-contiguous array over `data`, which the base
    // object (holding the snapshot) keeps alive. A read-only one is never written
    // (copy-on-write); a writable one is `Blob.tensor().data`, Caffe2's live view of a blob.
    unsafe {
        let ty = npyffi::get_type_object(py, NpyTypes::PyArray_Type);
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            ty,
            descr.into_dtype_ptr(),
            nd,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data,
            npy_flags,
            std::ptr::null_mut(),
        );
        if ptr.is_null() {
            return Err(PyErr::fetch(py));
        }
        let arr = Bound::from_owned_ptr(py, ptr);
        if PY_ARRAY_API.PyArray_SetBaseObject(
            py,
            ptr as *mut npyffi::PyArrayObject,
            owner.into_ptr(),
        ) < 0
        {
            return Err(PyErr::fetch(py));
        }
        Ok(arr)
    }
}

/// A Rust workspace.
#[pyclass(module = "ferrocaffe._native", name = "Workspace", frozen)]
pub struct PyWorkspace {
    pub(crate) ws: Arc<CoreWorkspace>,
}

impl PyWorkspace {
    /// A handle on an existing core workspace (the one a Python operator runs in).
    pub(crate) fn from_core(ws: Arc<CoreWorkspace>) -> Self {
        PyWorkspace { ws }
    }
}

/// The tensor of blob `name` for writing from Python: a host tensor, else a RuntimeError.
fn host_tensor_mut<'b>(name: &str, b: &'b mut Blob) -> PyResult<&'b mut Tensor> {
    let problem = match &*b {
        Blob::Tensor(t) if t.is_host() => None,
        Blob::Tensor(t) => Some(format!(
            "blob '{name}' holds a tensor on {}; only host tensors can be read or written \
             in place from Python",
            t.device()
        )),
        other => Some(format!(
            "blob '{name}' holds {}, not a tensor",
            other.type_name()
        )),
    };
    match problem {
        Some(msg) => Err(PyRuntimeError::new_err(msg)),
        None => Ok(b.tensor_mut()),
    }
}

#[pymethods]
impl PyWorkspace {
    /// The dims of the tensor in blob `name`, or None when it holds no tensor.
    fn tensor_dims(&self, name: &str) -> PyResult<Option<Vec<usize>>> {
        guard("Workspace.tensor_dims", || {
            let h = self.ws.blob(name).py()?;
            let b = h.read();
            Ok(b.tensor().map(|t| t.dims().to_vec()))
        })
    }

    /// A writable numpy array over the data of the tensor in blob `name` (Caffe2's
    /// `TensorCPU.data`). The buffer is made the blob's own first, so earlier fetches keep
    /// their values; an op that later writes the blob while the array lives copies first
    /// (the array then no longer shows the blob). String tensors come back as a copy.
    fn tensor_data<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        guard("Workspace.tensor_data", || {
            let h = self.ws.blob(name).py()?;
            let snap = {
                let mut b = h.write();
                let t = host_tensor_mut(name, &mut b)?;
                if t.dtype() != DataType::String {
                    // Copies a shared or borrowed buffer, so that writes reach this blob only.
                    let _ = t.bytes_mut();
                }
                t.snapshot()
            };
            let writable = snap.dtype() != DataType::String;
            array_over(py, snap, writable)
        })
    }

    /// Gives the tensor of blob `name` shape `dims` (Caffe2's `TensorCPU.reshape`): the same
    /// data when the element count is unchanged, else a new buffer of the same type. A blob
    /// holding nothing becomes a float tensor.
    fn tensor_reshape(&self, name: &str, dims: Vec<usize>) -> PyResult<()> {
        guard("Workspace.tensor_reshape", || {
            let h = self.ws.create_blob(name);
            let mut b = h.write();
            if !b.is_tensor() {
                b.tensor_mut();
            }
            let t = host_tensor_mut(name, &mut b)?;
            let dtype = t.dtype();
            if !t.try_reshape_in_place(dtype, &dims) {
                t.try_resize(&dims).py()?;
            }
            Ok(())
        })
    }

    /// Makes blob `name` a tensor of `dims` and TensorProto data type `data_type` (Caffe2's
    /// `TensorCPU.init`), zero-filled; strings cannot be made this way.
    fn tensor_init(&self, name: &str, dims: Vec<usize>, data_type: i64) -> PyResult<()> {
        guard("Workspace.tensor_init", || {
            let dtype = DataType::from_proto(data_type).py()?;
            if dtype == DataType::String {
                return Err(PyRuntimeError::new_err(format!(
                    "blob '{name}': a string tensor cannot be initialized from Python (feed \
                     its values instead)"
                )));
            }
            let h = self.ws.create_blob(name);
            let mut b = h.write();
            match &mut *b {
                Blob::Tensor(old) if old.is_host() => {
                    old.try_reset(dtype, &dims).py()?;
                    // A reused buffer keeps old bytes: start from zeros, as a new one does.
                    old.bytes_mut().fill(0);
                }
                other => *other = Blob::Tensor(Tensor::try_new(dtype, &dims).py()?),
            }
            Ok(())
        })
    }

    /// The bytes blob `name` holds (Caffe2's `GetBlobSizeBytes`): elements times their size,
    /// plus the characters of a string tensor; 0 for anything but a tensor.
    fn blob_nbytes(&self, name: &str) -> PyResult<usize> {
        guard("Workspace.blob_nbytes", || {
            let h = self.ws.blob(name).py()?;
            let b = h.read();
            let Some(t) = b.tensor() else {
                return Ok(0);
            };
            let mut n = t.numel().saturating_mul(t.dtype().item_size());
            if t.dtype() == DataType::String {
                let chars: usize = t.as_strings().py()?.iter().map(Vec::len).sum();
                n = n.saturating_add(chars);
            }
            Ok(n)
        })
    }

    #[new]
    fn new() -> PyResult<Self> {
        guard_ok("Workspace", || PyWorkspace {
            ws: CoreWorkspace::new(),
        })
    }

    /// Feeds a numeric numpy array (C-contiguous, aligned, native byte order) without copying.
    fn feed(&self, name: &str, array: &Bound<'_, PyUntypedArray>) -> PyResult<()> {
        guard("Workspace.feed", || {
            let t = array_to_tensor(array)?;
            self.ws.feed(name, t);
            Ok(())
        })
    }

    /// Moves the tensor of blob `name` to CUDA device `ordinal` (a copy; the blob then holds
    /// the device tensor), or to the host when `ordinal` is None.
    #[pyo3(signature = (name, ordinal))]
    fn to_device(&self, py: Python<'_>, name: &str, ordinal: Option<u32>) -> PyResult<()> {
        guard("Workspace.to_device", || {
            let ws = self.ws.clone();
            detach_guarded(py, "Workspace.to_device", move || {
                let h = ws.blob(name)?;
                let mut b = h.write();
                if let Blob::Tensor(t) = &*b {
                    let device = ordinal.map_or(
                        ferrocaffe::device::Device::Cpu,
                        ferrocaffe::device::Device::Cuda,
                    );
                    let moved = ferrocaffe::cuda::to_device(t, device)?;
                    *b = Blob::Tensor(moved);
                }
                Ok(())
            })
            .py()
        })
    }

    /// The device a tensor blob lives on: None for the host, else the CUDA ordinal.
    fn blob_device(&self, name: &str) -> PyResult<Option<u32>> {
        guard("Workspace.blob_device", || {
            let h = self.ws.blob(name).py()?;
            let b = h.read();
            Ok(match b.tensor().map(|t| t.device()) {
                Some(ferrocaffe::device::Device::Cuda(i)) => Some(i),
                _ => None,
            })
        })
    }

    /// Feeds a string tensor of the given shape.
    fn feed_strings(&self, name: &str, dims: Vec<usize>, values: Vec<Vec<u8>>) -> PyResult<()> {
        guard("Workspace.feed_strings", || {
            let t = Tensor::from_strings(&dims, values).py()?;
            self.ws.feed(name, t);
            Ok(())
        })
    }

    /// Stores raw bytes (a `std::string` blob).
    fn feed_bytes(&self, name: &str, value: Vec<u8>) -> PyResult<()> {
        guard_ok("Workspace.feed_bytes", || {
            *self.ws.create_blob(name).write() = Blob::Bytes(value);
        })
    }

    /// The value of a blob: a read-only numpy array sharing the tensor's memory, an object
    /// array of bytes for strings, bytes for a `std::string` blob, and for anything else the
    /// bytes `"<name>, a C++ native class of type <type>."` as Caffe2 returned.
    fn fetch<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        guard("Workspace.fetch", || {
            let h = self.ws.blob(name).py()?;
            let snap = {
                let b = h.read();
                match &*b {
                    // A tensor on a device comes back as a host copy, as Caffe2's FetchBlob does.
                    Blob::Tensor(t) if t.is_host() => t.snapshot(),
                    Blob::Tensor(t) => t.to_host().py()?.snapshot(),
                    Blob::Bytes(v) => return Ok(PyBytes::new(py, v).into_any()),
                    other => {
                        // As Caffe2: a description of what the blob holds.
                        let desc = format!(
                            "{name}, a C++ native class of type {}.",
                            other.caffe2_type_name()
                        );
                        return Ok(PyBytes::new(py, desc.as_bytes()).into_any());
                    }
                }
            };
            snapshot_to_array(py, snap)
        })
    }

    /// The BlobProto bytes of a blob (Caffe2's SerializeBlob).
    fn serialize_blob<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyBytes>> {
        guard("Workspace.serialize_blob", || {
            let ws = self.ws.clone();
            let name = name.to_string();
            let bytes = guarded(py, "Workspace.serialize_blob", move || {
                ws.serialize_blob(&name)
            })?;
            Ok(PyBytes::new(py, &bytes))
        })
    }

    /// Creates or replaces a blob from BlobProto bytes (Caffe2's DeserializeBlob).
    fn deserialize_blob(&self, py: Python<'_>, name: &str, data: Vec<u8>) -> PyResult<()> {
        guard("Workspace.deserialize_blob", || {
            let ws = self.ws.clone();
            let name = name.to_string();
            guarded(py, "Workspace.deserialize_blob", move || {
                ws.deserialize_blob(&name, &data)
            })
        })
    }

    /// What blob `name` holds (`"Tensor"`, `"nothing"`, ...).
    fn blob_type(&self, name: &str) -> PyResult<String> {
        guard("Workspace.blob_type", || {
            let h = self.ws.blob(name).py()?;
            let b = h.read();
            Ok(b.type_name().to_string())
        })
    }

    fn has_blob(&self, name: &str) -> PyResult<bool> {
        guard_ok("Workspace.has_blob", || self.ws.has_blob(name))
    }

    fn remove_blob(&self, name: &str) -> PyResult<bool> {
        guard_ok("Workspace.remove_blob", || self.ws.remove_blob(name))
    }

    /// Every visible blob name, sorted.
    fn blobs(&self) -> PyResult<Vec<String>> {
        guard_ok("Workspace.blobs", || self.ws.blob_names())
    }

    /// Creates an empty blob if none of that name is visible.
    fn create_blob(&self, name: &str) -> PyResult<()> {
        guard_ok("Workspace.create_blob", || {
            self.ws.create_blob(name);
        })
    }

    /// Instantiates a serialized NetDef; returns its name.
    fn create_net(&self, py: Python<'_>, net: &[u8], overwrite: bool) -> PyResult<String> {
        guard("Workspace.create_net", || {
            let def: NetDef = proto::decode(net).py()?;
            let ws = self.ws.clone();
            guarded(py, "Workspace.create_net", move || {
                ws.create_net(&def, overwrite).map(|_| ())
            })?;
            Ok(String::new())
        })
    }

    #[pyo3(signature = (name, num_iter=1))]
    fn run_net(&self, py: Python<'_>, name: &str, num_iter: usize) -> PyResult<()> {
        guard("Workspace.run_net", || {
            let ws = self.ws.clone();
            let name = name.to_string();
            guarded(py, "Workspace.run_net", move || ws.run_net(&name, num_iter))
        })
    }

    fn run_net_once(&self, py: Python<'_>, net: &[u8]) -> PyResult<()> {
        guard("Workspace.run_net_once", || {
            let def: NetDef = proto::decode(net).py()?;
            let ws = self.ws.clone();
            guarded(py, "Workspace.run_net_once", move || ws.run_net_once(&def))
        })
    }

    fn run_operator_once(&self, py: Python<'_>, op: &[u8]) -> PyResult<()> {
        guard("Workspace.run_operator_once", || {
            let def: OperatorDef = proto::decode(op).py()?;
            let ws = self.ws.clone();
            guarded(py, "Workspace.run_operator_once", move || {
                ws.run_operator_once(&def)
            })
        })
    }

    fn run_plan(&self, py: Python<'_>, plan: &[u8]) -> PyResult<()> {
        guard("Workspace.run_plan", || {
            let def: PlanDef = proto::decode(plan).py()?;
            let ws = self.ws.clone();
            guarded(py, "Workspace.run_plan", move || ws.run_plan(&def))
        })
    }

    /// Names of the created nets, sorted.
    fn nets(&self) -> PyResult<Vec<String>> {
        guard_ok("Workspace.nets", || self.ws.net_names())
    }

    fn has_net(&self, name: &str) -> PyResult<bool> {
        guard_ok("Workspace.has_net", || self.ws.get_net(name).is_some())
    }

    fn delete_net(&self, name: &str) -> PyResult<bool> {
        guard_ok("Workspace.delete_net", || self.ws.delete_net(name))
    }

    /// Forgets every blob and net.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        guard("Workspace.reset", || {
            let ws = self.ws.clone();
            guarded(py, "Workspace.reset", move || {
                ws.reset();
                Ok(())
            })
        })
    }

    #[getter]
    fn get_root_folder(&self) -> PyResult<String> {
        guard_ok("Workspace.get_root_folder", || self.ws.root_folder())
    }

    #[setter]
    fn set_root_folder(&self, root: &str) -> PyResult<()> {
        guard_ok("Workspace.set_root_folder", || {
            self.ws.set_root_folder(root);
        })
    }
}

/// Op types that have a CPU (or other) kernel, sorted.
#[pyfunction]
fn kernel_types() -> PyResult<Vec<String>> {
    guard_ok("kernel_types", || {
        ferrocaffe::runtime::default_registry()
            .types()
            .into_iter()
            .map(str::to_string)
            .collect()
    })
}

/// The serialized NetDef `net` rewritten by the transform registered as `name` (Caffe2's
/// `ApplyTransform`); an unknown name is a RuntimeError.
#[pyfunction]
fn apply_transform<'py>(py: Python<'py>, name: &str, net: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    guard("apply_transform", || {
        let def: NetDef = proto::decode(net).py()?;
        let out = ferrocaffe::graph::transform::apply(name, &def).py()?;
        Ok(PyBytes::new(py, &proto::encode(&out)))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(apply_transform, m)?)?;
    m.add_class::<PyWorkspace>()?;
    m.add_class::<TensorBuffer>()?;
    m.add_function(wrap_pyfunction!(kernel_types, m)?)?;
    Ok(())
}
