//! Ops without a CUDA kernel of their own run their CPU kernel (as Caffe2's `GPUFallbackOp`
//! did): the inputs that live on the device are copied to the host, the CPU kernel runs in a
//! private child workspace, and its tensor outputs are copied to the op's device, so a CUDA
//! net keeps its outputs on the GPU whatever ops it holds.

use std::collections::HashMap;
use std::sync::Arc;

use super::device::DeviceCtx;
use super::op::init_device;
use crate::error::Result;
use crate::net::OpInstance;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::proto::{DeviceOption, OperatorDef};
use crate::tensor::DataType;
use crate::workspace::{Blob, Workspace};

/// The factory registered on CUDA for every type that has no CUDA kernel.
pub fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev = init_device(init)?;
    // The CPU kernel must exist (and accept the arguments): create it once now.
    let mut op = Fallback {
        dev,
        def: init.def.clone(),
        local: Workspace::new_child(init.ws),
        instances: HashMap::new(),
    };
    op.instance(&vec![false; init.def.input.len()])?;
    Ok(Box::new(op))
}

struct Fallback {
    dev: Arc<DeviceCtx>,
    def: OperatorDef,
    local: Arc<Workspace>,
    /// The CPU op by which inputs are copied (true: input `i` came from the device).
    instances: HashMap<Vec<bool>, OpInstance>,
}

fn local_input(i: usize) -> String {
    format!("__cuda_fallback_in_{i}")
}

impl Fallback {
    /// The local name output `j` is written under, when it is a copied input's.
    fn output_alias(&self, copied: &[bool], j: usize) -> Option<usize> {
        let name = &self.def.output[j];
        self.def
            .input
            .iter()
            .enumerate()
            .find(|(i, n)| *n == name && copied[*i])
            .map(|(i, _)| i)
    }

    fn instance(&mut self, copied: &[bool]) -> Result<&mut OpInstance> {
        if !self.instances.contains_key(copied) {
            let mut def = self.def.clone();
            for (i, name) in def.input.iter_mut().enumerate() {
                if copied[i] {
                    *name = local_input(i);
                }
            }
            for j in 0..def.output.len() {
                if let Some(i) = self.output_alias(copied, j) {
                    def.output[j] = local_input(i);
                }
            }
            let seed = self.def.device_option.as_ref().and_then(|d| d.random_seed);
            def.device_option = Some(DeviceOption {
                device_type: Some(0),
                random_seed: seed,
                ..Default::default()
            });
            for i in (0..copied.len()).filter(|&i| copied[i]) {
                self.local.create_blob(&local_input(i));
            }
            let inst = OpInstance::new(&def, &self.local)?;
            self.instances.insert(copied.to_vec(), inst);
        }
        Ok(self
            .instances
            .get_mut(copied)
            .unwrap_or_else(|| unreachable!("inserted above")))
    }
}

impl Operator for Fallback {
    fn locks_blobs(&self) -> bool {
        false
    }

    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
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
            let name = &self.def.output[j];
            if self.def.input.contains(name) {
                continue;
            }
            let mut g = ctx.output_handle(j).write();
            if g.tensor().is_some_and(|t| !t.is_host()) {
                *g = Blob::Empty;
            }
        }
        for (i, t) in host {
            *self.local.create_blob(&local_input(i)).write() = Blob::Tensor(t);
        }
        let local = self.local.clone();
        self.instance(&copied)?.run(&local)?;
        for j in 0..ctx.num_outputs() {
            let mut g = ctx.output_handle(j).write();
            match self.output_alias(&copied, j) {
                Some(i) => {
                    let h = self.local.create_blob(&local_input(i));
                    let taken = std::mem::take(&mut *h.write());
                    *g = self.on_device(taken)?;
                }
                None => {
                    let taken = std::mem::take(&mut *g);
                    *g = self.on_device(taken)?;
                }
            }
        }
        Ok(())
    }
}

impl Fallback {
    fn on_device(&self, b: Blob) -> Result<Blob> {
        match b {
            Blob::Tensor(t) if t.is_host() && t.dtype() != DataType::String => {
                Ok(Blob::Tensor(self.dev.upload(&t)?))
            }
            other => Ok(other),
        }
    }
}
