//! The CUDA backend (the `cuda` feature): devices, memory, kernels, cuBLAS, the op helpers
//! kernels use, the CPU fallback, and registration.

pub mod bench;
mod blas;
mod blaslt;
pub mod cudnn;
mod device;
mod fallback;
mod host;
mod memory;
mod module;
pub mod op;

pub use bench::synchronize_all;
pub use blas::Gemm;
pub use blaslt::BiasPlan;
pub use cudnn::{cudnn_version, Cudnn};
pub use device::{
    availability, device, device_of, empty_cache, num_devices, DeviceCtx, BUILT_WITH_CUDA,
};
pub use fallback::{create as fallback, create_locked as fallback_locked};
pub use memory::{raw, to_device, CudaMemory, PoolStats};
pub use module::{grid, grid_rows_cols, rows, BLOCK};

use crate::device::DeviceType;
use crate::ops::registry::Registry;

/// Types whose CPU kernel runs unchanged on CUDA: they run nested nets (whose ops carry their
/// own device options), manage workspaces, or only change a tensor's shape (sharing its
/// memory, wherever it lives) or read it (`Shape`, `Size`: their outputs stay on the host, as
/// Caffe2's did); they touch no tensor data on the device.
const DEVICE_AGNOSTIC: &[&str] = &[
    "Do",
    "CreateScope",
    "HasScope",
    "Reshape",
    "Flatten",
    "FlattenToVec",
    "ResizeLike",
    "ExpandDims",
    "Squeeze",
    "Alias",
    "Shape",
    "Size",
];

/// The op types with a CUDA kernel of their own, sorted (the others run through the CPU
/// fallback or, for recurrent networks, on the host).
pub fn native_types() -> Vec<String> {
    let mut own = Registry::new();
    super::ops::register(&mut own);
    own.types().iter().map(|s| s.to_string()).collect()
}

/// How ops of `op_type` run on CUDA: `"kernel"` (a CUDA kernel of their own), `"shape"` (a
/// CPU kernel that only reshapes or reads dims, sharing device memory), `"host"` (nets run
/// on the host: recurrent networks), `"fallback"` (the CPU kernel, inputs and outputs copied).
pub fn placement(op_type: &str) -> &'static str {
    if native_types().iter().any(|t| t == op_type) {
        "kernel"
    } else if DEVICE_AGNOSTIC.contains(&op_type) {
        "shape"
    } else if host::TYPES.contains(&op_type) {
        "host"
    } else {
        "fallback"
    }
}

/// Registers the CUDA kernels, then the CPU fallback for every other type of `r`.
pub fn register(r: &mut Registry) {
    super::ops::register(r);
    for t in DEVICE_AGNOSTIC {
        if let Some(f) = r.lookup(t, DeviceType::Cpu, "") {
            r.register(t, DeviceType::Cuda, "", f);
        }
    }
    for t in host::TYPES {
        r.register(t, DeviceType::Cuda, "", host::create);
    }
    let types: Vec<String> = r.types().iter().map(|s| s.to_string()).collect();
    for t in types {
        if r.lookup(&t, DeviceType::Cuda, "").is_none() {
            r.register(&t, DeviceType::Cuda, "", fallback::create);
        }
    }
}

/// Bytes in use and cached on device `ordinal` (zeros before it is first used).
pub fn memory_stats(ordinal: u32) -> PoolStats {
    match device::opened(ordinal) {
        Some(d) => d.pool.stats(),
        None => PoolStats {
            in_use: 0,
            cached: 0,
        },
    }
}
