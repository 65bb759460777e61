//! The GEMM backend switch of `ferrocaffe::blas`, for `ferrocaffe.blas`.

use pyo3::prelude::*;

use crate::errors::{detach_guarded, guard, guard_ok, IntoPy};

/// Loads a CBLAS shared library (`cblas_sgemm` or `scipy_cblas_sgemm`) for every GEMM.
#[pyfunction]
fn blas_load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
    guard("blas_load", || {
        detach_guarded(py, "blas_load", || ferrocaffe::blas::load_cblas(&path)).py()
    })
}

/// Turns the loaded CBLAS library on or off (the `gemm` crate runs when off).
#[pyfunction]
fn blas_set_enabled(enabled: bool) -> PyResult<()> {
    guard_ok("blas_set_enabled", || {
        ferrocaffe::blas::set_cblas_enabled(enabled);
    })
}

/// Turns the small-dimension AVX-512 kernels on or off.
#[pyfunction]
fn blas_set_small_kernels(enabled: bool) -> PyResult<()> {
    guard_ok("blas_set_small_kernels", || {
        ferrocaffe::blas::set_small_kernels_enabled(enabled);
    })
}

/// Turns the blocked AVX2 kernel for large products on or off.
#[pyfunction]
fn blas_set_blocked(enabled: bool) -> PyResult<()> {
    guard_ok("blas_set_blocked", || {
        ferrocaffe::blas::set_blocked_enabled(enabled);
    })
}

/// `"cblas:<path>"` or `"gemm"`.
#[pyfunction]
fn blas_backend() -> PyResult<String> {
    guard_ok("blas_backend", ferrocaffe::blas::backend)
}

/// Threads of the compute team, the caller included (`FERROCAFFE_NUM_THREADS` caps it).
#[pyfunction]
fn num_threads() -> PyResult<usize> {
    guard_ok("num_threads", ferrocaffe::threads::num_threads)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(blas_load, m)?)?;
    m.add_function(wrap_pyfunction!(blas_set_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(blas_backend, m)?)?;
    m.add_function(wrap_pyfunction!(blas_set_small_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(blas_set_blocked, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    Ok(())
}
