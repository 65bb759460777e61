//! Nets: operator instances with their blob handles resolved, run by an executor.
//!
//! * `simple` (and an empty type): ops in order on the calling thread ([`simple`]).
//! * `dag`, `async_dag`, `async_scheduling`, `prof_dag`, `async_simple`: ops whose dependencies
//!   are done run on a worker pool of `num_workers` threads ([`dag`]); results equal `simple`.
//!
//! Ops are created from the registry their workspace holds ([`Workspace::registry`]). Ops that
//! run nested nets (`Do`, `If`, `While`) live in [`control`], above the executors; the default
//! registry ([`crate::runtime`]) registers them beside the kernels.
//!
//! This module also gives [`Workspace`] the methods that instantiate nets and ops
//! (`create_net`, `run_net_once`, `run_operator_once`): the workspace keeps created nets but
//! does not depend on the executors.

pub mod control;
pub mod dag;
pub mod simple;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::blas::GemmContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::operator::{op_error, op_failed, InSlot, OpContext, OpInit, Operator};
use crate::proto::{NetDef, OperatorDef};
use crate::workspace::{BlobHandle, CreatedNet, SharedNet, Workspace};

/// The most threads one dag net, or one step's concurrent substeps, run on: four per core the
/// machine has (at least 8). A `num_workers` or `num_concurrent_instances` above it is queued
/// on that many threads (results are the same, see [`dag`] and [`crate::plan`]), so that no
/// net or plan a user sends can start an unbounded number of threads.
pub fn max_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_mul(4)
            .max(8)
    })
}

#[derive(Clone, Copy)]
enum InKind {
    Lock,
    Output(usize),
    Input(usize),
}

/// One instantiated operator with its blobs.
pub struct OpInstance {
    def: OperatorDef,
    device: Device,
    op: Box<dyn Operator>,
    inputs: Vec<BlobHandle>,
    outputs: Vec<BlobHandle>,
    /// Blobs named in `control_input` that existed at instantiation (ordering only).
    control: Vec<BlobHandle>,
    in_kinds: Vec<InKind>,
    out_first: Vec<bool>,
    /// (is_output, index) of each distinct blob, in address order.
    lock_order: Vec<(bool, usize)>,
    locks: bool,
}

impl OpInstance {
    /// Instantiates `def` in `ws`: checks its schema, resolves its inputs (which must exist),
    /// creates its outputs and calls its factory.
    pub fn new(def: &OperatorDef, ws: &Arc<Workspace>) -> Result<OpInstance> {
        let op_type = def.r#type();
        let factory = ws.registry().resolve(def)?;
        let init = OpInit::on(def, ws, Device::of_option(def.device_option.as_ref())?);
        let mut inputs = Vec::with_capacity(def.input.len());
        for name in &def.input {
            match ws.get_blob(name) {
                Some(h) => inputs.push(h),
                None => {
                    return Err(Error::MissingBlob(format!(
                        "op {op_type}: Encountered a non-existing input blob: {name}"
                    )))
                }
            }
        }
        // As in Caffe2: schema check, inputs must exist, outputs are created, then the factory.
        let outputs: Vec<BlobHandle> = def.output.iter().map(|n| ws.create_blob(n)).collect();
        let op = factory(&init)?;
        let mut inst = Self::assemble(def.clone(), op, inputs, outputs);
        inst.device = init.device;
        inst.control = def
            .control_input
            .iter()
            .filter_map(|n| ws.get_blob(n))
            .collect();
        Ok(inst)
    }

    fn assemble(
        def: OperatorDef,
        op: Box<dyn Operator>,
        inputs: Vec<BlobHandle>,
        outputs: Vec<BlobHandle>,
    ) -> OpInstance {
        let locks = op.locks_blobs();
        let out_first: Vec<bool> = (0..outputs.len())
            .map(|j| !outputs[..j].iter().any(|o| Arc::ptr_eq(o, &outputs[j])))
            .collect();
        let in_kinds: Vec<InKind> = (0..inputs.len())
            .map(|i| {
                if let Some(j) = outputs.iter().position(|o| Arc::ptr_eq(o, &inputs[i])) {
                    InKind::Output(j)
                } else if let Some(e) = inputs[..i].iter().position(|x| Arc::ptr_eq(x, &inputs[i]))
                {
                    InKind::Input(e)
                } else {
                    InKind::Lock
                }
            })
            .collect();
        let mut lock_order: Vec<(bool, usize)> = Vec::new();
        for (j, first) in out_first.iter().enumerate() {
            if *first {
                lock_order.push((true, j));
            }
        }
        for (i, k) in in_kinds.iter().enumerate() {
            if matches!(k, InKind::Lock) {
                lock_order.push((false, i));
            }
        }
        let addr = |&(is_out, i): &(bool, usize)| {
            let h = if is_out { &outputs[i] } else { &inputs[i] };
            Arc::as_ptr(h) as usize
        };
        lock_order.sort_by_key(addr);
        OpInstance {
            def,
            device: Device::Cpu,
            op,
            inputs,
            outputs,
            control: Vec::new(),
            in_kinds,
            out_first,
            lock_order,
            locks,
        }
    }

    /// The definition.
    pub fn def(&self) -> &OperatorDef {
        &self.def
    }

    /// Input handles.
    pub fn inputs(&self) -> &[BlobHandle] {
        &self.inputs
    }

    /// Output handles.
    pub fn outputs(&self) -> &[BlobHandle] {
        &self.outputs
    }

    /// Whether this op is a `Relu` on the CPU that writes the first output of `prev` in place
    /// (and does nothing else), so that `prev` may apply it instead.
    fn is_inplace_relu_after(&self, prev: &OpInstance) -> bool {
        self.def.r#type() == "Relu"
            && self.device == Device::Cpu
            && prev.device == Device::Cpu
            && self.inputs.len() == 1
            && self.outputs.len() == 1
            && self.def.control_input.is_empty()
            && Arc::ptr_eq(&self.inputs[0], &self.outputs[0])
            && prev
                .outputs
                .first()
                .is_some_and(|y| Arc::ptr_eq(y, &self.inputs[0]))
    }

    /// Handles of the `control_input` blobs (read for ordering, never locked).
    pub fn control_inputs(&self) -> &[BlobHandle] {
        &self.control
    }

    /// Runs the op once with its blobs locked; errors (and panics) come back naming the op.
    pub fn run(&mut self, ws: &Arc<Workspace>) -> Result<()> {
        let mut ins: SmallVec<[InSlot<'_>; 4]> = SmallVec::with_capacity(self.inputs.len());
        let mut outs = SmallVec::with_capacity(self.outputs.len());
        if self.locks {
            for k in &self.in_kinds {
                ins.push(match *k {
                    InKind::Lock => InSlot::Unlocked,
                    InKind::Output(j) => InSlot::Output(j),
                    InKind::Input(e) => InSlot::Input(e),
                });
            }
            outs.resize_with(self.outputs.len(), || None);
            for &(is_out, i) in &self.lock_order {
                if is_out {
                    outs[i] = Some(self.outputs[i].write());
                } else {
                    ins[i] = InSlot::Read(self.inputs[i].read());
                }
            }
        } else {
            ins.resize_with(self.inputs.len(), || InSlot::Unlocked);
            outs.resize_with(self.outputs.len(), || None);
        }
        debug_assert_eq!(self.out_first.len(), self.outputs.len());
        let mut ctx = OpContext {
            ws,
            def: &self.def,
            device: self.device,
            gemm: GemmContext::current(),
            handles: None,
            in_handles: &self.inputs,
            out_handles: &self.outputs,
            ins,
            outs,
        };
        let op = &mut self.op;
        let result = catch_unwind(AssertUnwindSafe(|| op.run(&mut ctx)));
        drop(ctx);
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(op_failed(&self.def, e)),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(op_error(&self.def, format!("kernel panicked: {what}")))
            }
        }
    }
}

/// Which executor a net type uses.
fn is_dag(net_type: &str) -> Result<bool> {
    match net_type {
        "" | "simple" => Ok(false),
        "dag" | "async_dag" | "async_scheduling" | "prof_dag" | "async_simple" | "parallel" => {
            Ok(true)
        }
        other => Err(Error::BadArgument(format!(
            "Cannot find net type '{other}' (known: simple, dag, async_dag, async_scheduling, prof_dag, async_simple)"
        ))),
    }
}

enum Executor {
    Simple(simple::SimpleNet),
    Dag(dag::DagNet),
}

/// An instantiated net.
pub struct Net {
    name: String,
    ws: Weak<Workspace>,
    exec: Executor,
}

/// Folds each in-place `Relu` into the op before it where that op applies it itself
/// ([`Operator::fuse_relu`]: a convolution does it on each image while it is in cache): the
/// net computes the same blobs with one pass over the output and one dispatch fewer.
fn fuse_relus(ops: Vec<OpInstance>) -> Vec<OpInstance> {
    let mut out: Vec<OpInstance> = Vec::with_capacity(ops.len());
    for op in ops {
        if let Some(prev) = out.last_mut() {
            if op.is_inplace_relu_after(prev) && prev.op.fuse_relu() {
                continue;
            }
        }
        out.push(op);
    }
    out
}

/// Instantiates the ops of `def` in order (the net's device option applies to ops without one).
pub fn instantiate_ops(def: &NetDef, ws: &Arc<Workspace>) -> Result<Vec<OpInstance>> {
    let mut ops = Vec::with_capacity(def.op.len());
    for op in &def.op {
        let inst = match (&def.device_option, &op.device_option) {
            (Some(d), None) => {
                let mut o = op.clone();
                o.device_option = Some(d.clone());
                OpInstance::new(&o, ws)?
            }
            _ => OpInstance::new(op, ws)?,
        };
        ops.push(inst);
    }
    Ok(ops)
}

impl Net {
    /// Instantiates `def` in `ws`.
    pub fn new(def: &NetDef, ws: &Arc<Workspace>) -> Result<Net> {
        let dag = is_dag(def.r#type())?;
        let ops = fuse_relus(instantiate_ops(def, ws)?);
        let exec = if dag {
            Executor::Dag(dag::DagNet::new(ops, def.num_workers()))
        } else {
            Executor::Simple(simple::SimpleNet::new(ops))
        };
        Ok(Net {
            name: def.name().to_string(),
            ws: Arc::downgrade(ws),
            exec,
        })
    }

    /// The net's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The workspace the net runs in, if it still exists.
    pub fn workspace(&self) -> Option<Arc<Workspace>> {
        self.ws.upgrade()
    }

    /// Number of ops it runs (an in-place `Relu` fused into the op before it is not one).
    pub fn num_ops(&self) -> usize {
        match &self.exec {
            Executor::Simple(s) => s.ops.len(),
            Executor::Dag(d) => d.num_ops(),
        }
    }

    /// Runs every op once.
    pub fn run(&mut self) -> Result<()> {
        let ws = self.ws.upgrade().ok_or_else(|| {
            Error::Runtime(format!(
                "the workspace of net {} no longer exists",
                self.name
            ))
        })?;
        match &mut self.exec {
            Executor::Simple(s) => s.run(&ws),
            Executor::Dag(d) => d.run(&ws),
        }
    }
}

impl CreatedNet for Net {
    fn name(&self) -> &str {
        Net::name(self)
    }

    fn run(&mut self) -> Result<()> {
        Net::run(self)
    }
}

impl Workspace {
    /// Instantiates `def` and keeps it under its name. Without `overwrite`, an existing net of
    /// that name is an error (raised before anything is instantiated, as in Caffe2).
    pub fn create_net(self: &Arc<Self>, def: &NetDef, overwrite: bool) -> Result<SharedNet> {
        let name = def.name();
        self.check_net_name_free(name, overwrite)?;
        let net: SharedNet = Arc::new(Mutex::new(Net::new(def, self)?));
        self.insert_net(name, net.clone());
        Ok(net)
    }

    /// Instantiates and runs a net once without keeping it.
    pub fn run_net_once(self: &Arc<Self>, def: &NetDef) -> Result<()> {
        Net::new(def, self)?.run()
    }

    /// Instantiates and runs one operator.
    pub fn run_operator_once(self: &Arc<Self>, def: &OperatorDef) -> Result<()> {
        OpInstance::new(def, self)?.run(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Argument;
    use crate::tensor::Tensor;

    fn feed(ws: &Workspace, name: &str, dims: &[usize]) {
        let n: usize = dims.iter().product();
        let v = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        ws.feed(name, Tensor::from_vec(dims, v).expect("a float tensor"));
    }

    #[test]
    fn in_place_relus_fold_into_the_ops_that_apply_them() {
        let ws = Workspace::new();
        feed(&ws, "x", &[2, 4]);
        feed(&ws, "w", &[3, 4]);
        feed(&ws, "b", &[3]);
        feed(&ws, "img", &[2, 3, 2, 2]);
        for p in ["scale", "bias", "mean", "var"] {
            feed(&ws, p, &[3]);
        }
        let mut bn = OperatorDef::new("SpatialBN", ["img", "scale", "bias", "mean", "var"], ["n"]);
        bn.arg.push(Argument::int("is_test", 1));
        let ops = vec![
            // Folded: FC, SpatialBN and InstanceNorm each followed by a Relu on its Y.
            OperatorDef::new("FC", ["x", "w", "b"], ["y"]),
            OperatorDef::new("Relu", ["y"], ["y"]),
            bn,
            OperatorDef::new("Relu", ["n"], ["n"]),
            OperatorDef::new("InstanceNorm", ["img", "scale", "bias"], ["i"]),
            OperatorDef::new("Relu", ["i"], ["i"]),
            // Kept: a Relu into another blob, and one after an op that does not apply it.
            OperatorDef::new("FC", ["x", "w", "b"], ["z"]),
            OperatorDef::new("Relu", ["z"], ["r"]),
            OperatorDef::new("Sigmoid", ["r"], ["s"]),
            OperatorDef::new("Relu", ["s"], ["s"]),
        ];
        let def = NetDef {
            op: ops,
            ..Default::default()
        };
        let mut net = Net::new(&def, &ws).expect("the net");
        assert_eq!(net.num_ops(), 7);
        net.run().expect("a run");
        let y = ws.fetch("y").expect("y");
        assert!(y
            .as_slice::<f32>()
            .expect("floats")
            .iter()
            .all(|&v| v >= 0.0));
        let z = ws.fetch("z").expect("z");
        assert!(z
            .as_slice::<f32>()
            .expect("floats")
            .iter()
            .any(|&v| v < 0.0));
    }
}
