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
/// | `External` | `RuntimeError`, caused by the callback's exception; a Python operator's exception itself |
///
/// A panic (a bug) caught by [`guard`] or [`detach_guarded`] is an [`InternalError`], a
/// `RuntimeError` naming the entry point.
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
        E::External { source, context } => {
            // An exception of a Python operator's function: raised again as it was (as
            // Caffe2 did), with a note naming the op.
            let source = match source.downcast::<crate::python_op::PythonOpError>() {
                Ok(raised) => {
                    return Python::attach(|py| {
                        let err = raised.err;
                        let note = format!("raised in {context}");
                        let _ = err.value(py).call_method1("add_note", (note,));
                        err
                    })
                }
                Err(other) => other,
            };
            let e = PyRuntimeError::new_err(msg);
            if let Ok(cause) = source.downcast::<PyErr>() {
                Python::attach(|py| e.set_cause(py, Some(*cause)));
            }
            e
        }
    }
}

pyo3::create_exception!(
    _native,
    InternalError,
    PyRuntimeError,
    "A bug in the engine (a Rust panic) caught at the boundary: a RuntimeError naming the \
     entry point, never pyo3's PanicException (a BaseException that `except Exception` misses)."
);

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// A panic caught at entry point `what` (a bug, never user input): an [`InternalError`] (a
/// `RuntimeError`) saying so. Needs no GIL (the exception is made when raised).
pub fn panic_to_py(what: &str, payload: Box<dyn std::any::Any + Send>) -> PyErr {
    InternalError::new_err(format!(
        "{what}: internal error (panic): {}",
        panic_message(payload.as_ref())
    ))
}

/// Runs the body of entry point `what` (its Python name, e.g. `"Workspace.run_net"`) with
/// any panic caught: a panic becomes an [`InternalError`] naming `what`. Every entry point of
/// the module that calls into the engine runs in one; `FERROCAFFE_TEST_PANIC=<what>` makes it
/// panic (see `ferrocaffe::error::panic_hook_for_tests`).
pub fn guard<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ferrocaffe::error::panic_hook_for_tests(what);
        f()
    }))
    .unwrap_or_else(|p| Err(panic_to_py(what, p)))
}

/// [`guard`] for a body that cannot fail but for a panic.
pub fn guard_ok<T>(what: &str, f: impl FnOnce() -> T) -> PyResult<T> {
    guard(what, || Ok(f()))
}

/// Runs `f` with the GIL released and any panic caught: a panic becomes an [`InternalError`]
/// naming `what` (the entry point), never a `PanicException`, which `except Exception` would
/// miss. `FERROCAFFE_TEST_PANIC=<what>/detached` makes it panic with the GIL released.
pub fn detach_guarded<T: Send>(
    py: Python<'_>,
    what: &str,
    f: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    py.detach(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if ferrocaffe::error::test_panics_enabled() {
                ferrocaffe::error::panic_hook_for_tests(&format!("{what}/detached"));
            }
            f()
        }))
    })
    .map_err(|p| panic_to_py(what, p))
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
    m.add("InternalError", m.py().get_type::<InternalError>())?;
    m.add(
        "IllegalGraphTransformError",
        m.py().get_type::<IllegalGraphTransformError>(),
    )?;
    Ok(())
}
