//! The one place where `ferrocaffe::Error` becomes a Python exception.

use pyo3::exceptions::{
    PyAssertionError, PyException, PyKeyError, PyMemoryError, PyRuntimeError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    DecodeError,
    PyValueError,
    "Bytes that are not a valid serialization of the expected protobuf message."
);

pyo3::create_exception!(
    _native,
    IllegalGraphTransformError,
    PyValueError,
    "A graph edit that would change what the net computes."
);

/// Maps a core error to the Python exception class Caffe2 raised for it. The message is the
/// error's text, unchanged.
///
/// | kind | Python |
/// | --- | --- |
/// | `Decode` | `DecodeError` (a `ValueError`) |
/// | `InvalidArgument` | `ValueError` |
/// | `NotFound` | `KeyError` |
/// | `IllegalGraphTransform` | `IllegalGraphTransformError` (a `ValueError`) |
/// | `Runtime`, `Schema`, `ShapeMismatch`, `DtypeMismatch`, `Device`, `MissingBlob`, `BadArgument`, `NotImplemented` | `RuntimeError` (Caffe2's `EnforceNotMet`) |
/// | `OutOfMemory` | `MemoryError` |
/// | `Assertion` | `AssertionError` |
/// | `Type` | `TypeError` |
/// | `GradientMaker` | `Exception` |
/// | `External` | `RuntimeError`, caused by the callback's exception |
pub fn to_py(err: ferrocaffe::Error) -> PyErr {
    use ferrocaffe::Error as E;
    let msg = err.to_string();
    match err {
        E::Decode { .. } => DecodeError::new_err(msg),
        E::InvalidArgument(_) => PyValueError::new_err(msg),
        E::NotFound(_) => PyKeyError::new_err(msg),
        E::IllegalGraphTransform(_) => IllegalGraphTransformError::new_err(msg),
        // What Caffe2 enforced (`CAFFE_ENFORCE`, `CAFFE_THROW`): its C++ `EnforceNotMet`,
        // which Python saw as a RuntimeError whatever the cause.
        E::Runtime(_)
        | E::Schema(_)
        | E::ShapeMismatch(_)
        | E::DtypeMismatch(_)
        | E::Device(_)
        | E::MissingBlob(_)
        | E::BadArgument(_)
        | E::NotImplemented(_) => PyRuntimeError::new_err(msg),
        // A failed allocation (C++ `std::bad_alloc`, which pybind11 raised as MemoryError).
        E::OutOfMemory(_) => PyMemoryError::new_err(msg),
        E::Assertion(_) => PyAssertionError::new_err(msg),
        E::Type(_) => PyTypeError::new_err(msg),
        // Caffe2 raised a bare `Exception` when a gradient maker failed.
        E::GradientMaker { .. } => PyException::new_err(msg),
        // An error of Python code called back: a RuntimeError naming what the engine was
        // doing, caused by the original exception.
        E::External { source, .. } => {
            let e = PyRuntimeError::new_err(msg);
            if let Ok(cause) = source.downcast::<PyErr>() {
                Python::attach(|py| e.set_cause(py, Some(*cause)));
            }
            e
        }
    }
}

/// A panic caught at the boundary (a bug, never user input): a RuntimeError saying so.
pub fn panic_to_py(payload: Box<dyn std::any::Any + Send>) -> PyErr {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    PyRuntimeError::new_err(format!("internal error (panic): {what}"))
}

/// Runs `f` with the GIL released and any panic caught: a panic becomes a Python
/// `RuntimeError` naming `what` (the entry point), never a `PanicException`, which
/// `except Exception` would miss.
pub fn detach_guarded<T: Send>(
    py: Python<'_>,
    what: &str,
    f: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)))
        .map_err(|p| {
            let e = panic_to_py(p);
            PyRuntimeError::new_err(format!(
                "{what}: {}",
                Python::attach(|py| e.value(py).to_string())
            ))
        })
}

/// Extension trait: `result.py()?` converts a core `Result` into a `PyResult`.
pub trait IntoPy<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for ferrocaffe::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// For [`detach_guarded`] around a core call: the panic guard's error, else the call's.
impl<T> IntoPy<T> for PyResult<ferrocaffe::Result<T>> {
    fn py(self) -> PyResult<T> {
        self?.map_err(to_py)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DecodeError", m.py().get_type::<DecodeError>())?;
    m.add(
        "IllegalGraphTransformError",
        m.py().get_type::<IllegalGraphTransformError>(),
    )?;
    Ok(())
}
