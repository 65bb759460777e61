//! Reductions: ReduceSum / ReduceMean / ReduceMax / ReduceMin / ReduceL1 / ReduceL2 over `axes` (default all, with
//! `keepdims`, default 1) and their gradients; SumSqrElements; row-wise DotProduct and
//! SquaredL2Distance with their gradients.

use super::broadcast::for_each_index;
use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("ReduceSum", |i| create(i, Red::Sum, false));
    r.cpu("ReduceMean", |i| create(i, Red::Mean, false));
    r.cpu("ReduceMax", |i| create(i, Red::Max, false));
    r.cpu("ReduceMin", |i| create(i, Red::Min, false));
    r.cpu("ReduceSumGradient", |i| create(i, Red::Sum, true));
    r.cpu("ReduceMeanGradient", |i| create(i, Red::Mean, true));
    r.cpu("ReduceMaxGradient", |i| create(i, Red::Max, true));
    r.cpu("ReduceMinGradient", |i| create(i, Red::Min, true));
    r.cpu("ReduceL1", |i| create(i, Red::L1, false));
    r.cpu("ReduceL2", |i| create(i, Red::L2, false));
    r.cpu("ReduceL1Gradient", |i| create(i, Red::L1, true));
    r.cpu("ReduceL2Gradient", |i| create(i, Red::L2, true));
    r.cpu("SumSqrElements", |i| {
        let average = i.args.bool("average", false)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            let (ins, mut outs) = ctx.split();
            let x = ins.tensor(0)?.as_slice::<f32>()?;
            let mut s: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            if average && !x.is_empty() {
                s /= x.len() as f64;
            }
            outs.tensor(0)?.ensure::<f32>(&[])[0] = s as f32;
            Ok(())
        })))
    });
    r.cpu("DotProduct", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            rowwise(ctx, false)
        })))
    });
    r.cpu("SquaredL2Distance", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| rowwise(ctx, true))))
    });
    r.cpu("DotProductGradient", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            rowwise_grad(ctx, false)
        })))
    });
    r.cpu("SquaredL2DistanceGradient", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            rowwise_grad(ctx, true)
        })))
    });
}

#[derive(Clone, Copy, PartialEq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
    /// Sum of absolute values.
    L1,
    /// Square root of the sum of squares.
    L2,
}

struct Reduce {
    axes: Option<Vec<i64>>,
    keepdims: bool,
    red: Red,
    gradient: bool,
}

/// `(keep_dims, out_dims, count)`: X's dims with reduced axes set to 1, the output dims, and
/// how many elements each output sums.
fn reduced_dims(
    axes: &Option<Vec<i64>>,
    dims: &[usize],
    keepdims: bool,
) -> Result<(Vec<usize>, Vec<usize>, usize)> {
    let nd = dims.len() as i64;
    let mut flags = vec![axes.is_none(); dims.len()];
    for &a in axes.iter().flatten() {
        let k = if a < 0 { a + nd } else { a };
        if k < 0 || k >= nd {
            bail!(BadArgument: "axes {a} out of range for a tensor of {nd} dimensions");
        }
        flags[k as usize] = true;
    }
    let keep: Vec<usize> = dims
        .iter()
        .zip(&flags)
        .map(|(&d, &f)| if f { 1 } else { d })
        .collect();
    let out = if keepdims {
        keep.clone()
    } else {
        dims.iter()
            .zip(&flags)
            .filter(|(_, &f)| !f)
            .map(|(&d, _)| d)
            .collect()
    };
    let count = dims
        .iter()
        .zip(&flags)
        .filter(|(_, &f)| f)
        .map(|(&d, _)| d)
        .product();
    Ok((keep, out, count))
}

impl Operator for Reduce {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            return self.backward(ctx);
        }
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let (keep, out_dims, count) = reduced_dims(&self.axes, x.dims(), self.keepdims)?;
        let xs = x.as_slice::<f32>()?;
        let n_out: usize = keep.iter().product();
        let init = match self.red {
            Red::Max => f32::NEG_INFINITY,
            Red::Min => f32::INFINITY,
            _ => 0.0,
        };
        let mut acc = vec![init; n_out];
        let red = self.red;
        for_each_index(x.dims(), &keep, x.dims(), |i, _, iy| {
            let v = xs[i];
            acc[iy] = match red {
                Red::Sum | Red::Mean => acc[iy] + v,
                Red::Max => acc[iy].max(v),
                Red::Min => acc[iy].min(v),
                Red::L1 => acc[iy] + v.abs(),
                Red::L2 => acc[iy] + v * v,
            };
        });
        if red == Red::L2 {
            acc.iter_mut().for_each(|a| *a = a.sqrt());
        }
        if red == Red::Mean && count > 0 {
            for a in &mut acc {
                *a /= count as f32;
            }
        }
        outs.tensor(0)?
            .ensure::<f32>(&out_dims)
            .copy_from_slice(&acc);
        Ok(())
    }
}

impl Reduce {
    /// Inputs (dY, X, Y), output dX.
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (ins, mut outs) = ctx.split();
        let dy = ins.tensor(0)?.as_slice::<f32>()?;
        let x = ins.tensor(1)?;
        let y = ins.tensor(2)?.as_slice::<f32>()?;
        let (keep, _, count) = reduced_dims(&self.axes, x.dims(), self.keepdims)?;
        let n_out: usize = keep.iter().product();
        if dy.len() != n_out || y.len() != n_out {
            bail!(ShapeMismatch: "dY and Y must hold {n_out} values (the reduced shape {keep:?})");
        }
        let xs = x.as_slice::<f32>()?;
        let dims = x.dims().to_vec();
        let dx = outs.tensor(0)?.ensure::<f32>(&dims);
        let scale = if self.red == Red::Mean && count > 0 {
            1.0 / count as f32
        } else {
            1.0
        };
        let red = self.red;
        for_each_index(&dims, &keep, &dims, |i, _, iy| {
            dx[i] = match red {
                Red::Sum | Red::Mean => dy[iy] * scale,
                Red::Max | Red::Min => {
                    if xs[i] == y[iy] {
                        dy[iy]
                    } else {
                        0.0
                    }
                }
                Red::L1 => {
                    if xs[i] > 0.0 {
                        dy[iy]
                    } else if xs[i] < 0.0 {
                        -dy[iy]
                    } else {
                        0.0
                    }
                }
                Red::L2 => {
                    if y[iy] == 0.0 {
                        0.0
                    } else {
                        dy[iy] * xs[i] / y[iy]
                    }
                }
            };
        });
        Ok(())
    }
}

fn create(init: &OpInit<'_>, red: Red, gradient: bool) -> Result<Box<dyn Operator>> {
    let axes = init.args.has("axes").then(|| init.args.ints("axes"));
    Ok(Box::new(Reduce {
        axes,
        keepdims: init.args.bool("keepdims", true)?,
        red,
        gradient,
    }))
}

/// `(N, D)` of row-wise ops: X and Y of one shape, N = first dim (1-d: N rows of one value).
fn rows(ctx_x: &[usize], ctx_y: &[usize]) -> Result<(usize, usize)> {
    if ctx_x != ctx_y {
        bail!(ShapeMismatch: "X {ctx_x:?} and Y {ctx_y:?} must have the same shape");
    }
    let n = ctx_x.first().copied().unwrap_or(1);
    let total: usize = ctx_x.iter().product();
    Ok((n, total.checked_div(n).unwrap_or(0)))
}

fn rowwise(ctx: &mut OpContext<'_>, l2: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let y = ins.tensor(1)?;
    let (n, d) = rows(x.dims(), y.dims())?;
    let (xs, ys) = (x.as_slice::<f32>()?, y.as_slice::<f32>()?);
    let z = outs.tensor(0)?.ensure::<f32>(&[n]);
    for i in 0..n {
        let (a, b) = (&xs[i * d..(i + 1) * d], &ys[i * d..(i + 1) * d]);
        z[i] = if l2 {
            0.5 * a.iter().zip(b).map(|(p, q)| (p - q) * (p - q)).sum::<f32>()
        } else {
            a.iter().zip(b).map(|(p, q)| p * q).sum()
        };
    }
    Ok(())
}

/// Inputs (X, Y, dZ), outputs (dX, dY).
fn rowwise_grad(ctx: &mut OpContext<'_>, l2: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let y = ins.tensor(1)?;
    let (n, d) = rows(x.dims(), y.dims())?;
    let dz = ins.tensor(2)?.as_slice::<f32>()?;
    if dz.len() != n {
        bail!(ShapeMismatch: "dZ must hold {n} values, got {}", dz.len());
    }
    let (xs, ys) = (x.as_slice::<f32>()?, y.as_slice::<f32>()?);
    let dims = x.dims().to_vec();
    let mut dx = vec![0f32; xs.len()];
    let mut dy = vec![0f32; ys.len()];
    for (i, &g) in dz.iter().enumerate() {
        for j in i * d..(i + 1) * d {
            if l2 {
                dx[j] = g * (xs[j] - ys[j]);
                dy[j] = -dx[j];
            } else {
                dx[j] = g * ys[j];
                dy[j] = g * xs[j];
            }
        }
    }
    outs.tensor(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
    outs.tensor(1)?.ensure::<f32>(&dims).copy_from_slice(&dy);
    Ok(())
}
