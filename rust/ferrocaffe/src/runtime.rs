//! The top of the runtime: assembles the default operator registry (every CPU kernel family,
//! the ops that run nested nets, the recurrent-network ops) and gives [`Workspace::new`], a
//! workspace that creates its ops from it.
//!
//! Nothing below this module knows which operators exist: a workspace holds the registry it
//! was given ([`Workspace::with_registry`]), and a caller with operators of its own layers a
//! registry over [`default_registry`] ([`Registry::layered`]).

use std::sync::{Arc, OnceLock};

use crate::ops::registry::Registry;
use crate::workspace::Workspace;

/// A registry holding every built-in operator: the CPU kernels ([`crate::ops::cpu`]), the
/// control ops ([`crate::net::control`]), the recurrent-network ops ([`crate::rnn`]) and the
/// collective ops ([`crate::collective`]).
pub fn builtin_registry() -> Registry {
    let mut r = Registry::new();
    crate::ops::cpu::register_all(&mut r);
    crate::net::control::register(&mut r);
    crate::rnn::register(&mut r);
    crate::collective::register(&mut r);
    crate::ops::host::register(&mut r);
    // Last: CUDA kernels, and the CPU fallback on CUDA for every type registered above.
    crate::cuda::register(&mut r);
    r
}

/// The shared registry of built-in operators (built on first use; immutable afterwards).
pub fn default_registry() -> Arc<Registry> {
    static DEFAULT: OnceLock<Arc<Registry>> = OnceLock::new();
    DEFAULT.get_or_init(|| Arc::new(builtin_registry())).clone()
}

impl Workspace {
    /// A new root workspace whose ops come from [`default_registry`].
    pub fn new() -> Arc<Workspace> {
        Workspace::with_registry(default_registry())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;

    fn fill_seven(_: &OpInit<'_>) -> Result<Box<dyn Operator>> {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            *ctx.output(0)? = Tensor::scalar(7.0f32);
            Ok(())
        })))
    }

    #[test]
    fn a_workspace_runs_ops_of_its_own_registry_over_the_builtins() {
        let mut mine = Registry::layered(default_registry());
        mine.cpu("SevenFill", fill_seven);
        let ws = Workspace::with_registry(Arc::new(mine));
        ws.run_operator_once(&OperatorDef::new("SevenFill", Vec::<&str>::new(), ["x"]))
            .unwrap();
        ws.run_operator_once(&OperatorDef::new("Relu", ["x"], ["y"]))
            .unwrap();
        assert_eq!(ws.fetch("y").unwrap().as_slice::<f32>().unwrap(), &[7.0]);
        // The default workspace does not know it; a child shares its parent's registry.
        let plain = Workspace::new();
        let e = plain
            .run_operator_once(&OperatorDef::new("SevenFill", Vec::<&str>::new(), ["x"]))
            .unwrap_err();
        assert!(e.to_string().contains("SevenFill"), "{e}");
        let child = Workspace::new_child(&ws);
        assert!(child.registry().has_type("SevenFill"));
    }

    #[test]
    fn an_empty_registry_creates_nothing() {
        let ws = Workspace::with_registry(Arc::new(Registry::new()));
        let e = ws
            .run_operator_once(&OperatorDef::new("Relu", ["x"], ["y"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Cannot create operator of type 'Relu'"), "{e}");
    }

    #[test]
    fn no_builtin_kernel_is_registered_twice() {
        // A second registration replaces the first without a word (Sign once lost its integer
        // kernel to a float-only one registered later).
        let r = builtin_registry();
        assert!(
            r.replaced().is_empty(),
            "registered twice: {:?}",
            r.replaced()
        );
    }
}
