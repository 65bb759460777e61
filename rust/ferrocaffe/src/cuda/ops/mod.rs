//! The operators with CUDA kernels, one file per family. Each registers its types on
//! [`DeviceType::Cuda`](crate::device::DeviceType::Cuda); types not registered here run
//! through the CPU fallback.

mod conv;
mod copy;
mod extra;
mod fc;
mod math;
mod nn;
mod reduce;
mod relu;
mod sparse;

use crate::ops::registry::Registry;

/// Registers every CUDA kernel.
pub fn register(r: &mut Registry) {
    conv::register(r);
    copy::register(r);
    extra::register(r);
    fc::register(r);
    math::register(r);
    nn::register(r);
    reduce::register(r);
    relu::register(r);
    sparse::register(r);
}
