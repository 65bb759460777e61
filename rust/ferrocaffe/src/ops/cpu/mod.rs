//! CPU kernels, one file per family. Each family has `pub fn register(r: &mut Registry)`;
//! [`register_all`] lists them (add one line per new family).

pub mod broadcast;
pub mod compare;
pub mod copy;
pub mod counters;
pub mod elementwise;
pub mod fc;
pub mod fill;
pub mod math;
pub mod math_grad;
pub mod rng;

use super::registry::Registry;

/// Registers every CPU kernel family.
pub fn register_all(r: &mut Registry) {
    fill::register(r);
    copy::register(r);
    math::register(r);
    math_grad::register(r);
    counters::register(r);
    compare::register(r);
    fc::register(r);
}
