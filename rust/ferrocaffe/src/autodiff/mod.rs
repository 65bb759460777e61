//! Autodiff: the backward-pass IR, the gradient-maker registry and gradient accumulation.
//!
//! A [`GradientMaker`] turns one forward operator plus the gradients of its outputs into
//! gradient operators plus the gradients of its inputs, exactly as Caffe2's C++ gradient makers
//! did. Makers are registered per op type in a [`registry::Registry`].

pub mod maker;
pub mod makers;
pub mod registry;

pub use maker::{GradRef, GradientMaker, GradientOutput, MakerCtx};
pub use registry::Registry;
