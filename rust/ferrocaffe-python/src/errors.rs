//! The one place where `ferrocaffe::Error` becomes a Python exception.

use pyo3::exceptions::{
    PyAssertionError, PyException, PyKeyError, PyRuntimeError, PyTypeError, PyValueError,
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

/// Maps a core error to the Python exception class users catch.
pub fn to_py(err: ferrocaffe::Error) -> PyErr {
    use ferrocaffe::Error as E;
    let msg = err.to_string();
    match err {
        E::Decode { .. } => DecodeError::new_err(msg),
        E::InvalidArgument(_) => PyValueError::new_err(msg),
        E::NotFound(_) => PyKeyError::new_err(msg),
        E::IllegalGraphTransform(_) => IllegalGraphTransformError::new_err(msg),
        E::Runtime(_) => PyRuntimeError::new_err(msg),
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
    m.add(
        "IllegalGraphTransformError",
        m.py().get_type::<IllegalGraphTransformError>(),
    )?;
    Ok(())
}
