//! The copy operators between host and device: `CopyCPUToGPU`, `CopyGPUToCPU`,
//! `CopyFromCPUInput`, `CopyOnDeviceLike`, `EnsureCPUOutput`, and `Copy` on the device.

use crate::cuda::op::{device, init_device};
use crate::device::DeviceType;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the copy operators.
pub fn register(r: &mut Registry) {
    for t in [
        "CopyCPUToGPU",
        "CopyFromCPUInput",
        "CopyOnDeviceLike",
        "Copy",
    ] {
        r.register(t, DeviceType::Cuda, "", create_to_device);
    }
    for t in ["CopyGPUToCPU", "EnsureCPUOutput"] {
        r.register(t, DeviceType::Cuda, "", create_to_host);
    }
}

/// Output 0 = input 0 in new memory on the op's device.
fn create_to_device(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    init_device(init)?;
    Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = ctx.input(0)?;
        let y = if x.is_host() {
            dev.upload(x)?
        } else {
            dev.duplicate(x)?
        };
        *ctx.output(0)? = y;
        Ok(())
    })))
}

/// Output 0 = input 0 on the host.
fn create_to_host(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    init_device(init)?;
    Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
        let x = ctx.input(0)?;
        let y = if x.is_host() {
            x.deep_copy()
        } else {
            x.to_host()?
        };
        *ctx.output(0)? = y;
        Ok(())
    })))
}
