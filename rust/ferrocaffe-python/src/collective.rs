//! Where `ferrocaffe::collective` looks for MPI, for `ferrocaffe.collective`.

use pyo3::prelude::*;

use crate::errors::guard_ok;

/// Libraries the MPI engine tries after `FERROCAFFE_MPI_LIBRARY` and an MPI already loaded in
/// the process, before the default names.
#[pyfunction]
fn mpi_set_library_candidates(paths: Vec<String>) -> PyResult<()> {
    guard_ok("mpi_set_library_candidates", || {
        ferrocaffe::collective::mpi::set_library_candidates(paths);
    })
}

/// `(path, abi, initialized_here)` of the loaded MPI library, or `None` before the first
/// collective op ran (nothing is loaded by asking).
#[pyfunction]
fn mpi_library() -> PyResult<Option<(String, String, bool)>> {
    guard_ok("mpi_library", || {
        ferrocaffe::collective::mpi::loaded().map(|m| {
            let abi = match m.abi {
                ferrocaffe::collective::mpi::Abi::Standard => "standard",
                ferrocaffe::collective::mpi::Abi::Mpich => "mpich",
            };
            (m.path.clone(), abi.to_string(), m.initialized_here)
        })
    })
}

/// Finalizes MPI if ferrocaffe initialized it and no request was abandoned (at exit).
#[pyfunction]
fn mpi_finalize() -> PyResult<bool> {
    guard_ok("mpi_finalize", ferrocaffe::collective::mpi::finalize)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(mpi_set_library_candidates, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_library, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_finalize, m)?)?;
    Ok(())
}
