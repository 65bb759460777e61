//! CUDA: device memory, kernels compiled by NVRTC on first use, cuBLAS, and the operators
//! that run on `DeviceOption(CUDA)`.
//!
//! The backend lives behind the `cuda` cargo feature (on in the Python wheel). It loads the
//! driver, NVRTC and cuBLAS at run time (cudarc's dynamic loading), so one build serves
//! machines with and without a GPU: with no driver, [`num_devices`] is 0, CPU work is
//! unchanged, and a CUDA op fails at creation with an error naming what is missing. Without
//! the feature the same calls answer as on a machine without a driver, naming the build.
//!
//! The kernel sources ([`sources`]) are part of every build, so the PTX check
//! (`python -m ferrocaffe.cuda_check --ptx`, and a test) compiles them on machines without a
//! GPU.
//!
//! Layer: above the executors (the fallback runs a CPU kernel as an op instance), below the
//! runtime, which registers the CUDA operators.

pub mod sources;

#[cfg(feature = "cuda")]
mod backend;

#[cfg(feature = "cuda")]
pub use backend::*;

#[cfg(feature = "cuda")]
mod ops;

#[cfg(not(feature = "cuda"))]
mod stub;

#[cfg(not(feature = "cuda"))]
pub use stub::*;
