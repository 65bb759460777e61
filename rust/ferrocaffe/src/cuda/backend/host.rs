//! Ops that run nets over their own workspace (recurrent networks) have no CUDA
//! implementation yet: on CUDA they run their CPU kernel directly in the op's workspace, with
//! their step nets on the host. Their device inputs are moved to the host in place first (the
//! nets they run read those blobs by name), and their outputs stay there; CUDA kernels that
//! read them later copy them to the device.

use super::fallback::{net_on_host, on_host};
use crate::device::{Device, DeviceType};
use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::workspace::Blob;

/// The types that run this way.
pub const TYPES: &[&str] = &[
    "RecurrentNetwork",
    "RecurrentNetworkGradient",
    "RecurrentNetworkBlobFetcher",
];

/// Creates the CPU kernel of `init`'s op with it and its nets placed on the host.
pub fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let mut def = init.def.clone();
    on_host(&mut def.device_option);
    for a in &mut def.arg {
        if let Some(n) = a.n.as_mut() {
            net_on_host(n);
        }
        a.nets.iter_mut().for_each(net_on_host);
    }
    let factory = init
        .ws
        .registry()
        .lookup(def.r#type(), DeviceType::Cpu, def.engine())
        .ok_or_else(|| init.err(format!("no CPU kernel for {}", def.r#type())))?;
    let inner = factory(&OpInit::on(&def, init.ws, Device::Cpu))?;
    Ok(Box::new(HostOp { inner }))
}

struct HostOp {
    inner: Box<dyn Operator>,
}

impl Operator for HostOp {
    fn locks_blobs(&self) -> bool {
        self.inner.locks_blobs()
    }

    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        // An op whose blobs the net locks (the blob fetcher) reads no device tensor.
        for i in (0..ctx.num_inputs()).filter(|_| !self.inner.locks_blobs()) {
            let mut g = ctx.input_handle(i).write();
            let host = match &*g {
                Blob::Tensor(t) if !t.is_host() => t.to_host()?,
                _ => continue,
            };
            *g = Blob::Tensor(host);
        }
        let device = std::mem::replace(&mut ctx.device, Device::Cpu);
        let r = self.inner.run(ctx);
        ctx.device = device;
        r
    }
}
