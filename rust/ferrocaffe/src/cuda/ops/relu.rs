//! Relu and ReluGradient.

use crate::cuda::grid;
use crate::cuda::op::{device, init_device, input_f32, n64, output_elementwise};
use crate::cuda_launch;
use crate::device::DeviceType;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::DataType;

/// Registers Relu and ReluGradient.
pub fn register(r: &mut Registry) {
    r.register("Relu", DeviceType::Cuda, "", create_relu);
    r.register("ReluGradient", DeviceType::Cuda, "", create_relu_grad);
}

fn create_relu(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let f = init_device(init)?.function("elementwise", "relu_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let n = x.numel();
        let yp = output_elementwise(ctx, &dev, 0, DataType::Float, x.dims())?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n); x.ptr, yp, n64(n))?;
        }
        Ok(())
    })))
}

fn create_relu_grad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let f = init_device(init)?.function("elementwise", "relu_grad_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let y = input_f32(ctx, &dev, 0)?;
        let dy = input_f32(ctx, &dev, 1)?;
        crate::ensure!(y.dims() == dy.dims(), ShapeMismatch: "Y {:?} and dY {:?} differ", y.dims(), dy.dims());
        let n = y.numel();
        let dxp = output_elementwise(ctx, &dev, 0, DataType::Float, y.dims())?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n); y.ptr, dy.ptr, dxp, n64(n))?;
        }
        Ok(())
    })))
}
