//! Gradient makers of the built-in operators, one file per family. Each reproduces what
//! Caffe2's C++ gradient maker of the same op type emits: op types, inputs, outputs,
//! arguments and gradient names (`<blob>_grad`, `<blob>_grad_values` for slices).

mod conv_pool;
mod elementwise;
mod loss;
mod misc;
mod nn;
mod reduce;
mod rnn;
mod segment;
mod shape;
mod sparse;
mod util;

pub use misc::{NO_GRADIENT, SHOULD_NOT_DO_GRADIENT};

use super::registry::Registry;

/// Registers every built-in gradient maker (and the op types that have none).
pub fn register_all(registry: &mut Registry) {
    elementwise::register(registry);
    nn::register(registry);
    conv_pool::register(registry);
    shape::register(registry);
    reduce::register(registry);
    sparse::register(registry);
    loss::register(registry);
    rnn::register(registry);
    misc::register(registry);
    segment::register(registry);
}
