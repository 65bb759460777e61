//! `DotProductWithPadding` and its gradient: the row-wise dot product of X `[N, DX...]` and
//! Y `[N, DY...]` whose rows differ in length. By default the shorter row is padded with
//! `pad_value` (the longer row's tail contributes `pad_value * sum(tail)`); with `replicate`
//! the shorter row is repeated to the longer one's length (which must be a multiple of it).

use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit};
use crate::ops::registry::Registry;
use crate::tensor::DataType;

/// Registers the forward and gradient kernels.
pub fn register(r: &mut Registry) {
    r.cpu("DotProductWithPadding", |init| {
        let p = Params::new(init)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            forward(ctx, p)
        })))
    });
    r.cpu("DotProductWithPaddingGradient", |init| {
        let p = Params::new(init)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            backward(ctx, p)
        })))
    });
}

#[derive(Clone, Copy)]
struct Params {
    pad_value: f32,
    replicate: bool,
}

impl Params {
    fn new(init: &OpInit<'_>) -> Result<Self> {
        Ok(Params {
            pad_value: init.args.float("pad_value", 0.0)?,
            replicate: init.args.bool("replicate", false)?,
        })
    }
}

/// `(N, DX, DY)` of the two inputs: same rank, same first dimension, float.
fn rows(ctx: &OpContext<'_>, replicate: bool) -> Result<(usize, usize, usize)> {
    let (x, y) = (ctx.input(0)?, ctx.input(1)?);
    for (t, what) in [(x, "X"), (y, "Y")] {
        if t.dtype() != DataType::Float {
            bail!(DtypeMismatch: "{what} must be float, got {}", t.dtype().name());
        }
    }
    if x.ndim() != y.ndim() {
        bail!(
            ShapeMismatch: "X and Y must have the same number of dimensions, got {:?} and {:?}",
            x.dims(),
            y.dims()
        );
    }
    if x.dims().first() != y.dims().first() {
        bail!(
            ShapeMismatch: "X and Y must have the same first dimension, got {:?} and {:?}",
            x.dims(),
            y.dims()
        );
    }
    if x.numel() == 0 {
        return Ok((0, 0, 0));
    }
    let n = x.dims().first().copied().unwrap_or(1);
    let (dx, dy) = (x.numel() / n, y.numel() / n);
    if replicate {
        let (short, long) = (dx.min(dy), dx.max(dy));
        if short == 0 || long % short != 0 {
            bail!(
                ShapeMismatch: "with replicate, the longer row ({long}) must be a multiple of \
                 the shorter one ({short})"
            );
        }
    }
    Ok((n, dx, dy))
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn forward(ctx: &mut OpContext<'_>, p: Params) -> Result<()> {
    let (n, dx, dy) = rows(ctx, p.replicate)?;
    let (ins, mut outs) = ctx.split();
    let (x, y) = (
        ins.tensor(0)?.as_slice::<f32>()?,
        ins.tensor(1)?.as_slice::<f32>()?,
    );
    let out = outs.tensor(0)?.try_ensure::<f32>(&[n])?;
    let d = dx.min(dy);
    for (i, o) in out.iter_mut().enumerate() {
        let (xr, yr) = (&x[i * dx..(i + 1) * dx], &y[i * dy..(i + 1) * dy]);
        // The longer row (Y when they are as long) and the shorter one.
        let (long, short) = if dx > dy { (xr, yr) } else { (yr, xr) };
        *o = if p.replicate {
            long.chunks(d).map(|c| dot(c, short)).sum()
        } else {
            dot(&long[..d], short) + p.pad_value * long[d..].iter().sum::<f32>()
        };
    }
    Ok(())
}

fn backward(ctx: &mut OpContext<'_>, p: Params) -> Result<()> {
    let (n, dx, dy) = rows(ctx, p.replicate)?;
    let g = ctx.input(2)?;
    if g.dtype() != DataType::Float || g.ndim() != 1 || g.dims()[0] != n {
        bail!(
            ShapeMismatch: "dDot must be a float vector of {n} values, got {} {:?}",
            g.dtype().name(),
            g.dims()
        );
    }
    let (ins, mut outs) = ctx.split();
    let (xt, yt) = (ins.tensor(0)?, ins.tensor(1)?);
    let (x, y) = (xt.as_slice::<f32>()?, yt.as_slice::<f32>()?);
    let g = ins.tensor(2)?.as_slice::<f32>()?;
    let (xd, yd) = (xt.dims().to_vec(), yt.dims().to_vec());
    let mut ts = outs.tensors();
    let [tx, ty] = &mut ts[..] else {
        bail!(Schema: "dX and dY must be two different blobs");
    };
    let gx = tx.try_ensure::<f32>(&xd)?;
    let gy = ty.try_ensure::<f32>(&yd)?;
    gx.fill(0.0);
    gy.fill(0.0);
    let d = dx.min(dy);
    for i in 0..n {
        let (xr, yr) = (&x[i * dx..(i + 1) * dx], &y[i * dy..(i + 1) * dy]);
        let (gxr, gyr) = (&mut gx[i * dx..(i + 1) * dx], &mut gy[i * dy..(i + 1) * dy]);
        let (long, short, glong, gshort) = if dx > dy {
            (xr, yr, gxr, gyr)
        } else {
            (yr, xr, gyr, gxr)
        };
        let gi = g[i];
        if p.replicate {
            gshort.fill(0.0);
            for (lc, glc) in long.chunks(d).zip(glong.chunks_mut(d)) {
                for ((gl, &s), (gs, &l)) in glc.iter_mut().zip(short).zip(gshort.iter_mut().zip(lc))
                {
                    *gl = gi * s;
                    *gs += gi * l;
                }
            }
        } else {
            for k in 0..d {
                glong[k] = gi * short[k];
                gshort[k] = gi * long[k];
            }
            glong[d..].fill(gi * p.pad_value);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn empty_rows_and_replicating_an_empty_row() {
        let ws = Workspace::new();
        ws.feed("x", Tensor::from_vec(&[0, 3], Vec::<f32>::new()).unwrap());
        ws.feed("y", Tensor::from_vec(&[0, 5], Vec::<f32>::new()).unwrap());
        let op = OperatorDef::new("DotProductWithPadding", ["x", "y"], ["z"]);
        ws.run_operator_once(&op).unwrap();
        assert_eq!(ws.fetch("z").unwrap().dims(), &[0]);
        // Y's rows are empty: padding X's rows with nothing gives pad_value * sum(X).
        ws.feed(
            "x",
            Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
        );
        ws.feed("y", Tensor::from_vec(&[2, 0], Vec::<f32>::new()).unwrap());
        let mut op = OperatorDef::new("DotProductWithPadding", ["x", "y"], ["z"]);
        op.arg.push(Argument::float("pad_value", 2.0));
        ws.run_operator_once(&op).unwrap();
        assert_eq!(
            ws.fetch("z").unwrap().as_slice::<f32>().unwrap(),
            &[6.0, 14.0]
        );
        op.arg.push(Argument::int("replicate", 1));
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("multiple"), "{e}");
    }
}
