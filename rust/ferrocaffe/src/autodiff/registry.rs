//! The gradient-maker registry, keyed by forward op type.
//!
//! Two layers, as in Caffe2:
//! * native makers ([`GradientKind`]), Caffe2's C++ registry: their result is post-processed
//!   (gradient ops marked `is_gradient_op`, input gradients checked) and their errors are
//!   reported as `Exception when creating gradient for [<type>]`;
//! * gradient functions, Caffe2's `GradientRegistry.RegisterGradient` (Python): used when the
//!   op type has no native maker or the native maker fails, and taken as they are. The `Do`,
//!   `If` and `While` gradients live here, as they did in Caffe2, so a user registration
//!   for those types replaces them.
//!
//! A registry may be layered over a shared parent (lookups fall through to it): the Python
//! binding layers the functions registered from Python over [`Registry::builtin`].

use std::sync::{Arc, OnceLock};

use super::maker::GradientMaker;
use crate::graph::intern::FxHashMap;

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
    entries: FxHashMap<String, GradientKind>,
    functions: FxHashMap<String, Arc<dyn GradientMaker>>,
    parent: Option<Arc<Registry>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry whose lookups fall through to `parent`.
    pub fn layered(parent: Arc<Registry>) -> Self {
        Registry {
            parent: Some(parent),
            ..Self::default()
        }
    }

    /// A registry with every built-in maker: the per-op makers and the `Do`/`If`/`While`
    /// gradient functions.
    pub fn with_builtins() -> Self {
        let mut r = Registry::new();
        super::makers::register_all(&mut r);
        super::control::register(&mut r);
        r
    }

    /// The shared registry of built-in makers (built on first use).
    pub fn builtin() -> Arc<Registry> {
        static BUILTIN: OnceLock<Arc<Registry>> = OnceLock::new();
        BUILTIN
            .get_or_init(|| Arc::new(Registry::with_builtins()))
            .clone()
    }

    /// Registers (or replaces) how `op_type` is differentiated natively.
    pub fn register(&mut self, op_type: &str, kind: GradientKind) {
        self.entries.insert(op_type.to_string(), kind);
    }

    /// Registers a native maker for `op_type`.
    pub fn register_maker<M: GradientMaker + 'static>(&mut self, op_type: &str, maker: M) {
        self.register(op_type, GradientKind::Maker(Arc::new(maker)));
    }

    /// Registers (or replaces) the gradient function of `op_type` (Caffe2's
    /// `GradientRegistry.RegisterGradient`).
    pub fn register_function(&mut self, op_type: &str, maker: Arc<dyn GradientMaker>) {
        self.functions.insert(op_type.to_string(), maker);
    }

    /// How `op_type` is differentiated natively, if registered (here or in a parent).
    pub fn get(&self, op_type: &str) -> Option<&GradientKind> {
        match self.entries.get(op_type) {
            Some(k) => Some(k),
            None => self.parent.as_deref().and_then(|p| p.get(op_type)),
        }
    }

    /// The gradient function of `op_type`, if registered (here or in a parent).
    pub fn function(&self, op_type: &str) -> Option<&Arc<dyn GradientMaker>> {
        match self.functions.get(op_type) {
            Some(f) => Some(f),
            None => self.parent.as_deref().and_then(|p| p.function(op_type)),
        }
    }

    /// Whether `op_type` has a native maker or a gradient function.
    pub fn has(&self, op_type: &str) -> bool {
        self.get(op_type).is_some() || self.function(op_type).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::maker::{GradRef, GradientOutput};
    use crate::error::Result;
    use crate::proto::OperatorDef;

    struct Nothing;
    impl GradientMaker for Nothing {
        fn make(&self, _op: &OperatorDef, _g: &[GradRef]) -> Result<GradientOutput> {
            Ok(GradientOutput::default())
        }
    }

    #[test]
    fn layered_lookups_fall_through() {
        let mut base = Registry::new();
        base.register("StopGradient", GradientKind::NoGradient);
        base.register_function("If", Arc::new(Nothing));
        let mut top = Registry::layered(Arc::new(base));
        assert!(matches!(
            top.get("StopGradient"),
            Some(GradientKind::NoGradient)
        ));
        assert!(top.function("If").is_some());
        assert!(top.function("While").is_none());
        top.register_function("While", Arc::new(Nothing));
        assert!(top.has("While"));
        assert!(!top.has("Relu"));
    }

    #[test]
    fn builtins_include_control_ops() {
        let r = Registry::builtin();
        for t in ["Do", "If", "While"] {
            assert!(r.function(t).is_some(), "{t}");
        }
    }
}
