//! `ferrocaffe._native`: the thin binding layer. Conversions and error mapping only; all logic
//! lives in the `ferrocaffe` crate.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod autodiff;
mod errors;

/// The encoded `FileDescriptorSet` of caffe2.proto (used to build `caffe2_pb2`).
#[pyfunction]
fn file_descriptor_set(py: Python<'_>) -> Bound<'_, PyBytes> {
    PyBytes::new(py, ferrocaffe::proto::FILE_DESCRIPTOR_SET)
}

/// Every operator type the engine knows, sorted.
#[pyfunction]
fn registered_operators() -> Vec<&'static str> {
    ferrocaffe::ops::registered_types().collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(file_descriptor_set, m)?)?;
    m.add_function(wrap_pyfunction!(registered_operators, m)?)?;
    errors::register(m)?;
    autodiff::register(m)?;
    Ok(())
}
