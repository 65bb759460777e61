//! Operators whose kernel the embedding program supplies at run time: Caffe2's `Python` and
//! `PythonGradient`. The core knows nothing of the language behind them; a host (the Python
//! binding) installs a [`HostOpProvider`] per op type, and each op instance asks it for a
//! [`HostKernel`] when the op is created (Caffe2 built the Python function of an op instance
//! in its constructor: builders run once per instance).
//!
//! A host kernel reaches its blobs by name through the workspace it runs in (its own code may
//! read and write any blob, as Caffe2's ops with `pass_workspace` did), so the op does not hold
//! the net's blob locks while it runs ([`Operator::locks_blobs`] is false).

use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::Result;
use crate::ops::operator::{op_failed, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::proto::OperatorDef;
use crate::workspace::Workspace;

/// The op types whose kernels come from a host.
pub const HOST_OP_TYPES: [&str; 2] = ["Python", "PythonGradient"];

/// One run of a host kernel: the workspace the op runs in and its definition (blob names,
/// arguments).
pub struct HostCall<'a> {
    /// The workspace the op runs in (a step workspace for ops of a recurrent step net).
    pub ws: &'a Arc<Workspace>,
    /// The op's definition.
    pub def: &'a OperatorDef,
}

/// The kernel of one host op instance.
pub trait HostKernel: Send + Sync {
    /// Runs the op once.
    fn run(&self, call: &HostCall<'_>) -> Result<()>;
}

/// Makes the kernels of one op type.
pub trait HostOpProvider: Send + Sync {
    /// The kernel of a new instance of `def`, created in `ws`.
    fn instantiate(&self, def: &OperatorDef, ws: &Arc<Workspace>) -> Result<Arc<dyn HostKernel>>;
}

type Providers = Vec<(String, Arc<dyn HostOpProvider>)>;

/// Process-wide, as Caffe2's table of Python functions was: ops are created from serialized
/// definitions, in any workspace, long after the host registered its functions.
static PROVIDERS: RwLock<Providers> = RwLock::new(Vec::new());

/// Installs (or replaces) the provider of kernels for `op_type`.
pub fn install_provider(op_type: &str, provider: Arc<dyn HostOpProvider>) {
    let mut all = PROVIDERS.write();
    all.retain(|(t, _)| t != op_type);
    all.push((op_type.to_string(), provider));
}

/// The provider installed for `op_type`, if any.
pub fn provider(op_type: &str) -> Option<Arc<dyn HostOpProvider>> {
    PROVIDERS
        .read()
        .iter()
        .find(|(t, _)| t == op_type)
        .map(|(_, p)| p.clone())
}

struct HostOp {
    kernel: Arc<dyn HostKernel>,
}

impl Operator for HostOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        self.kernel.run(&HostCall {
            ws: ctx.ws,
            def: ctx.def,
        })
    }

    fn locks_blobs(&self) -> bool {
        false
    }
}

fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let op_type = init.def.r#type();
    let Some(p) = provider(op_type) else {
        return Err(init.err(format!(
            "no host provides {op_type} operators in this process (they run functions \
             registered through the Python binding)"
        )));
    };
    let kernel = p
        .instantiate(init.def, init.ws)
        .map_err(|e| op_failed(init.def, e))?;
    Ok(Box::new(HostOp { kernel }))
}

/// Registers the host op types (their kernels come from the installed providers).
pub fn register(r: &mut Registry) {
    r.cpu_many(&HOST_OP_TYPES, create);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, ErrorKind};
    use crate::tensor::Tensor;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Doubles input 0 into output 0 and counts instances and runs.
    struct Doubler {
        instances: AtomicUsize,
        runs: Arc<AtomicUsize>,
    }

    struct DoublerKernel(Arc<AtomicUsize>);

    impl HostKernel for DoublerKernel {
        fn run(&self, call: &HostCall<'_>) -> Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            let x = call.ws.fetch(&call.def.input[0])?;
            let v: Vec<f32> = x.as_slice::<f32>()?.iter().map(|v| v * 2.0).collect();
            call.ws
                .feed(&call.def.output[0], Tensor::from_vec(x.dims(), v)?);
            Ok(())
        }
    }

    impl HostOpProvider for Doubler {
        fn instantiate(
            &self,
            def: &OperatorDef,
            _: &Arc<Workspace>,
        ) -> Result<Arc<dyn HostKernel>> {
            if def.input.is_empty() {
                return Err(Error::External {
                    context: "building the kernel".into(),
                    source: "no input".into(),
                });
            }
            self.instances.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(DoublerKernel(self.runs.clone())))
        }
    }

    #[test]
    fn host_ops_run_the_installed_kernels_and_keep_callback_errors() {
        let runs = Arc::new(AtomicUsize::new(0));
        let doubler = Arc::new(Doubler {
            instances: AtomicUsize::new(0),
            runs: runs.clone(),
        });
        // Only PythonGradient: the binding's tests install Python.
        install_provider("PythonGradient", doubler.clone());
        let ws = Workspace::new();
        ws.feed("x", Tensor::from_vec(&[2], vec![1.0f32, 2.5]).unwrap());
        let op = OperatorDef::new("PythonGradient", ["x"], ["y"]);
        ws.run_operator_once(&op).unwrap();
        assert_eq!(
            ws.fetch("y").unwrap().as_slice::<f32>().unwrap(),
            &[2.0, 5.0]
        );
        assert_eq!(doubler.instances.load(Ordering::SeqCst), 1);
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let bad = OperatorDef::new("PythonGradient", Vec::<&str>::new(), ["y"]);
        let e = ws.run_operator_once(&bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::External, "{e}");
        assert!(e.to_string().contains("PythonGradient"), "{e}");
        assert!(e.to_string().contains("no input"), "{e}");
    }

    #[test]
    fn an_op_type_without_a_provider_is_refused_at_creation() {
        // "Python" may have a provider installed by another test; a fresh name cannot.
        let def = OperatorDef::new("PythonWithoutHost", Vec::<&str>::new(), ["y"]);
        let ws = Workspace::new();
        let e = create(&OpInit::new(&def, &ws)).err().unwrap();
        assert!(
            e.to_string().contains("no host provides PythonWithoutHost"),
            "{e}"
        );
    }
}
