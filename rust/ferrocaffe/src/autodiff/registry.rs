//! The gradient-maker registry, keyed by forward op type.

use std::collections::HashMap;
use std::sync::Arc;

use super::maker::GradientMaker;

/// How an op type behaves under differentiation.
#[derive(Clone)]
pub enum GradientKind {
    /// A maker produces its gradient ops.
    Maker(Arc<dyn GradientMaker>),
    /// Caffe2's `NO_GRADIENT`: the op has no gradient; its inputs get none.
    NoGradient,
    /// Caffe2's `SHOULD_NOT_DO_GRADIENT`: asking for a gradient through it is an error.
    ShouldNotDo,
    /// Caffe2's `GRADIENT_NOT_IMPLEMENTED_YET`.
    NotImplemented,
}

/// Gradient makers by forward op type.
#[derive(Clone, Default)]
pub struct Registry {
    entries: HashMap<String, GradientKind>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) how `op_type` is differentiated.
    pub fn register(&mut self, op_type: &str, kind: GradientKind) {
        self.entries.insert(op_type.to_string(), kind);
    }

    /// Registers a maker for `op_type`.
    pub fn register_maker<M: GradientMaker + 'static>(&mut self, op_type: &str, maker: M) {
        self.register(op_type, GradientKind::Maker(Arc::new(maker)));
    }

    /// How `op_type` is differentiated, if registered.
    pub fn get(&self, op_type: &str) -> Option<&GradientKind> {
        self.entries.get(op_type)
    }
}
