//! Ops without a CUDA kernel of their own run their CPU kernel (as Caffe2's `GPUFallbackOp`
//! did): the inputs that live on the device are copied to the host, the CPU kernel runs in a
//! private child workspace, and its tensor outputs are copied to the op's device, so a CUDA
//! net keeps its outputs on the GPU whatever ops it holds.

use std::sync::Arc;

use super::device::DeviceCtx;
use super::op::init_device;
use crate::error::Result;
use crate::net::OpInstance;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::proto::{DeviceOption, NetDef, OperatorDef};
use crate::tensor::DataType;
use crate::workspace::{Blob, Workspace};

/// The factory registered on CUDA for every type that has no CUDA kernel.
pub fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(Fallback::new(init, false)?))
}

/// The CPU kernel of `init`'s op as an operator that runs with its blobs locked by the net,
/// for a CUDA kernel to hand a case it does not handle (a dtype it has no kernel for) over to
/// at run time: every input is copied to the host, every output copied back to the device.
/// Inputs must be tensors.
pub fn create_locked(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(Fallback::new(init, true)?))
}

struct Fallback {
    dev: Arc<DeviceCtx>,
    def: OperatorDef,
    parent: Arc<Workspace>,
    /// Whether the net locks the op's blobs (every input and output is then shadowed).
    locked: bool,
    /// The CPU op for the current set of copied inputs (true: input `i` lives on a device and
    /// is shadowed, under its own name, by a host copy in the private child workspace).
    current: Option<(Vec<bool>, Arc<Workspace>, OpInstance)>,
}

impl Fallback {
    fn new(init: &OpInit<'_>, locked: bool) -> Result<Fallback> {
        let mut op = Fallback {
            dev: init_device(init)?,
            def: init.def.clone(),
            parent: init.ws.clone(),
            locked,
            current: None,
        };
        // The CPU kernel must exist (and accept the arguments): create it once now.
        op.instance(&vec![locked; init.def.input.len()])?;
        Ok(op)
    }

    /// Whether output `j` is written to a shadowed input (the op runs in place on it).
    fn shadowed_output(&self, copied: &[bool], j: usize) -> bool {
        let name = &self.def.output[j];
        self.def
            .input
            .iter()
            .enumerate()
            .any(|(i, n)| n == name && copied[i])
    }

    fn instance(&mut self, copied: &[bool]) -> Result<(Arc<Workspace>, &mut OpInstance)> {
        let stale = self.current.as_ref().is_none_or(|(c, _, _)| c != copied);
        if stale {
            // Shadows are made before the op (and any net it runs) resolves its names, so
            // every reference to a copied input finds the host copy.
            let local = Workspace::new_child(&self.parent);
            for (i, name) in self.def.input.iter().enumerate() {
                if copied[i] {
                    local.create_local_blob(name);
                }
            }
            if self.locked {
                // The net holds the real outputs' locks: the CPU op writes local ones.
                for name in &self.def.output {
                    local.create_local_blob(name);
                }
            }
            let mut def = self.def.clone();
            on_host(&mut def.device_option);
            // Nets the op runs (a recurrent network's step nets) run on the host with it.
            for a in &mut def.arg {
                if let Some(n) = a.n.as_mut() {
                    net_on_host(n);
                }
                a.nets.iter_mut().for_each(net_on_host);
            }
            let inst = OpInstance::new(&def, &local)?;
            self.current = Some((copied.to_vec(), local, inst));
        }
        match self.current.as_mut() {
            Some((_, ws, inst)) => Ok((ws.clone(), inst)),
            None => Err(crate::err!(Runtime: "internal: no fallback instance")),
        }
    }
}

/// A device option placed on the host, its random seed kept.
pub(super) fn on_host(option: &mut Option<DeviceOption>) {
    let seed = option.as_ref().and_then(|d| d.random_seed);
    *option = Some(DeviceOption {
        device_type: Some(0),
        random_seed: seed,
        ..Default::default()
    });
}

/// Every op of `net` (and of the nets its ops run) placed on the host.
pub(super) fn net_on_host(net: &mut NetDef) {
    if net.device_option.is_some() {
        on_host(&mut net.device_option);
    }
    for op in &mut net.op {
        if op.device_option.is_some() {
            on_host(&mut op.device_option);
        }
        for a in &mut op.arg {
            if let Some(n) = a.n.as_mut() {
                net_on_host(n);
            }
            a.nets.iter_mut().for_each(net_on_host);
        }
    }
}

impl Operator for Fallback {
    fn locks_blobs(&self) -> bool {
        self.locked
    }

    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.locked {
            return self.run_locked(ctx);
        }
        let n_in = ctx.num_inputs();
        let mut copied = vec![false; n_in];
        let mut host = Vec::new();
        for (i, c) in copied.iter_mut().enumerate() {
            let g = ctx.input_handle(i).read();
            if let Some(t) = g.tensor() {
                if !t.is_host() {
                    *c = true;
                    host.push((i, t.to_host()?));
                }
            }
        }
        // Outputs that are not inputs: a device tensor left there by an earlier run is
        // dropped, so the CPU kernel writes a host tensor.
        for j in 0..ctx.num_outputs() {
            if self.def.input.contains(&self.def.output[j]) {
                continue;
            }
            let mut g = ctx.output_handle(j).write();
            if g.tensor().is_some_and(|t| !t.is_host()) {
                *g = Blob::Empty;
            }
        }
        let local = self.instance(&copied)?.0;
        for (i, t) in host {
            *local.create_local_blob(&self.def.input[i]).write() = Blob::Tensor(t);
        }
        {
            let (local, inst) = self.instance(&copied)?;
            inst.run(&local)?;
        }
        for j in 0..ctx.num_outputs() {
            if self.def.output[..j].contains(&self.def.output[j]) {
                continue; // a repeated output: moved with its first occurrence
            }
            let mut g = ctx.output_handle(j).write();
            let taken = if self.shadowed_output(&copied, j) {
                let h = local.create_local_blob(&self.def.output[j]);
                let mut lg = h.write();
                std::mem::take(&mut *lg)
            } else {
                std::mem::take(&mut *g)
            };
            *g = self.on_device(taken)?;
        }
        Ok(())
    }
}

impl Fallback {
    fn run_locked(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let all = vec![true; ctx.num_inputs()];
        let local = self.instance(&all)?.0;
        for i in 0..ctx.num_inputs() {
            let host = ctx.input(i)?.to_host()?;
            *local.create_local_blob(&self.def.input[i]).write() = Blob::Tensor(host);
        }
        {
            let (local, inst) = self.instance(&all)?;
            inst.run(&local)?;
        }
        for j in 0..ctx.num_outputs() {
            if self.def.output[..j].contains(&self.def.output[j]) {
                continue;
            }
            let h = local.create_local_blob(&self.def.output[j]);
            let taken = std::mem::take(&mut *h.write());
            *ctx.output_blob(j)? = self.on_device(taken)?;
        }
        Ok(())
    }

    fn on_device(&self, b: Blob) -> Result<Blob> {
        match b {
            Blob::Tensor(t) if t.is_host() && t.dtype() != DataType::String => {
                Ok(Blob::Tensor(self.dev.upload(&t)?))
            }
            other => Ok(other),
        }
    }
}
