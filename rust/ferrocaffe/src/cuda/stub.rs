//! The CUDA entry points of a build without the `cuda` feature: no device, and CUDA ops
//! refused with an error that names the build.

use crate::error::{Error, Result};
use crate::ops::registry::Registry;

/// Whether this build has the CUDA backend.
pub const BUILT_WITH_CUDA: bool = false;

/// The number of CUDA devices: none in this build.
pub fn num_devices() -> usize {
    0
}

/// Why CUDA cannot be used here.
pub fn availability() -> Result<()> {
    Err(Error::Device(
        "this build of ferrocaffe has no CUDA support (built without the `cuda` feature)".into(),
    ))
}

/// The cuDNN version: none without the backend.
pub fn cudnn_version() -> Option<usize> {
    None
}

/// Registers nothing: without the backend, CUDA ops fail at creation.
pub fn register(_r: &mut Registry) {}

/// Nothing is cached without the backend.
pub fn empty_cache() {}

/// Bytes in use and cached on a device's pool: always none here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes in blocks tensors hold.
    pub in_use: usize,
    /// Bytes in blocks kept for reuse.
    pub cached: usize,
}

/// Always zeros without the backend.
pub fn memory_stats(_ordinal: u32) -> PoolStats {
    PoolStats {
        in_use: 0,
        cached: 0,
    }
}

/// Without the backend a tensor can only be on the host.
pub fn to_device(
    t: &crate::tensor::Tensor,
    device: crate::device::Device,
) -> Result<crate::tensor::Tensor> {
    match device {
        crate::device::Device::Cpu => t.to_host(),
        _ => availability().map(|_| t.clone()),
    }
}

/// Nothing to wait for without the backend.
pub fn synchronize_all() -> Result<()> {
    Ok(())
}

/// Reference timings: none without the backend.
pub mod bench {
    use crate::error::Result;

    /// Refused: no CUDA in this build.
    pub fn sgemm_seconds(
        _o: u32,
        _m: usize,
        _n: usize,
        _k: usize,
        _t: bool,
        _i: usize,
    ) -> Result<f64> {
        super::availability().map(|_| 0.0)
    }
}

/// No op type has a CUDA kernel in this build.
pub fn native_types() -> Vec<String> {
    Vec::new()
}

/// Nothing runs on CUDA in this build.
pub fn placement(_op_type: &str) -> &'static str {
    "unavailable"
}
