//! The one place where `ferrocaffe::Error` becomes a Python exception.

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    DecodeError,
    PyValueError,
    "Bytes that are not a valid serialization of the expected protobuf message."
);

/// Maps a core error to the Python exception class users catch.
pub fn to_py(err: ferrocaffe::Error) -> PyErr {
    use ferrocaffe::Error as E;
    let msg = err.to_string();
    match err {
        E::Decode { .. } => DecodeError::new_err(msg),
        E::InvalidArgument(_) => PyValueError::new_err(msg),
        E::NotFound(_) => PyKeyError::new_err(msg),
        E::Runtime(_) => PyRuntimeError::new_err(msg),
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

/// Extension trait: `result.py()?` converts a core `Result` into a `PyResult`.
pub trait IntoPy<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for ferrocaffe::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DecodeError", m.py().get_type::<DecodeError>())?;
    Ok(())
}
