//! `_native.cuda_*`: what the CUDA backend reports, its kernel sources (for the PTX check),
//! and moving a blob to a device (`FeedBlob` with a CUDA device option).

use pyo3::prelude::*;

use crate::errors::{detach_guarded, guard, guard_ok, IntoPy};

/// Whether this build carries the CUDA backend.
#[pyfunction]
fn cuda_built() -> PyResult<bool> {
    guard_ok("cuda_built", || ferrocaffe::cuda::BUILT_WITH_CUDA)
}

/// The number of CUDA devices (0 without a driver).
#[pyfunction]
fn num_cuda_devices() -> PyResult<usize> {
    guard_ok("num_cuda_devices", ferrocaffe::cuda::num_devices)
}

/// None when CUDA can be used, else the reason it cannot.
#[pyfunction]
fn cuda_unavailable_reason() -> PyResult<Option<String>> {
    guard_ok("cuda_unavailable_reason", || {
        ferrocaffe::cuda::availability()
            .err()
            .map(|e| e.to_string())
    })
}

/// The version of the cuDNN library found here (`major * 10000 + minor * 100 + patch` from
/// cuDNN 9 on), or None when there is none (or the build has no CUDA backend).
#[pyfunction]
fn cuda_cudnn_version() -> PyResult<Option<usize>> {
    guard_ok("cuda_cudnn_version", ferrocaffe::cuda::cudnn_version)
}

/// `(module name, full CUDA C source)` of every kernel module.
#[pyfunction]
fn cuda_kernel_sources() -> PyResult<Vec<(&'static str, String)>> {
    guard_ok("cuda_kernel_sources", ferrocaffe::cuda::sources::all)
}

/// The options NVRTC compiles every module with.
#[pyfunction]
fn cuda_nvrtc_options() -> PyResult<Vec<&'static str>> {
    guard_ok("cuda_nvrtc_options", || {
        ferrocaffe::cuda::sources::NVRTC_OPTIONS.to_vec()
    })
}

/// Returns the cached device memory of every opened device to the driver.
#[pyfunction]
fn cuda_empty_cache(py: Python<'_>) -> PyResult<()> {
    guard("cuda_empty_cache", || {
        detach_guarded(py, "cuda_empty_cache", || {
            ferrocaffe::cuda::empty_cache();
            Ok(())
        })
        .py()
    })
}

/// `(bytes in use, bytes cached)` of device `ordinal`'s memory pool.
#[pyfunction]
fn cuda_memory_stats(ordinal: u32) -> PyResult<(usize, usize)> {
    guard_ok("cuda_memory_stats", || {
        let s = ferrocaffe::cuda::memory_stats(ordinal);
        (s.in_use, s.cached)
    })
}

/// Waits until every opened CUDA device has finished its queued work.
#[pyfunction]
fn cuda_synchronize(py: Python<'_>) -> PyResult<()> {
    guard("cuda_synchronize", || {
        detach_guarded(py, "cuda_synchronize", ferrocaffe::cuda::synchronize_all).py()
    })
}

/// Seconds per bare cuBLAS sgemm of `[m, k] x [k, n]` (`[n, k]` transposed with `trans_b`)
/// on device `ordinal` (a reference).
#[pyfunction]
#[pyo3(signature = (m, n, k, iters=20, ordinal=0, trans_b=false))]
fn cuda_sgemm_seconds(
    py: Python<'_>,
    m: usize,
    n: usize,
    k: usize,
    iters: usize,
    ordinal: u32,
    trans_b: bool,
) -> PyResult<f64> {
    guard("cuda_sgemm_seconds", || {
        detach_guarded(py, "cuda_sgemm_seconds", || {
            ferrocaffe::cuda::bench::sgemm_seconds(ordinal, m, n, k, trans_b, iters)
        })
        .py()
    })
}

/// The op types with a CUDA kernel of their own (the rest run their CPU kernel on CUDA).
#[pyfunction]
fn cuda_native_operators() -> PyResult<Vec<String>> {
    guard_ok("cuda_native_operators", ferrocaffe::cuda::native_types)
}

/// How ops of a type run on CUDA: "kernel", "shape", "host" or "fallback".
#[pyfunction]
fn cuda_placement(op_type: &str) -> PyResult<&'static str> {
    guard_ok("cuda_placement", || ferrocaffe::cuda::placement(op_type))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cuda_built, m)?)?;
    m.add_function(wrap_pyfunction!(num_cuda_devices, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_cudnn_version, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_kernel_sources, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_nvrtc_options, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_native_operators, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_placement, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_sgemm_seconds, m)?)?;
    Ok(())
}
