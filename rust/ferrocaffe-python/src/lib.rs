//! `ferrocaffe._native`: the thin binding layer. Conversions and error mapping only; all logic
//! lives in the `ferrocaffe` crate.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod autodiff;
mod blas;
mod blob;
mod collective;
mod cuda;
mod errors;
mod graph;
mod python_op;
mod shape_infer;

use errors::{detach_guarded, guard, guard_ok, IntoPy};
mod workspace;

/// The encoded `FileDescriptorSet` of caffe2.proto (used to build `caffe2_pb2`).
#[pyfunction]
fn file_descriptor_set(py: Python<'_>) -> Bound<'_, PyBytes> {
    PyBytes::new(py, ferrocaffe::proto::FILE_DESCRIPTOR_SET)
}

/// Every operator type the engine knows, sorted.
#[pyfunction]
fn registered_operators() -> PyResult<Vec<&'static str>> {
    guard_ok("registered_operators", || {
        ferrocaffe::schema::registered_types().collect()
    })
}

/// The schema of an operator type as a dict (`inputs` and `outputs` as inclusive `(min, max)`
/// with `None` for unbounded, `inplace_allowed` / `inplace_enforced` index pairs, `args`,
/// `input_names`, `output_names`, `private`), or None for an unknown type.
#[pyfunction]
fn op_schema<'py>(py: Python<'py>, op_type: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
    errors::guard("op_schema", || schema_dict(py, op_type))
}

fn schema_dict<'py>(py: Python<'py>, op_type: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(s) = ferrocaffe::schema::lookup(op_type) else {
        return Ok(None);
    };
    let bound = |(lo, hi): (u32, u32)| (lo, (hi != u32::MAX).then_some(hi));
    let d = PyDict::new(py);
    d.set_item("inputs", bound(s.inputs))?;
    d.set_item("outputs", bound(s.outputs))?;
    d.set_item("inplace_allowed", s.inplace_allowed.to_vec())?;
    d.set_item("inplace_enforced", s.inplace_enforced.to_vec())?;
    d.set_item("args", s.args.to_vec())?;
    d.set_item("input_names", s.input_names.to_vec())?;
    d.set_item("output_names", s.output_names.to_vec())?;
    d.set_item("private", s.private)?;
    d.set_item("input_count_mask", s.input_count_mask)?;
    d.set_item("output_count_mask", s.output_count_mask)?;
    Ok(Some(d))
}

/// Decodes `data` as the caffe2 message `kind` (`"NetDef"` or `"caffe2.NetDef"`, ...) in Rust
/// and returns Rust's encoding of it. Raises `DecodeError` for malformed bytes, `ValueError` for
/// an unknown kind.
#[pyfunction]
fn roundtrip<'py>(py: Python<'py>, kind: &str, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    guard("roundtrip", || {
        let out =
            detach_guarded(py, "roundtrip", || ferrocaffe::proto::reencode(kind, data)).py()?;
        Ok(PyBytes::new(py, &out))
    })
}

/// Full names of every message in caffe2.proto.
#[pyfunction]
fn message_names() -> Vec<&'static str> {
    ferrocaffe::proto::MESSAGE_NAMES.to_vec()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(file_descriptor_set, m)?)?;
    m.add_function(wrap_pyfunction!(registered_operators, m)?)?;
    m.add_function(wrap_pyfunction!(op_schema, m)?)?;
    m.add_function(wrap_pyfunction!(roundtrip, m)?)?;
    m.add_function(wrap_pyfunction!(message_names, m)?)?;
    errors::register(m)?;
    graph::register(m)?;
    blob::register(m)?;
    autodiff::register(m)?;
    blas::register(m)?;
    collective::register(m)?;
    cuda::register(m)?;
    workspace::register(m)?;
    python_op::register(m)?;
    shape_infer::register(m)?;
    Ok(())
}
