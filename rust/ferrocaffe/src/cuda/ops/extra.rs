//! CUDA kernels of the `extra` family (see kernels/extra.cu): GivenTensorFill,
//! GivenTensorIntFill, GivenTensorInt64Fill, GivenTensorBoolFill, NCHW2NHWC, NHWC2NCHW,
//! InstanceNorm, LRN and LRNGradient, PRelu and PReluGradient, StopGradient, Max and Min with
//! MaxGradient and MinGradient, DotProduct and DotProductGradient, Tile and TileGradient.
//!
//! Each mirrors the CPU kernel of the same type (arguments, checks, output shapes). Cases the
//! kernels do not cover run the CPU kernel: GivenTensorFill with a `dtype` other than float,
//! int32, int64 or bool (at creation); at run time Max / Min of non-float inputs, Tile of
//! dtypes other than 1-, 4- or 8-byte ones, and StopGradient of strings.

use std::sync::Arc;

use crate::cuda::op::{device, init_device, input, input_f32, n64, output_tensor, DevIn};
use crate::cuda::{grid, rows, DeviceCtx};
use crate::cuda_launch;
use crate::device::DeviceType;
use crate::error::Result;
use crate::ops::cpu::fill::FillShape;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, ensure, err};

const MODULE: &str = "extra";

/// Threads per block of the row kernels.
const RT: u32 = 256;

/// Registers this family's CUDA kernels.
pub fn register(r: &mut Registry) {
    r.register("GivenTensorFill", DeviceType::Cuda, "", |i| {
        create_given(i, DataType::Float)
    });
    r.register("GivenTensorIntFill", DeviceType::Cuda, "", |i| {
        create_given(i, DataType::Int32)
    });
    r.register("GivenTensorInt64Fill", DeviceType::Cuda, "", |i| {
        create_given(i, DataType::Int64)
    });
    r.register("GivenTensorBoolFill", DeviceType::Cuda, "", |i| {
        create_given(i, DataType::Bool)
    });
    r.register("NCHW2NHWC", DeviceType::Cuda, "", |i| {
        create_layout(i, true)
    });
    r.register("NHWC2NCHW", DeviceType::Cuda, "", |i| {
        create_layout(i, false)
    });
    r.register("InstanceNorm", DeviceType::Cuda, "", create_instance_norm);
    r.register("LRN", DeviceType::Cuda, "", |i| create_lrn(i, false));
    r.register("LRNGradient", DeviceType::Cuda, "", |i| create_lrn(i, true));
    r.register("PRelu", DeviceType::Cuda, "", |i| create_prelu(i, false));
    r.register("PReluGradient", DeviceType::Cuda, "", |i| {
        create_prelu(i, true)
    });
    r.register("StopGradient", DeviceType::Cuda, "", create_stop_gradient);
    r.register("Max", DeviceType::Cuda, "", |i| create_minmax(i, true));
    r.register("Min", DeviceType::Cuda, "", |i| create_minmax(i, false));
    r.register("MaxGradient", DeviceType::Cuda, "", create_select_grad);
    r.register("MinGradient", DeviceType::Cuda, "", create_select_grad);
    r.register("DotProduct", DeviceType::Cuda, "", create_dot);
    r.register("DotProductGradient", DeviceType::Cuda, "", create_dot_grad);
    r.register("Tile", DeviceType::Cuda, "", |i| create_tile(i, false));
    r.register("TileGradient", DeviceType::Cuda, "", |i| {
        create_tile(i, true)
    });
}

/// A flag as a kernel argument.
fn flag(b: bool) -> i32 {
    i32::from(b)
}

/// The storage order argument as the CPU's norm ops read it (true: NHWC).
fn nhwc(init: &OpInit<'_>) -> Result<bool> {
    match init.args.string("order", "NCHW")?.as_str() {
        "NCHW" => Ok(false),
        "NHWC" => Ok(true),
        other => Err(err!(op = init, BadArgument: "Unknown storage order: {other}")),
    }
}

/// (N, C, inner) of the norm ops' inputs, as the CPU computes them.
fn layout(dims: &[usize], nhwc: bool) -> Result<(usize, usize, usize)> {
    if dims.len() < 2 {
        bail!(ShapeMismatch: "expected at least 2 dimensions, got {dims:?}");
    }
    let n = dims[0];
    let c = if nhwc { dims[dims.len() - 1] } else { dims[1] };
    let total: usize = dims.iter().product();
    let nc = n
        .checked_mul(c)
        .ok_or_else(|| err!(ShapeMismatch: "shape {dims:?} overflows"))?;
    Ok((n, c, total.checked_div(nc).unwrap_or(0)))
}

/// Writes output `j` as a copy of `x` (new memory unless the output's own can be reused).
fn copy_to_output(
    ctx: &mut OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    j: usize,
    x: &DevIn,
) -> Result<()> {
    let bytes = x
        .numel()
        .checked_mul(x.t.dtype().item_size())
        .ok_or_else(|| err!(ShapeMismatch: "tensor shape {:?} overflows", x.dims()))?;
    let yp = output_tensor(ctx, dev, j, x.t.dtype(), x.dims())?;
    dev.copy_d2d(yp, x.ptr, bytes)
}

// ---- GivenTensor*Fill ---------------------------------------------------------------------

fn create_given(init: &OpInit<'_>, kind: DataType) -> Result<Box<dyn Operator>> {
    let shape = FillShape::new(init)?;
    let a = &init.args;
    let mut dtype = kind;
    if kind == DataType::Float && a.has("dtype") {
        dtype = match a.int("dtype", 1)? {
            1 => DataType::Float,
            5 => DataType::Bool,
            2 => DataType::Int32,
            10 => DataType::Int64,
            // Double, int16, string, and the errors: the CPU kernel.
            _ => return crate::cuda::fallback(init),
        };
    }
    let values = match dtype {
        DataType::Float => {
            let f = a.floats("values");
            Tensor::from_vec(&[f.len()], f)?
        }
        DataType::Int32 => {
            let v = a.ints("values");
            Tensor::from_vec(&[v.len()], v.iter().map(|&x| x as i32).collect())?
        }
        DataType::Int64 => {
            let v = a.ints("values");
            Tensor::from_vec(&[v.len()], v)?
        }
        DataType::Bool => {
            let v = a.ints("values");
            Tensor::from_vec(&[v.len()], v.iter().map(|&x| x != 0).collect())?
        }
        _ => return crate::cuda::fallback(init),
    };
    let dev0 = init_device(init)?;
    let values = dev0.upload(&values)?;
    let bytes = values
        .numel()
        .checked_mul(dtype.item_size())
        .ok_or_else(|| err!(op = init, BadArgument: "too many values"))?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dims = shape.resolve(ctx)?;
        let n: usize = dims.iter().product();
        if n != values.numel() {
            bail!(
                op = ctx,
                ShapeMismatch: "output size {n} (shape {dims:?}) does not match the {} given \
                 values",
                values.numel()
            );
        }
        let dev = device(ctx)?;
        let src = dev.upload(&values)?;
        let (sp, _) = crate::cuda::raw(&src)?;
        let yp = output_tensor(ctx, &dev, 0, dtype, &dims)?;
        dev.copy_d2d(yp, sp, bytes)
    })))
}

// ---- NCHW2NHWC, NHWC2NCHW -----------------------------------------------------------------

fn create_layout(init: &OpInit<'_>, to_nhwc: bool) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let mut ks = Vec::with_capacity(4);
    for (size, name) in [
        (1, "btrans_u8"),
        (2, "btrans_u16"),
        (4, "btrans_u32"),
        (8, "btrans_u64"),
    ] {
        ks.push((size, dev0.function(MODULE, name)?));
    }
    let mut other = crate::cuda::fallback_locked(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let d = ctx.input(0)?.dims().to_vec();
        let nd = d.len();
        if nd < 3 {
            bail!(
                op = ctx,
                ShapeMismatch: "The input must be at least 3-d (N, C and a spatial axis), got {d:?}"
            );
        }
        let dt = ctx.input(0)?.dtype();
        if dt == DataType::String {
            return other.run(ctx);
        }
        let Some((_, f)) = ks.iter().find(|(s, _)| *s == dt.item_size()) else {
            return other.run(ctx);
        };
        let dev = device(ctx)?;
        let x = input(ctx, &dev, 0)?;
        // Each image is a (C x spatial) matrix transposed, or back.
        let (out, rows_, cols) = if to_nhwc {
            let spatial = d[2..].iter().product::<usize>();
            let out = [d[0]]
                .into_iter()
                .chain(d[2..].iter().copied())
                .chain([d[1]]);
            (out.collect::<Vec<_>>(), d[1], spatial)
        } else {
            let spatial = d[1..nd - 1].iter().product::<usize>();
            let out = [d[0], d[nd - 1]]
                .into_iter()
                .chain(d[1..nd - 1].iter().copied());
            (out.collect::<Vec<_>>(), spatial, d[nd - 1])
        };
        let n = x.numel();
        let yp = output_tensor(ctx, &dev, 0, dt, &out)?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n); x.ptr, yp, n64(n), n64(rows_), n64(cols))?;
        }
        Ok(())
    })))
}

// ---- InstanceNorm -------------------------------------------------------------------------

/// Input `i` as float32 holding `c` values (the CPU's check).
fn channel_input(ctx: &OpContext<'_>, dev: &Arc<DeviceCtx>, i: usize, c: usize) -> Result<DevIn> {
    let v = input_f32(ctx, dev, i)?;
    if v.numel() != c {
        bail!(
            ShapeMismatch: "input {i} ('{}') has {} values, expected C = {c}",
            ctx.input_name(i),
            v.numel()
        );
    }
    Ok(v)
}

fn create_instance_norm(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let eps = init.args.float("epsilon", 1e-5)?;
    let nhwc = nhwc(init)?;
    let f = init_device(init)?.function(MODULE, "instance_norm_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, nhwc)?;
        let scale = channel_input(ctx, &dev, 1, c)?;
        let bias = channel_input(ctx, &dev, 2, c)?;
        let x = input_f32(ctx, &dev, 0)?;
        let yp = output_tensor(ctx, &dev, 0, DataType::Float, &dims)?;
        let mp = if ctx.num_outputs() > 1 {
            output_tensor(ctx, &dev, 1, DataType::Float, &[n, c])?
        } else {
            0
        };
        let ip = if ctx.num_outputs() > 2 {
            output_tensor(ctx, &dev, 2, DataType::Float, &[n, c])?
        } else {
            0
        };
        let nc = n * c;
        if nc > 0 {
            cuda_launch!(dev, f, rows(nc, RT);
                x.ptr, scale.ptr, bias.ptr, yp, mp, ip, n64(n), n64(c), n64(inner), eps,
                flag(nhwc))?;
        }
        Ok(())
    })))
}

// ---- LRN ----------------------------------------------------------------------------------

fn create_lrn(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let size = init.args.usize("size", 0)?;
    if size == 0 || size % 2 == 0 {
        bail!(op = init, BadArgument: "LRN size must be odd and positive, got {size}");
    }
    let alpha = init.args.float("alpha", 0.0)?;
    let beta = init.args.float("beta", 0.0)?;
    let bias = init.args.float("bias", 1.0)?;
    let nhwc = nhwc(init)?;
    let a = alpha / size as f32;
    let cache_ratio = 2.0 * alpha * beta / size as f32;
    let pre = (size - 1) / 2;
    let dev0 = init_device(init)?;
    let scale_f = dev0.function(MODULE, "lrn_scale_f32")?;
    let fwd_f = dev0.function(MODULE, "lrn_fwd_f32")?;
    let grad_f = dev0.function(MODULE, "lrn_grad_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let dims = ctx.input(0)?.dims().to_vec();
        let (_, c, inner) = layout(&dims, nhwc)?;
        if gradient {
            for i in 1..3 {
                if ctx.input(i)?.dims() != dims.as_slice() {
                    bail!(
                        ShapeMismatch: "input {i} ('{}') has shape {:?}, expected the shape of \
                         X {dims:?}",
                        ctx.input_name(i),
                        ctx.input(i)?.dims()
                    );
                }
            }
        }
        let x = input_f32(ctx, &dev, 0)?;
        let total = x.numel();
        // The window clipped to the channels gives the same sums with a bounded `pre`.
        let pre = n64(pre.min(c));
        let (c64, inner64) = (n64(c), n64(inner.max(1)));
        if gradient {
            let y = input_f32(ctx, &dev, 1)?;
            let dy = input_f32(ctx, &dev, 2)?;
            let (_scale, sp) = crate::cuda::op::new_tensor(&dev, DataType::Float, &dims)?;
            let dxp = output_tensor(ctx, &dev, 0, DataType::Float, &dims)?;
            if total > 0 {
                cuda_launch!(dev, scale_f, grid(total);
                    x.ptr, sp, n64(total), c64, inner64, pre, bias, a, flag(nhwc))?;
                cuda_launch!(dev, grad_f, grid(total);
                    x.ptr, y.ptr, dy.ptr, sp, dxp, n64(total), c64, inner64, pre, beta,
                    cache_ratio, flag(nhwc))?;
            }
            return Ok(());
        }
        let yp = output_tensor(ctx, &dev, 0, DataType::Float, &dims)?;
        let (_tmp, sp) = if ctx.num_outputs() > 1 {
            (None, output_tensor(ctx, &dev, 1, DataType::Float, &dims)?)
        } else {
            let (t, p) = crate::cuda::op::new_tensor(&dev, DataType::Float, &dims)?;
            (Some(t), p)
        };
        if total > 0 {
            cuda_launch!(dev, scale_f, grid(total);
                x.ptr, sp, n64(total), c64, inner64, pre, bias, a, flag(nhwc))?;
            cuda_launch!(dev, fwd_f, grid(total); x.ptr, sp, yp, n64(total), beta)?;
        }
        Ok(())
    })))
}

// ---- PRelu --------------------------------------------------------------------------------

fn create_prelu(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let nhwc = init.args.string("order", "NCHW")? == "NHWC";
    let dev0 = init_device(init)?;
    let fwd_f = dev0.function(MODULE, "prelu_f32")?;
    let dx_f = dev0.function(MODULE, "prelu_dx_f32")?;
    let ds_f = dev0.function(MODULE, "prelu_ds_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let xi = if gradient { 2 } else { 0 };
        let dims = ctx.input(xi)?.dims().to_vec();
        let w = input_f32(ctx, &dev, xi + 1)?;
        let channels = if dims.len() < 2 {
            1
        } else if nhwc {
            dims[dims.len() - 1]
        } else {
            dims[1]
        };
        let shared = w.numel() == 1;
        if !shared && w.numel() != channels {
            bail!(
                op = ctx,
                ShapeMismatch: "slope has {} values, expected 1 or C = {channels}",
                w.numel()
            );
        }
        let x = input_f32(ctx, &dev, xi)?;
        let total = x.numel();
        let inner: usize = if dims.len() < 2 {
            1
        } else {
            dims[2..].iter().product::<usize>().max(1)
        };
        let (c64, inner64) = (n64(channels.max(1)), n64(inner));
        if !gradient {
            let yp = output_tensor(ctx, &dev, 0, DataType::Float, &dims)?;
            if total > 0 {
                cuda_launch!(dev, fwd_f, grid(total);
                    x.ptr, w.ptr, yp, n64(total), c64, inner64, flag(shared), flag(nhwc))?;
            }
            return Ok(());
        }
        let g = input_f32(ctx, &dev, 1)?;
        if g.numel() != total {
            bail!(op = ctx, ShapeMismatch: "dY must have the shape of X");
        }
        let sd = w.dims().to_vec();
        let nslope = w.numel();
        let per = if shared {
            total
        } else {
            total.checked_div(channels).unwrap_or(0)
        };
        let dxp = output_tensor(ctx, &dev, 0, DataType::Float, &dims)?;
        let dsp = output_tensor(ctx, &dev, 1, DataType::Float, &sd)?;
        if nslope > 0 {
            cuda_launch!(dev, ds_f, rows(nslope, RT);
                x.ptr, g.ptr, dsp, n64(nslope), n64(per), c64, inner64, flag(shared),
                flag(nhwc))?;
        }
        if total > 0 {
            cuda_launch!(dev, dx_f, grid(total);
                x.ptr, w.ptr, g.ptr, dxp, n64(total), c64, inner64, flag(shared), flag(nhwc))?;
        }
        Ok(())
    })))
}

// ---- StopGradient -------------------------------------------------------------------------

fn create_stop_gradient(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    init_device(init)?;
    let mut other = crate::cuda::fallback_locked(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        if ctx.is_inplace(0, 0) {
            return Ok(());
        }
        if ctx.input(0)?.dtype() == DataType::String {
            return other.run(ctx);
        }
        let dev = device(ctx)?;
        let x = input(ctx, &dev, 0)?;
        copy_to_output(ctx, &dev, 0, &x)
    })))
}

// ---- Max, Min and their gradients ---------------------------------------------------------

fn create_minmax(init: &OpInit<'_>, is_max: bool) -> Result<Box<dyn Operator>> {
    let f = init_device(init)?.function(MODULE, "minmax_f32")?;
    let mut other = crate::cuda::fallback_locked(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n_in = ctx.num_inputs();
        let all_f32 = (0..n_in).try_fold(true, |acc, i| {
            Ok::<bool, crate::error::Error>(acc && ctx.input(i)?.dtype() == DataType::Float)
        })?;
        if !all_f32 {
            return other.run(ctx);
        }
        let dims = ctx.input(0)?.dims().to_vec();
        for i in 1..n_in {
            let d = ctx.input(i)?.dims();
            if d != dims.as_slice() {
                bail!(
                    op = ctx,
                    ShapeMismatch: "Input #{i}, input dimension:{d:?} should match output \
                     dimension: {dims:?}"
                );
            }
        }
        let dev = device(ctx)?;
        let xs = (0..n_in)
            .map(|i| input_f32(ctx, &dev, i))
            .collect::<Result<Vec<_>>>()?;
        let Some(first) = xs.first() else {
            bail!(op = ctx, Schema: "expected at least one input");
        };
        let n = first.numel();
        let bytes = n
            .checked_mul(4)
            .ok_or_else(|| err!(ShapeMismatch: "shape {dims:?} overflows"))?;
        let yp = output_tensor(ctx, &dev, 0, DataType::Float, &dims)?;
        dev.copy_d2d(yp, first.ptr, bytes)?;
        if n > 0 {
            for x in &xs[1..] {
                cuda_launch!(dev, f, grid(n); yp, x.ptr, yp, n64(n), flag(is_max))?;
            }
        }
        Ok(())
    })))
}

fn create_select_grad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let f = init_device(init)?.function(MODULE, "select_grad_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n = ctx.num_inputs().saturating_sub(2);
        if ctx.num_outputs() != n {
            bail!(op = ctx, Schema: "expected {n} outputs, got {}", ctx.num_outputs());
        }
        let dev = device(ctx)?;
        let y = input_f32(ctx, &dev, 0)?;
        let dy = input_f32(ctx, &dev, 1)?;
        ensure!(dy.numel() == y.numel(), ShapeMismatch: "Y and dY must have the same size");
        let xs = (0..n)
            .map(|i| input_f32(ctx, &dev, i + 2))
            .collect::<Result<Vec<_>>>()?;
        for (i, x) in xs.iter().enumerate() {
            if x.numel() != y.numel() {
                bail!(ShapeMismatch: "input {} must have the shape of Y", i + 2);
            }
        }
        for (i, x) in xs.iter().enumerate() {
            let m = x.numel();
            let dxp = output_tensor(ctx, &dev, i, DataType::Float, x.dims())?;
            if m > 0 {
                cuda_launch!(dev, f, grid(m); x.ptr, y.ptr, dy.ptr, dxp, n64(m))?;
            }
        }
        Ok(())
    })))
}

// ---- DotProduct ---------------------------------------------------------------------------

/// (N, D) of DotProduct's inputs, as the CPU checks them.
fn dot_rows(x: &[usize], y: &[usize]) -> Result<(usize, usize)> {
    if x != y {
        bail!(ShapeMismatch: "X {x:?} and Y {y:?} must have the same shape");
    }
    let n = x.first().copied().unwrap_or(1);
    let total: usize = x.iter().product();
    Ok((n, total.checked_div(n).unwrap_or(0)))
}

fn create_dot(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let f = init_device(init)?.function(MODULE, "dot_rows_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let (n, d) = dot_rows(ctx.input(0)?.dims(), ctx.input(1)?.dims())?;
        let x = input_f32(ctx, &dev, 0)?;
        let y = input_f32(ctx, &dev, 1)?;
        let zp = output_tensor(ctx, &dev, 0, DataType::Float, &[n])?;
        if n > 0 {
            cuda_launch!(dev, f, rows(n, RT); x.ptr, y.ptr, zp, n64(n), n64(d))?;
        }
        Ok(())
    })))
}

fn create_dot_grad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let f = init_device(init)?.function(MODULE, "dot_grad_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let (n, d) = dot_rows(ctx.input(0)?.dims(), ctx.input(1)?.dims())?;
        let dz = input_f32(ctx, &dev, 2)?;
        if dz.numel() != n {
            bail!(ShapeMismatch: "dZ must hold {n} values, got {}", dz.numel());
        }
        let x = input_f32(ctx, &dev, 0)?;
        let y = input_f32(ctx, &dev, 1)?;
        let dims = x.dims().to_vec();
        let total = x.numel();
        let dxp = output_tensor(ctx, &dev, 0, DataType::Float, &dims)?;
        let dyp = output_tensor(ctx, &dev, 1, DataType::Float, &dims)?;
        if total > 0 {
            cuda_launch!(dev, f, grid(total);
                x.ptr, y.ptr, dz.ptr, dxp, dyp, n64(total), n64(d.max(1)))?;
        }
        Ok(())
    })))
}

// ---- Tile ---------------------------------------------------------------------------------

/// `axis` counted from the back when negative, below `nd`.
fn canonical(axis: i64, nd: usize) -> Result<usize> {
    let nd64 = i64::try_from(nd).unwrap_or(i64::MAX);
    let a = if axis < 0 {
        axis.saturating_add(nd64)
    } else {
        axis
    };
    if a < 0 || a >= nd64 {
        bail!(BadArgument: "axis {axis} out of range for {nd} dimensions");
    }
    Ok(a as usize)
}

fn create_tile(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let tiles_arg = init.args.int("tiles", 1)?;
    let axis_arg = init.args.int("axis", 0)?;
    let dev0 = init_device(init)?;
    let mut ks = Vec::with_capacity(3);
    for (size, name) in [(1, "tile_u8"), (4, "tile_u32"), (8, "tile_u64")] {
        ks.push((size, dev0.function(MODULE, name)?));
    }
    let grad_f = dev0.function(MODULE, "tile_grad_f32")?;
    let mut other = crate::cuda::fallback_locked(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n_in = ctx.num_inputs();
        let tiles = if n_in > 1 {
            ctx.input(1)?.to_i64_vec()?.first().copied().unwrap_or(1)
        } else {
            tiles_arg
        };
        let axis = if n_in > 2 {
            ctx.input(2)?.to_i64_vec()?.first().copied().unwrap_or(0)
        } else {
            axis_arg
        };
        let tiles = usize::try_from(tiles)
            .map_err(|_| err!(BadArgument: "tiles must not be negative, got {tiles}"))?;
        let dt = ctx.input(0)?.dtype();
        let d = ctx.input(0)?.dims().to_vec();
        let ax = canonical(axis, d.len())?;
        let outer: usize = d[..ax].iter().product();
        let block: usize = d[ax..].iter().product();
        let dev = device(ctx)?;
        if gradient {
            let t1 = tiles.max(1);
            if d[ax] % t1 != 0 {
                bail!(ShapeMismatch: "dY dimension {} is not a multiple of tiles {tiles}", d[ax]);
            }
            let mut od = d.clone();
            od[ax] /= t1;
            let small = block / t1;
            let g = input_f32(ctx, &dev, 0)?;
            let m = outer * small;
            let dxp = output_tensor(ctx, &dev, 0, DataType::Float, &od)?;
            if m > 0 {
                cuda_launch!(dev, grad_f, grid(m); g.ptr, dxp, n64(m), n64(tiles), n64(small))?;
            }
            return Ok(());
        }
        let native = matches!(
            dt,
            DataType::Float
                | DataType::Double
                | DataType::Int32
                | DataType::Int64
                | DataType::Bool
                | DataType::Uint8
        );
        let Some((_, f)) = ks.iter().find(|(s, _)| native && *s == dt.item_size()) else {
            return other.run(ctx);
        };
        let mut od = d.clone();
        od[ax] = d[ax]
            .checked_mul(tiles)
            .ok_or_else(|| err!(BadArgument: "tiling {d:?} by {tiles} overflows"))?;
        let total = crate::error::checked_numel(&od, dt.item_size(), "the output")?;
        let x = input(ctx, &dev, 0)?;
        let yp = output_tensor(ctx, &dev, 0, dt, &od)?;
        if total > 0 {
            cuda_launch!(dev, f, grid(total);
                x.ptr, yp, n64(total), n64(tiles), n64(block.max(1)))?;
        }
        Ok(())
    })))
}
