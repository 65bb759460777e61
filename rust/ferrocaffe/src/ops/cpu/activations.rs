//! Parameterised elementwise ops and their gradients: LeakyRelu, Clip, PRelu, Pow (exponent
//! argument or a second, broadcast input), SumReduceLike, and SoftsignGradient.

use super::broadcast::{for_each_index, legacy_sizes};
use super::elementwise::{binary, input_dtype, input_meta, unary};
use super::math::BroadcastArgs;
use super::par::{copy_if_inplace, for_each_chunk};
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

fn float_unary(f: impl Fn(f32) -> f32 + Send + Sync + Copy + 'static) -> Result<Box<dyn Operator>> {
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
        let dt = input_dtype(ctx, 0)?;
        dispatch!(dt, [Float => f32, Double => f64], |T| {
            let (ins, mut outs) = ctx.split();
            let a = ins.tensor(0)?;
            let b_dims = ins.tensor(1)?.dims().to_vec();
            let xs = a.as_slice::<T>()?;
            let nb: usize = b_dims.iter().product();
            let mut acc: Vec<T> = vec![0.0; nb];
            if nb == 1 {
                acc[0] = xs.iter().sum();
            } else {
                let (pre, n, post) = legacy_sizes(a.dims(), &b_dims, axis)?;
                for_each_index(&[pre, n, post], &[n, 1], &[pre, n, post], |i, _, ib| {
                    acc[ib] += xs[i]
                });
            }
            outs.tensor(0)?.ensure::<T>(&b_dims).copy_from_slice(&acc);
            Ok(())
        })
    })))
}

/// How PRelu's slopes map onto X: one slope for everything, one per NCHW plane of `inner`
/// values (channel = plane % C), or one per channel innermost (NHWC, C channels).
#[derive(Clone, Copy)]
enum Slopes {
    Shared,
    Planes { c: usize, inner: usize },
    Pixels { c: usize },
}

/// `f(offset, slopes, xs, out)` of [`prelu_runs`].
type PreluRun<'a> = dyn Fn(usize, &[f32], &[f32], &mut [f32]) + Sync + 'a;

/// Calls `f(offset, slopes, xs, out)` on runs `xs = x[offset..]` of X that share one layout
/// of slopes: `slopes` holds one value (applied to the whole run) or `xs.len()` values; `out`
/// is the matching part of the output (in parallel parts).
fn prelu_runs(x: &[f32], out: &mut [f32], slope: &[f32], map: Slopes, f: &PreluRun<'_>) {
    match map {
        Slopes::Shared => for_each_chunk(out, 1 << 12, 1 << 13, &|first, part| {
            let k = first << 12;
            f(k, &slope[..1], &x[k..k + part.len()], part)
        }),
        Slopes::Planes { c, inner } => {
            for_each_chunk(out, inner, inner.saturating_mul(2), &|first, part| {
                for (k, op) in part.chunks_mut(inner).enumerate() {
                    let off = (first + k) * inner;
                    let ch = (first + k) % c;
                    f(off, &slope[ch..ch + 1], &x[off..off + op.len()], op);
                }
            })
        }
        Slopes::Pixels { c } => for_each_chunk(out, c, c.saturating_mul(2), &|first, part| {
            for (k, op) in part.chunks_mut(c).enumerate() {
                let off = (first + k) * c;
                f(off, slope, &x[off..off + op.len()], op);
            }
        }),
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
    let map = if shared || dims.len() < 2 {
        Slopes::Shared
    } else if nhwc {
        Slopes::Pixels { c: channels }
    } else {
        Slopes::Planes {
            c: channels,
            inner: dims[2..].iter().product(),
        }
    };
    ctx.input(xi)?.as_slice::<f32>()?;
    let copy = copy_if_inplace(ctx, xi)?;
    if !gradient {
        let (ins, mut outs) = ctx.split();
        let x = match &copy {
            Some(v) => v.as_slice(),
            None => ins.tensor(0)?.as_slice::<f32>()?,
        };
        let y = outs.tensor(0)?.ensure::<f32>(&dims);
        // Both sides computed, then selected: the loops vectorize (a branch per value would
        // mispredict on signs at random).
        prelu_runs(x, y, &slope, map, &|_, w, xs, o| {
            if let &[w] = w {
                for (o, &v) in o.iter_mut().zip(xs) {
                    let neg = v * w;
                    *o = if v > 0.0 { v } else { neg };
                }
            } else {
                for ((o, &v), &w) in o.iter_mut().zip(xs).zip(w) {
                    let neg = v * w;
                    *o = if v > 0.0 { v } else { neg };
                }
            }
        });
        return Ok(());
    }
    let gcopy = copy_if_inplace(ctx, 1)?;
    let glen = match &gcopy {
        Some(v) => v.len(),
        None => ctx.input(1)?.as_slice::<f32>()?.len(),
    };
    if glen != ctx.input(xi)?.numel() {
        bail!(op = ctx, ShapeMismatch: "dY must have the shape of X");
    }
    let mut ds = vec![0f32; slope.len()];
    {
        let (ins, mut outs) = ctx.split();
        let x = match &copy {
            Some(v) => v.as_slice(),
            None => ins.tensor(2)?.as_slice::<f32>()?,
        };
        let g = match &gcopy {
            Some(v) => v.as_slice(),
            None => ins.tensor(1)?.as_slice::<f32>()?,
        };
        // dslope: the sum of dY * X where X <= 0, per slope.
        match map {
            Slopes::Shared => ds[0] = masked_dot(x, g),
            Slopes::Planes { c, inner } if inner > 0 => {
                for (plane, (xp, gp)) in x.chunks(inner).zip(g.chunks(inner)).enumerate() {
                    ds[plane % c] += masked_dot(xp, gp);
                }
            }
            Slopes::Planes { .. } => {}
            Slopes::Pixels { c } => {
                for (xp, gp) in x.chunks(c).zip(g.chunks(c)) {
                    for ((d, &v), &gv) in ds.iter_mut().zip(xp).zip(gp) {
                        let p = gv * v;
                        *d += if v > 0.0 { 0.0 } else { p };
                    }
                }
            }
        }
        let dx = outs.tensor(0)?.ensure::<f32>(&dims);
        prelu_runs(x, dx, &slope, map, &|off, w, xs, o| {
            let gs = &g[off..off + xs.len()];
            if let &[w] = w {
                for ((o, &v), &gv) in o.iter_mut().zip(xs).zip(gs) {
                    let neg = gv * w;
                    *o = if v > 0.0 { gv } else { neg };
                }
            } else {
                for (((o, &v), &gv), &w) in o.iter_mut().zip(xs).zip(gs).zip(w) {
                    let neg = gv * w;
                    *o = if v > 0.0 { gv } else { neg };
                }
            }
        });
    }
    let sd = ctx.input(3)?.dims().to_vec();
    ctx.output(1)?.ensure::<f32>(&sd).copy_from_slice(&ds);
    Ok(())
}

/// The sum of `g * x` where `x <= 0`, over eight lanes.
fn masked_dot(x: &[f32], g: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (cx, cg) = (x.chunks_exact(8), g.chunks_exact(8));
    let (rx, rg) = (cx.remainder(), cg.remainder());
    for (xs, gs) in cx.zip(cg) {
        for i in 0..8 {
            let p = gs[i] * xs[i];
            acc[i] += if xs[i] > 0.0 { 0.0 } else { p };
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (&v, &gv) in rx.iter().zip(rg) {
        s += if v > 0.0 { 0.0 } else { gv * v };
    }
    s
}
