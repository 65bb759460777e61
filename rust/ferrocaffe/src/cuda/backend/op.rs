//! What a CUDA kernel's operator needs from its context: the device, inputs as device
//! addresses (a host input is copied to the device first), and outputs in new pool memory.

use std::sync::Arc;

use super::device::{device_of, DeviceCtx};
use super::memory::raw;
use crate::error::{Error, Result};
use crate::ops::operator::{OpContext, OpInit};
use crate::tensor::{DataType, Tensor};

/// An input on the device: the tensor (kept alive while its address is used) and the address
/// of its first element.
pub struct DevIn {
    /// The tensor, on the op's device.
    pub t: Tensor,
    /// Its first element's device address.
    pub ptr: u64,
}

impl DevIn {
    /// The dims.
    pub fn dims(&self) -> &[usize] {
        self.t.dims()
    }

    /// The element count.
    pub fn numel(&self) -> usize {
        self.t.numel()
    }
}

/// The device context an op created for a CUDA device runs on.
pub fn init_device(init: &OpInit<'_>) -> Result<Arc<DeviceCtx>> {
    device_of(init.device).map_err(|e| init.err(e))
}

/// The device context of a running op.
pub fn device(ctx: &OpContext<'_>) -> Result<Arc<DeviceCtx>> {
    device_of(ctx.device)
}

/// Input `i` on `dev` (copied there when it lives elsewhere).
pub fn input(ctx: &OpContext<'_>, dev: &Arc<DeviceCtx>, i: usize) -> Result<DevIn> {
    let t = dev.upload(ctx.input(i)?)?;
    let (ptr, _) = raw(&t)?;
    Ok(DevIn { t, ptr })
}

/// Input `i` on `dev`, which must hold `dtype`.
pub fn input_of(
    ctx: &OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    i: usize,
    dtype: DataType,
) -> Result<DevIn> {
    let x = input(ctx, dev, i)?;
    if x.t.dtype() != dtype {
        return Err(Error::DtypeMismatch(format!(
            "input {i} ('{}') holds {}, expected {dtype} on CUDA",
            ctx.input_name(i),
            x.t.dtype()
        )));
    }
    Ok(x)
}

/// Input `i` as float32.
pub fn input_f32(ctx: &OpContext<'_>, dev: &Arc<DeviceCtx>, i: usize) -> Result<DevIn> {
    input_of(ctx, dev, i, DataType::Float)
}

/// A new device tensor for an output and its address.
pub fn new_tensor(dev: &Arc<DeviceCtx>, dtype: DataType, dims: &[usize]) -> Result<(Tensor, u64)> {
    let t = dev.alloc_tensor(dtype, dims)?;
    let (p, _) = raw(&t)?;
    Ok((t, p))
}

/// The device address to write output `j` at, as a `dtype` tensor of `dims` on `dev`: the
/// output's own memory when it already holds such a tensor there whose buffer no other tensor
/// shares (as CPU kernels write into their outputs; a recurrent network's step outputs are
/// views into its sequence tensors and must be written in place), else new pool memory. An
/// output that is also an input of the op always gets new memory, so kernels never read what
/// they are writing.
pub fn output_tensor(
    ctx: &mut OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    j: usize,
    dtype: DataType,
    dims: &[usize],
) -> Result<u64> {
    let is_input = (0..ctx.num_inputs()).any(|i| ctx.is_inplace(i, j));
    output_memory(ctx, dev, j, dtype, dims, !is_input)
}

/// [`output_tensor`] for element-wise kernels (element `i` of the output depends on element
/// `i` of the inputs only): an output that is also an input is written in place too.
pub fn output_elementwise(
    ctx: &mut OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    j: usize,
    dtype: DataType,
    dims: &[usize],
) -> Result<u64> {
    output_memory(ctx, dev, j, dtype, dims, true)
}

fn output_memory(
    ctx: &mut OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    j: usize,
    dtype: DataType,
    dims: &[usize],
    may_reuse: bool,
) -> Result<u64> {
    let here = crate::device::Device::Cuda(dev.ordinal);
    let out = ctx.output(j)?;
    if may_reuse
        && out.device() == here
        && out.buffer_is_unshared()
        && out.try_reshape_in_place(dtype, dims)
    {
        return Ok(raw(out)?.0);
    }
    let (t, p) = new_tensor(dev, dtype, dims)?;
    *out = t;
    Ok(p)
}

/// Stores `t` as output `j`.
pub fn set_output(ctx: &mut OpContext<'_>, j: usize, t: Tensor) -> Result<()> {
    *ctx.output(j)? = t;
    Ok(())
}

/// Output `j` holding input `i`'s values, to be updated in place: when the op runs in place
/// (`i` and `j` are one blob on this device) the blob's own memory, else a copy of input `i`
/// stored as output `j`. Returns the address to write.
pub fn update_in_place(
    ctx: &mut OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    i: usize,
    j: usize,
) -> Result<u64> {
    let x = ctx.input(i)?;
    if ctx.is_inplace(i, j) && x.device() == crate::device::Device::Cuda(dev.ordinal) {
        return Ok(raw(x)?.0);
    }
    let copy = dev.duplicate(x)?;
    let (p, _) = raw(&copy)?;
    set_output(ctx, j, copy)?;
    Ok(p)
}

/// An element count as a kernel argument.
pub fn n64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
