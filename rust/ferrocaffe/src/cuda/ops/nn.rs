//! CUDA kernels of the `nn` family (see kernels/nn.cu): Softmax, SoftmaxWithLoss,
//! LabelCrossEntropy, CrossEntropy, SigmoidCrossEntropyWithLogits, SquaredL2Distance,
//! LayerNorm, SpatialBN and Dropout, with their gradients. Each mirrors the CPU kernel of the
//! same type (arguments, checks, output shapes); SpatialBN with `num_batches > 1` runs on the
//! CPU fallback.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::cuda::op::{
    device, init_device, input_f32, input_of, n64, new_tensor, set_output, update_in_place, DevIn,
};
use crate::cuda::{grid, raw, rows, DeviceCtx};
use crate::cuda_launch;
use crate::device::DeviceType;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, ensure, err};

/// Threads per block of the row kernels.
const RT: u32 = 256;

/// Registers this family's CUDA kernels.
pub fn register(r: &mut Registry) {
    r.register("Softmax", DeviceType::Cuda, "", |i| {
        create_softmax(i, false)
    });
    r.register("SoftmaxGradient", DeviceType::Cuda, "", |i| {
        create_softmax(i, true)
    });
    r.register("SoftmaxWithLoss", DeviceType::Cuda, "", create_swl);
    r.register(
        "SoftmaxWithLossGradient",
        DeviceType::Cuda,
        "",
        create_swl_grad,
    );
    r.register("LabelCrossEntropy", DeviceType::Cuda, "", |i| {
        create_label_xent(i, false)
    });
    r.register("LabelCrossEntropyGradient", DeviceType::Cuda, "", |i| {
        create_label_xent(i, true)
    });
    r.register("CrossEntropy", DeviceType::Cuda, "", |i| {
        create_xent(i, false)
    });
    r.register("CrossEntropyGradient", DeviceType::Cuda, "", |i| {
        create_xent(i, true)
    });
    r.register("SigmoidCrossEntropyWithLogits", DeviceType::Cuda, "", |i| {
        create_sigmoid_xent(i, false)
    });
    r.register(
        "SigmoidCrossEntropyWithLogitsGradient",
        DeviceType::Cuda,
        "",
        |i| create_sigmoid_xent(i, true),
    );
    r.register("SquaredL2Distance", DeviceType::Cuda, "", |i| {
        create_sql2(i, false)
    });
    r.register("SquaredL2DistanceGradient", DeviceType::Cuda, "", |i| {
        create_sql2(i, true)
    });
    r.register("LayerNorm", DeviceType::Cuda, "", |i| {
        create_layer_norm(i, false)
    });
    r.register("LayerNormGradient", DeviceType::Cuda, "", |i| {
        create_layer_norm(i, true)
    });
    r.register("SpatialBN", DeviceType::Cuda, "", |i| create_bn(i, false));
    r.register("SpatialBNGradient", DeviceType::Cuda, "", |i| {
        create_bn(i, true)
    });
    r.register("Dropout", DeviceType::Cuda, "", create_dropout);
    r.register("DropoutGrad", DeviceType::Cuda, "", create_dropout_grad);
}

/// A flag as a kernel argument.
fn flag(b: bool) -> i32 {
    i32::from(b)
}

/// (N, D) of `dims` flattened at `axis` (as the CPU's Softmax and SoftmaxWithLoss).
fn flat2(dims: &[usize], axis: i64) -> Result<(usize, usize)> {
    let nd = dims.len() as i64;
    let a = if axis < 0 { axis + nd } else { axis };
    if a < 0 || a >= nd.max(1) {
        bail!(BadArgument: "axis_index < ndims: axis {axis} for a tensor of {nd} dimensions");
    }
    let a = a as usize;
    Ok((dims[..a].iter().product(), dims[a..].iter().product()))
}

/// (N, D) of the cross-entropy ops: a vector is one row, else rows along the first dim.
fn nd_of(dims: &[usize]) -> (usize, usize) {
    let numel: usize = dims.iter().product();
    if dims.len() == 1 {
        (1, numel)
    } else {
        let n = dims.first().copied().unwrap_or(1);
        (n, numel.checked_div(n).unwrap_or(0))
    }
}

/// The labels of input `i` checked as the CPU checks them (N values in [0, D)), on the device
/// as int64 indices.
fn labels(
    ctx: &OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    i: usize,
    n: usize,
    d: usize,
) -> Result<(Tensor, u64)> {
    let v = ctx.input(i)?.to_host()?.to_i64_vec()?;
    if v.len() != n {
        bail!(ShapeMismatch: "label has {} values, expected N = {n}", v.len());
    }
    if let Some(l) = v
        .iter()
        .find(|&&l| usize::try_from(l).map_or(true, |u| u >= d))
    {
        bail!(
            BadArgument: "Label seems to be outside of supported range. Supported labels are in \
             range [0,{d}), got {l}"
        );
    }
    let t = dev.upload(&Tensor::from_vec(&[n], v)?)?;
    let (p, _) = raw(&t)?;
    Ok((t, p))
}

// ---- Softmax ------------------------------------------------------------------------------

fn create_softmax(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let name = if gradient {
        "softmax_grad_f32"
    } else {
        "softmax_f32"
    };
    let f = init_device(init)?.function("nn", name)?;
    let axis = init.args.int("axis", 1)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let (y, yp) = new_tensor(&dev, DataType::Float, x.dims())?;
        if gradient {
            let dy = input_f32(ctx, &dev, 1)?;
            ensure!(x.dims() == dy.dims(), ShapeMismatch: "Y and dY must have the same shape");
            let (n, d) = flat2(x.dims(), axis)?;
            if n * d > 0 {
                cuda_launch!(dev, f, rows(n, RT); x.ptr, dy.ptr, yp, n64(n), n64(d))?;
            }
        } else {
            let (n, d) = flat2(x.dims(), axis)?;
            if n * d > 0 {
                cuda_launch!(dev, f, rows(n, RT); x.ptr, yp, n64(n), n64(d))?;
            }
        }
        set_output(ctx, 0, y)
    })))
}

// ---- SoftmaxWithLoss ----------------------------------------------------------------------

/// The arguments both SoftmaxWithLoss ops read.
fn swl_args(init: &OpInit<'_>) -> Result<(f32, bool, i64)> {
    if init.args.bool("spatial", false)? {
        bail!(op = init, NotImplemented: "SoftmaxWithLoss with spatial=1 is not supported");
    }
    Ok((
        init.args.float("scale", 1.0)?,
        init.args.bool("label_prob", false)?,
        init.args.int("axis", 1)?,
    ))
}

/// The targets of a SoftmaxWithLoss: (kept tensor, index pointer, probability pointer).
fn swl_targets(
    ctx: &OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    label_prob: bool,
    n: usize,
    d: usize,
) -> Result<(Tensor, u64, u64)> {
    if label_prob {
        let l = input_f32(ctx, dev, 1)?;
        if l.numel() != n * d {
            bail!(ShapeMismatch: "label_prob labels must have the shape of X");
        }
        Ok((l.t, 0, l.ptr))
    } else {
        let (t, p) = labels(ctx, dev, 1, n, d)?;
        Ok((t, p, 0))
    }
}

/// The weights input (index 2) when present, with N values.
fn swl_weights(
    ctx: &OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    has_w: bool,
    n: usize,
) -> Result<Option<DevIn>> {
    if !has_w {
        return Ok(None);
    }
    let w = input_f32(ctx, dev, 2)?;
    if w.numel() != n {
        bail!(ShapeMismatch: "weights have {} values, expected {n}", w.numel());
    }
    Ok(Some(w))
}

fn create_swl(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let (scale, label_prob, axis) = swl_args(init)?;
    let dev0 = init_device(init)?;
    let softmax = dev0.function("nn", "softmax_f32")?;
    let loss_idx = dev0.function("nn", "swl_loss_idx_f32")?;
    let loss_prob = dev0.function("nn", "swl_loss_prob_f32")?;
    let finish = dev0.function("nn", "swl_finish_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let has_w = ctx.num_inputs() == 3;
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let (n, d) = flat2(x.dims(), axis)?;
        let w = swl_weights(ctx, &dev, has_w, n)?;
        let wp = w.as_ref().map_or(0, |w| w.ptr);
        let (_targets, idx, probs) = swl_targets(ctx, &dev, label_prob, n, d)?;
        let (p, pp) = new_tensor(&dev, DataType::Float, x.dims())?;
        let (loss, lossp) = new_tensor(&dev, DataType::Float, &[])?;
        let (_rl, rlp) = new_tensor(&dev, DataType::Float, &[n])?;
        if n * d > 0 {
            cuda_launch!(dev, softmax, rows(n, RT); x.ptr, pp, n64(n), n64(d))?;
        }
        if n > 0 {
            if label_prob {
                cuda_launch!(dev, loss_prob, rows(n, RT);
                    pp, probs, wp, rlp, n64(n), n64(d), flag(has_w))?;
            } else {
                cuda_launch!(dev, loss_idx, grid(n);
                    pp, idx, wp, rlp, n64(n), n64(d), flag(has_w))?;
            }
        }
        cuda_launch!(dev, finish, rows(1, RT); rlp, wp, lossp, n64(n), scale, flag(has_w))?;
        set_output(ctx, 0, p)?;
        set_output(ctx, 1, loss)
    })))
}

fn create_swl_grad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let (scale, label_prob, axis) = swl_args(init)?;
    let dev0 = init_device(init)?;
    let coef_f = dev0.function("nn", "swl_coef_f32")?;
    let grad_f = dev0.function("nn", "swl_grad_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let has_w = ctx.num_inputs() == 5;
        let dev = device(ctx)?;
        let xdims = ctx.input(0)?.dims().to_vec();
        let (n, d) = flat2(&xdims, axis)?;
        let w = swl_weights(ctx, &dev, has_w, n)?;
        let wp = w.as_ref().map_or(0, |w| w.ptr);
        let (_targets, idx, probs) = swl_targets(ctx, &dev, label_prob, n, d)?;
        let p_i = if has_w { 3 } else { 2 };
        let p = input_f32(ctx, &dev, p_i)?;
        if p.numel() != n * d {
            bail!(ShapeMismatch: "P has {} values, expected {}", p.numel(), n * d);
        }
        // dLoss: read on the device when it is float32, else converted on the host.
        let dl_t = ctx.input(p_i + 1)?;
        let (_dl, dl_ptr, dl_host, dl_dev) = if dl_t.dtype() == DataType::Float {
            let g = input_f32(ctx, &dev, p_i + 1)?;
            if g.numel() == 0 {
                bail!(InvalidArgument: "index 0 out of range");
            }
            let ptr = g.ptr;
            (Some(g), ptr, 0.0f32, true)
        } else {
            let v = dl_t.to_host()?.get_f64(0)? as f32;
            (None, 0, v, false)
        };
        let (dx, dxp) = new_tensor(&dev, DataType::Float, &xdims)?;
        let (_coef, coefp) = new_tensor(&dev, DataType::Float, &[1])?;
        cuda_launch!(dev, coef_f, rows(1, RT);
            wp, dl_ptr, coefp, n64(n), scale, dl_host, flag(has_w), flag(dl_dev))?;
        if n * d > 0 {
            cuda_launch!(dev, grad_f, grid(n * d);
                p.ptr, idx, probs, wp, coefp, dxp, n64(n), n64(d), flag(has_w), flag(label_prob))?;
        }
        set_output(ctx, 0, dx)
    })))
}

// ---- LabelCrossEntropy, CrossEntropy ------------------------------------------------------

fn create_label_xent(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let name = if gradient {
        "label_xent_grad_f32"
    } else {
        "label_xent_f32"
    };
    let f = init_device(init)?.function("nn", name)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let (n, d) = nd_of(x.dims());
        let (_lab, idx) = labels(ctx, &dev, 1, n, d)?;
        if gradient {
            let dy = input_f32(ctx, &dev, 2)?;
            if dy.numel() != n {
                bail!(ShapeMismatch: "dY has {} values, expected {n}", dy.numel());
            }
            let (dx, dxp) = new_tensor(&dev, DataType::Float, x.dims())?;
            if n * d > 0 {
                cuda_launch!(dev, f, grid(n * d); x.ptr, idx, dy.ptr, dxp, n64(n), n64(d))?;
            }
            set_output(ctx, 0, dx)
        } else {
            let (y, yp) = new_tensor(&dev, DataType::Float, &[n])?;
            if n > 0 {
                cuda_launch!(dev, f, grid(n); x.ptr, idx, yp, n64(n), n64(d))?;
            }
            set_output(ctx, 0, y)
        }
    })))
}

fn create_xent(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let name = if gradient {
        "xent_grad_f32"
    } else {
        "xent_f32"
    };
    let f = init_device(init)?.function("nn", name)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let (xd, ld) = (ctx.input(0)?.dims().to_vec(), ctx.input(1)?.dims().to_vec());
        if xd != ld {
            bail!(ShapeMismatch: "label {ld:?} must have the shape of X {xd:?}");
        }
        let (n, d) = nd_of(&xd);
        let x = input_f32(ctx, &dev, 0)?;
        let t = input_f32(ctx, &dev, 1)?;
        if gradient {
            let dy = input_f32(ctx, &dev, 2)?;
            if dy.numel() != n {
                bail!(ShapeMismatch: "dY has {} values, expected {n}", dy.numel());
            }
            let (dx, dxp) = new_tensor(&dev, DataType::Float, &xd)?;
            if n * d > 0 {
                cuda_launch!(dev, f, grid(n * d); x.ptr, t.ptr, dy.ptr, dxp, n64(n), n64(d))?;
            }
            set_output(ctx, 0, dx)
        } else {
            let (y, yp) = new_tensor(&dev, DataType::Float, &[n])?;
            if n > 0 {
                cuda_launch!(dev, f, rows(n, RT); x.ptr, t.ptr, yp, n64(n), n64(d))?;
            }
            set_output(ctx, 0, y)
        }
    })))
}

// ---- SigmoidCrossEntropyWithLogits --------------------------------------------------------

/// Checks that the logits (input `li`) and targets (input `li + 1`) share a shape.
fn same_shape(ctx: &OpContext<'_>, li: usize) -> Result<()> {
    let (l, t) = (ctx.input(li)?, ctx.input(li + 1)?);
    if l.dims() != t.dims() {
        bail!(
            ShapeMismatch: "logits '{}' {:?} and targets '{}' {:?} must have the same shape",
            ctx.input_name(li),
            l.dims(),
            ctx.input_name(li + 1),
            t.dims()
        );
    }
    Ok(())
}

fn create_sigmoid_xent(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let log_d = init.args.bool("log_D_trick", false)?;
    let unjoined = init.args.bool("unjoined_lr_loss", false)?;
    if log_d && unjoined && !gradient {
        bail!(
            op = init,
            BadArgument: "log_D_trick_ and unjoined_lr_loss_ cannot be set as True simultaneously"
        );
    }
    // 0 plain, 1 log_D_trick, 2 unjoined_lr_loss (which wins in the gradient).
    let kind: i32 = if unjoined {
        2
    } else if log_d {
        1
    } else {
        0
    };
    let name = if gradient {
        "sigmoid_xent_grad_f32"
    } else {
        "sigmoid_xent_f32"
    };
    let f = init_device(init)?.function("nn", name)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let li = usize::from(gradient);
        same_shape(ctx, li)?;
        let dims = ctx.input(li)?.dims().to_vec();
        let (outer, inner) = match dims.split_last() {
            Some((&inner, lead)) => (lead.iter().product::<usize>(), inner),
            None => (1, 1),
        };
        if gradient {
            let g = input_f32(ctx, &dev, 0)?;
            if g.numel() != outer {
                bail!(
                    ShapeMismatch: "the output gradient has {} values, expected one per example \
                     ({outer})",
                    g.numel()
                );
            }
            let x = input_f32(ctx, &dev, 1)?;
            let t = input_f32(ctx, &dev, 2)?;
            let (dx, dxp) = new_tensor(&dev, DataType::Float, &dims)?;
            if outer * inner > 0 {
                cuda_launch!(dev, f, grid(outer * inner);
                    g.ptr, x.ptr, t.ptr, dxp, n64(outer), n64(inner), kind)?;
            }
            set_output(ctx, 0, dx)
        } else {
            let out_dims = dims
                .split_last()
                .map_or(Vec::new(), |(_, lead)| lead.to_vec());
            let x = input_f32(ctx, &dev, 0)?;
            let t = input_f32(ctx, &dev, 1)?;
            let (y, yp) = new_tensor(&dev, DataType::Float, &out_dims)?;
            if outer > 0 {
                cuda_launch!(dev, f, rows(outer, RT);
                    x.ptr, t.ptr, yp, n64(outer), n64(inner), kind)?;
            }
            set_output(ctx, 0, y)
        }
    })))
}

// ---- SquaredL2Distance --------------------------------------------------------------------

fn create_sql2(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let name = if gradient {
        "sql2_grad_f32"
    } else {
        "sql2_f32"
    };
    let f = init_device(init)?.function("nn", name)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let (xd, yd) = (ctx.input(0)?.dims().to_vec(), ctx.input(1)?.dims().to_vec());
        if xd != yd {
            bail!(ShapeMismatch: "X {xd:?} and Y {yd:?} must have the same shape");
        }
        let n = xd.first().copied().unwrap_or(1);
        let total: usize = xd.iter().product();
        let d = total.checked_div(n).unwrap_or(0);
        if gradient {
            let dz = input_f32(ctx, &dev, 2)?;
            if dz.numel() != n {
                bail!(ShapeMismatch: "dZ must hold {n} values, got {}", dz.numel());
            }
            let x = input_f32(ctx, &dev, 0)?;
            let y = input_f32(ctx, &dev, 1)?;
            let (dx, dxp) = new_tensor(&dev, DataType::Float, &xd)?;
            let (dy, dyp) = new_tensor(&dev, DataType::Float, &xd)?;
            if n * d > 0 {
                cuda_launch!(dev, f, grid(n * d); x.ptr, y.ptr, dz.ptr, dxp, dyp, n64(n), n64(d))?;
            }
            set_output(ctx, 0, dx)?;
            set_output(ctx, 1, dy)
        } else {
            let x = input_f32(ctx, &dev, 0)?;
            let y = input_f32(ctx, &dev, 1)?;
            let (z, zp) = new_tensor(&dev, DataType::Float, &[n])?;
            if n > 0 {
                cuda_launch!(dev, f, rows(n, RT); x.ptr, y.ptr, zp, n64(n), n64(d))?;
            }
            set_output(ctx, 0, z)
        }
    })))
}

// ---- LayerNorm ----------------------------------------------------------------------------

/// (rows, cols, stat dims) of X's dims split at `axis` (as the CPU's LayerNorm).
fn ln_split(dims: &[usize], axis: i64) -> Result<(usize, usize, Vec<usize>)> {
    let nd = dims.len() as i64;
    let a = if axis < 0 { axis + nd } else { axis };
    if a < 0 || a > nd {
        bail!(BadArgument: "axis {axis} out of range for {dims:?}");
    }
    let a = a as usize;
    let mut stat = dims[..a].to_vec();
    stat.push(1);
    Ok((dims[..a].iter().product(), dims[a..].iter().product(), stat))
}

fn create_layer_norm(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let axis = init.args.int("axis", 1)?;
    let eps = init.args.float("epsilon", 1e-5)?;
    let affine = init.args.bool("elementwise_affine", false)?;
    let dev0 = init_device(init)?;
    if gradient {
        let f = dev0.function("nn", "layer_norm_grad_f32")?;
        let fp = dev0.function("nn", "layer_norm_param_grad_f32")?;
        return Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            // Inputs (dY, Y, mean, std, X[, gamma]); outputs (dX[, dgamma, dbeta]).
            let dev = device(ctx)?;
            let dims = ctx.input(4)?.dims().to_vec();
            let (nrows, cols, _) = ln_split(&dims, axis)?;
            let gamma = if affine {
                let g = input_f32(ctx, &dev, 5)?;
                if g.numel() != cols {
                    bail!(ShapeMismatch: "gamma and beta must hold {cols} values");
                }
                Some(g)
            } else {
                None
            };
            let gp = gamma.as_ref().map_or(0, |g| g.ptr);
            let dy = input_f32(ctx, &dev, 0)?;
            let x = input_f32(ctx, &dev, 4)?;
            let mean = input_f32(ctx, &dev, 2)?;
            let sd = input_f32(ctx, &dev, 3)?;
            if dy.numel() != x.numel() || mean.numel() != nrows || sd.numel() != nrows {
                bail!(ShapeMismatch: "LayerNormGradient: inputs disagree on shapes");
            }
            let (dx, dxp) = new_tensor(&dev, DataType::Float, &dims)?;
            if nrows * cols > 0 {
                cuda_launch!(dev, f, rows(nrows, RT);
                    dy.ptr, x.ptr, mean.ptr, sd.ptr, gp, dxp, n64(nrows), n64(cols), flag(affine))?;
            }
            set_output(ctx, 0, dx)?;
            if let Some(g) = gamma.filter(|_| ctx.num_outputs() > 2) {
                let (dg, dgp) = new_tensor(&dev, DataType::Float, g.dims())?;
                let (db, dbp) = new_tensor(&dev, DataType::Float, g.dims())?;
                if cols > 0 {
                    cuda_launch!(dev, fp, grid(cols);
                        dy.ptr, x.ptr, mean.ptr, sd.ptr, dgp, dbp, n64(nrows), n64(cols))?;
                }
                set_output(ctx, 1, dg)?;
                set_output(ctx, 2, db)?;
            }
            Ok(())
        })));
    }
    let f = dev0.function("nn", "layer_norm_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let dims = ctx.input(0)?.dims().to_vec();
        let (nrows, cols, stat) = ln_split(&dims, axis)?;
        let params = if affine {
            let g = input_f32(ctx, &dev, 1)?;
            let b = input_f32(ctx, &dev, 2)?;
            if g.numel() != cols || b.numel() != cols {
                bail!(ShapeMismatch: "gamma and beta must hold {cols} values");
            }
            Some((g, b))
        } else {
            None
        };
        let (gp, bp) = params.as_ref().map_or((0, 0), |(g, b)| (g.ptr, b.ptr));
        let x = input_f32(ctx, &dev, 0)?;
        let (y, yp) = new_tensor(&dev, DataType::Float, &dims)?;
        let (mean, meanp) = new_tensor(&dev, DataType::Float, &stat)?;
        let (sd, sdp) = new_tensor(&dev, DataType::Float, &stat)?;
        if nrows > 0 {
            cuda_launch!(dev, f, rows(nrows, RT);
                x.ptr, gp, bp, yp, meanp, sdp, n64(nrows), n64(cols), eps, flag(affine))?;
        }
        set_output(ctx, 0, y)?;
        if ctx.num_outputs() > 1 {
            set_output(ctx, 1, mean)?;
        }
        if ctx.num_outputs() > 2 {
            set_output(ctx, 2, sd)?;
        }
        Ok(())
    })))
}

// ---- SpatialBN ----------------------------------------------------------------------------

/// (n, c, inner) of X's dims (as the CPU's normalisation ops).
fn layout(dims: &[usize], nhwc: bool) -> Result<(usize, usize, usize)> {
    if dims.len() < 2 {
        bail!(ShapeMismatch: "expected at least 2 dimensions, got {dims:?}");
    }
    let n = dims[0];
    let c = if nhwc { dims[dims.len() - 1] } else { dims[1] };
    let total: usize = dims.iter().product();
    Ok((n, c, total.checked_div(n * c).unwrap_or(0)))
}

/// Per-channel input `i` (float32, C values).
fn channel(ctx: &OpContext<'_>, dev: &Arc<DeviceCtx>, i: usize, c: usize) -> Result<DevIn> {
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

fn create_bn(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let num_batches = init.args.usize("num_batches", 1)?.max(1);
    let eps = init.args.float("epsilon", 1e-5)?;
    let momentum = init.args.float("momentum", 0.9)?;
    let is_test = init.args.bool("is_test", false)?;
    let nhwc = match init.args.string("order", "NCHW")?.as_str() {
        "NCHW" => false,
        "NHWC" => true,
        other => return Err(err!(op = init, BadArgument: "Unknown storage order: {other}")),
    };
    if num_batches > 1 {
        // Statistics combined across batches (ChannelStats inputs): the CPU kernel.
        return crate::cuda::fallback(init);
    }
    let dev0 = init_device(init)?;
    if gradient {
        let f = dev0.function("nn", "bn_grad_f32")?;
        return Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            // Inputs (X, scale, dY, saved_mean, saved_inv_std); outputs (dX, dscale, dbias).
            let dev = device(ctx)?;
            let dims = ctx.input(0)?.dims().to_vec();
            let (n, c, inner) = layout(&dims, nhwc)?;
            let scale = channel(ctx, &dev, 1, c)?;
            let mean = channel(ctx, &dev, 3, c)?;
            let inv = channel(ctx, &dev, 4, c)?;
            let x = input_f32(ctx, &dev, 0)?;
            let dy = input_f32(ctx, &dev, 2)?;
            if dy.numel() != x.numel() {
                bail!(ShapeMismatch: "dY must have the shape of X");
            }
            let m = (n * inner) as f32;
            let (dx, dxp) = new_tensor(&dev, DataType::Float, &dims)?;
            let (ds, dsp) = new_tensor(&dev, DataType::Float, &[c])?;
            let (db, dbp) = new_tensor(&dev, DataType::Float, &[c])?;
            if c > 0 {
                cuda_launch!(dev, f, rows(c, RT);
                    x.ptr, scale.ptr, dy.ptr, mean.ptr, inv.ptr, dxp, dsp, dbp,
                    n64(n), n64(c), n64(inner), m, flag(nhwc))?;
            }
            set_output(ctx, 0, dx)?;
            set_output(ctx, 1, ds)?;
            set_output(ctx, 2, db)
        })));
    }
    let infer = dev0.function("nn", "bn_infer_f32")?;
    let train = dev0.function("nn", "bn_train_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        // Inputs (X, scale, bias, mean, var); training outputs (Y, running_mean, running_var,
        // saved_mean, saved_inv_std), the running statistics in place.
        let dev = device(ctx)?;
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, nhwc)?;
        let scale = channel(ctx, &dev, 1, c)?;
        let bias = channel(ctx, &dev, 2, c)?;
        let x = input_f32(ctx, &dev, 0)?;
        let total = x.numel();
        let (y, yp) = new_tensor(&dev, DataType::Float, &dims)?;
        if is_test {
            let mean = channel(ctx, &dev, 3, c)?;
            let var = channel(ctx, &dev, 4, c)?;
            if total > 0 {
                cuda_launch!(dev, infer, grid(total);
                    x.ptr, scale.ptr, bias.ptr, mean.ptr, var.ptr, yp,
                    n64(total), n64(c), n64(inner), eps, flag(nhwc))?;
            }
            return set_output(ctx, 0, y);
        }
        if ctx.num_outputs() < 5 {
            bail!(Schema: "SpatialBN in training mode needs 5 outputs");
        }
        channel(ctx, &dev, 3, c)?;
        channel(ctx, &dev, 4, c)?;
        let m = (n * inner) as f32;
        let unbias = if m > 1.0 {
            m / (m - 1.0)
        } else {
            f32::INFINITY
        };
        let rm = update_in_place(ctx, &dev, 3, 1)?;
        let rv = update_in_place(ctx, &dev, 4, 2)?;
        let (sm, smp) = new_tensor(&dev, DataType::Float, &[c])?;
        let (si, sip) = new_tensor(&dev, DataType::Float, &[c])?;
        if n * inner == 0 {
            // An empty batch, as on the CPU: the running statistics stay as they are, and the
            // saved mean and inverse std are zeros (no statistic was measured).
            dev.fill_zero(smp, c)?;
            dev.fill_zero(sip, c)?;
        } else if c > 0 {
            cuda_launch!(dev, train, rows(c, RT);
                x.ptr, scale.ptr, bias.ptr, yp, rm, rv, smp, sip,
                n64(n), n64(c), n64(inner), m, eps, momentum, unbias, flag(nhwc))?;
        }
        set_output(ctx, 0, y)?;
        set_output(ctx, 3, sm)?;
        set_output(ctx, 4, si)
    })))
}

// ---- Dropout ------------------------------------------------------------------------------

/// 1 / (1 - ratio), or 0 when everything is dropped.
fn dropout_scale(ratio: f32) -> f32 {
    if ratio < 1.0 {
        1.0 / (1.0 - ratio)
    } else {
        0.0
    }
}

/// A 64-bit mix (splitmix64's finaliser) for per-run seeds.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn create_dropout(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let ratio = init.args.float("ratio", 0.5)?;
    if !(0.0..1.0).contains(&ratio) && ratio != 1.0 {
        bail!(op = init, BadArgument: "ratio must be in [0, 1], got {ratio}");
    }
    let is_test = init.args.bool("is_test", false)?;
    let f = init_device(init)?.function("nn", "dropout_f32")?;
    // The op's seed when given, else a fresh one; each run draws a new stream from it.
    let base = match init.random_seed() {
        Some(s) => u64::from(s),
        None => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            static NEXT: AtomicU64 = AtomicU64::new(0x5EED_D80B);
            mix(t ^ NEXT.fetch_add(0x9E37_79B9, Ordering::Relaxed))
        }
    };
    let mut run: u64 = 0;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        if is_test {
            if !ctx.is_inplace(0, 0) {
                let y = dev.duplicate(ctx.input(0)?)?;
                set_output(ctx, 0, y)?;
            }
            return Ok(());
        }
        let x = input_f32(ctx, &dev, 0)?;
        let nel = x.numel();
        let seed = mix(base.wrapping_add(run.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        run = run.wrapping_add(1);
        let has_mask = ctx.num_outputs() > 1;
        let (y, yp) = new_tensor(&dev, DataType::Float, x.dims())?;
        let (mask, maskp) = new_tensor(&dev, DataType::Bool, x.dims())?;
        if nel > 0 {
            cuda_launch!(dev, f, grid(nel);
                x.ptr, yp, maskp, n64(nel), ratio, dropout_scale(ratio), seed, flag(has_mask))?;
        }
        if has_mask {
            set_output(ctx, 1, mask)?;
        }
        set_output(ctx, 0, y)
    })))
}

fn create_dropout_grad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let ratio = init.args.float("ratio", 0.5)?;
    let is_test = init.args.bool("is_test", false)?;
    let f = init_device(init)?.function("nn", "dropout_grad_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let dy = input_f32(ctx, &dev, 0)?;
        let (dx, dxp) = new_tensor(&dev, DataType::Float, dy.dims())?;
        if is_test {
            let (_, len) = raw(&dy.t)?;
            dev.copy_d2d(dxp, dy.ptr, len)?;
            return set_output(ctx, 0, dx);
        }
        let mask = input_of(ctx, &dev, 1, DataType::Bool)?;
        if mask.numel() != dy.numel() {
            bail!(ShapeMismatch: "mask must have the shape of dY");
        }
        let nel = dy.numel();
        if nel > 0 {
            cuda_launch!(dev, f, grid(nel); dy.ptr, mask.ptr, dxp, n64(nel), dropout_scale(ratio))?;
        }
        set_output(ctx, 0, dx)
    })))
}
