//! Parameterised elementwise ops and their gradients: LeakyRelu, Clip, PRelu, Pow (exponent
//! argument or a second, broadcast input), SumReduceLike, and SoftsignGradient.

use super::broadcast::{for_each_index, legacy_sizes};
use super::elementwise::{binary, input_dtype, input_meta, unary};
use super::math::BroadcastArgs;
use crate::dispatch;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("LeakyRelu", |i| {
        let alpha = i.args.float("alpha", 0.01)?;
        float_unary(move |x| if x >= 0.0 { x } else { x * alpha })
    });
    r.cpu("LeakyReluGradient", |i| {
        let alpha = i.args.float("alpha", 0.01)?;
        grad_y_dy(move |y, dy| if y > 0.0 { dy } else { dy * alpha })
    });
    r.cpu("Clip", |i| {
        let lo = i.args.float("min", f32::MIN)?;
        let hi = i.args.float("max", f32::MAX)?;
        float_unary(move |x| x.max(lo).min(hi))
    });
    r.cpu("ClipGradient", |i| {
        let lo = i.args.float("min", f32::MIN)?;
        let hi = i.args.float("max", f32::MAX)?;
        grad_y_dy(move |y, dy| if y <= lo || y >= hi { 0.0 } else { dy })
    });
    r.cpu("SoftsignGradient", |_| {
        // Inputs (X, dY): dX = dY / (1 + |X|)^2.
        grad_y_dy(|x, dy| {
            let d = 1.0 + x.abs();
            dy / (d * d)
        })
    });
    r.cpu("Pow", create_pow);
    r.cpu("PRelu", |i| {
        let nhwc = i.args.string("order", "NCHW")? == "NHWC";
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            prelu(ctx, nhwc, false)
        })))
    });
    r.cpu("PReluGradient", |i| {
        let nhwc = i.args.string("order", "NCHW")? == "NHWC";
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            prelu(ctx, nhwc, true)
        })))
    });
    r.cpu("SumReduceLike", create_sum_reduce_like);
}

fn float_unary(f: impl Fn(f32) -> f32 + Send + Copy + 'static) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        unary::<f32, f32>(ctx, f)
    })))
}

/// `dX = f(Y, dY)` from inputs (Y, dY) of one shape.
fn grad_y_dy(f: impl Fn(f32, f32) -> f32 + Send + Copy + 'static) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (yd, _) = input_meta(ctx, 0)?;
        let (gd, _) = input_meta(ctx, 1)?;
        if yd != gd {
            bail!(op = ctx, ShapeMismatch: "Y {yd:?} and dY {gd:?} must have the same shape");
        }
        binary::<f32, f32, f32>(ctx, &yd, &gd, &yd, &yd, f)
    })))
}

fn create_pow(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    if init.num_inputs() == 1 {
        if !init.args.has("exponent") {
            bail!(op = init, BadArgument: "Pow needs an exponent argument or a second input");
        }
        let e = init.args.float("exponent", 1.0)?;
        return Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            let dt = input_dtype(ctx, 0)?;
            dispatch!(dt, [Float => f32, Double => f64], |T| unary::<T, T>(ctx, |x: T| x.powf(e as T)))
        })));
    }
    if init.args.has("exponent") {
        bail!(
            op = init,
            BadArgument: "Only one of the exponent argument and a second input may be given"
        );
    }
    let bc = BroadcastArgs::new(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (a, _) = input_meta(ctx, 0)?;
        let (b, _) = input_meta(ctx, 1)?;
        if !bc.legacy && a != b {
            bail!(
                op = ctx,
                ShapeMismatch: "Dimension mismatch - did you forget to set broadcast=1? {a:?} vs \
                 {b:?}"
            );
        }
        let (la, lb, lc, c) = bc.shapes(ctx)?;
        binary::<f32, f32, f32>(ctx, &la, &lb, &lc, &c, f32::powf)
    })))
}

fn create_sum_reduce_like(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axis = init.args.int("axis", -1)?;
    let axis_str = init.args.string("axis_str", "")?;
    let order = init.args.string("order", "NCHW")?;
    let axis = if axis == -1 && !axis_str.is_empty() {
        order.find(&axis_str).ok_or_else(|| {
            err!(
                op = init,
                BadArgument: "Unrecognizable axis string {axis_str} from order string {order}"
            )
        })? as i64
    } else {
        axis
    };
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (ins, mut outs) = ctx.split();
        let a = ins.tensor(0)?;
        let b_dims = ins.tensor(1)?.dims().to_vec();
        let xs = a.as_slice::<f32>()?;
        let nb: usize = b_dims.iter().product();
        let mut acc = vec![0f32; nb];
        if nb == 1 {
            acc[0] = xs.iter().sum();
        } else {
            let (pre, n, post) = legacy_sizes(a.dims(), &b_dims, axis)?;
            for_each_index(&[pre, n, post], &[n, 1], &[pre, n, post], |i, _, ib| {
                acc[ib] += xs[i]
            });
        }
        outs.tensor(0)?.ensure::<f32>(&b_dims).copy_from_slice(&acc);
        Ok(())
    })))
}

/// Channel of flat index `k` for PRelu's per-channel slopes.
fn channel_of(k: usize, dims: &[usize], nhwc: bool) -> usize {
    if dims.len() < 2 {
        return 0;
    }
    if nhwc {
        k % dims[dims.len() - 1]
    } else {
        let inner: usize = dims[2..].iter().product();
        (k / inner.max(1)) % dims[1]
    }
}

/// PRelu (X, slope) -> Y; gradient (Y, dY, X, slope) -> (dX, dslope).
fn prelu(ctx: &mut OpContext<'_>, nhwc: bool, gradient: bool) -> Result<()> {
    let xi = if gradient { 2 } else { 0 };
    let dims = ctx.input(xi)?.dims().to_vec();
    let slope = ctx.input(xi + 1)?.as_slice::<f32>()?.to_vec();
    let channels = if dims.len() < 2 {
        1
    } else if nhwc {
        dims[dims.len() - 1]
    } else {
        dims[1]
    };
    let shared = slope.len() == 1;
    if !shared && slope.len() != channels {
        bail!(
            op = ctx,
            ShapeMismatch: "slope has {} values, expected 1 or C = {channels}",
            slope.len()
        );
    }
    let x = ctx.input(xi)?.as_slice::<f32>()?.to_vec();
    let w = |k: usize| {
        if shared {
            slope[0]
        } else {
            slope[channel_of(k, &dims, nhwc)]
        }
    };
    if !gradient {
        let y = ctx.output(0)?.ensure::<f32>(&dims);
        for (k, (o, &v)) in y.iter_mut().zip(&x).enumerate() {
            *o = if v > 0.0 { v } else { v * w(k) };
        }
        return Ok(());
    }
    let g = ctx.input(1)?.as_slice::<f32>()?.to_vec();
    if g.len() != x.len() {
        bail!(op = ctx, ShapeMismatch: "dY must have the shape of X");
    }
    let mut ds = vec![0f32; slope.len()];
    {
        let dx = ctx.output(0)?.ensure::<f32>(&dims);
        for k in 0..x.len() {
            if x[k] > 0.0 {
                dx[k] = g[k];
            } else {
                dx[k] = g[k] * w(k);
                let c = if shared {
                    0
                } else {
                    channel_of(k, &dims, nhwc)
                };
                ds[c] += g[k] * x[k];
            }
        }
    }
    let sd = ctx.input(3)?.dims().to_vec();
    ctx.output(1)?.ensure::<f32>(&sd).copy_from_slice(&ds);
    Ok(())
}
