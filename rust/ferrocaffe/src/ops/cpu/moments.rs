//! Moments (mean and population variance over axes) and MomentsGradient.
//!
//! `Moments(X) -> (mean, variance)`: reduces over `axes` (default: all; negative values count
//! from the end, repeats count once), keeping them as size-1 dimensions with `keepdims` (the
//! default, 1) or dropping them. `MomentsGradient(dmean, dvariance, X, mean) -> dX`, with the
//! forward op's `axes`: `dX = (dmean + 2 * (X - mean) * dvariance) / R`, R the number of
//! values reduced into each output, mean and the gradients broadcast back over the axes.
//! Float only.

use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Moments", |i| create(i, false));
    r.cpu("MomentsGradient", |i| create(i, true));
}

fn create(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let axes = init.args.ints("axes");
    let keepdims = init.args.bool("keepdims", true)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        if gradient {
            backward(ctx, &axes)
        } else {
            forward(ctx, &axes, keepdims)
        }
    })))
}

/// Which dimensions of `dims` are reduced.
fn reduced(ctx: &OpContext<'_>, dims: &[usize], axes: &[i64]) -> Result<Vec<bool>> {
    let nd = dims.len() as i64;
    let mut mask = vec![axes.is_empty(); dims.len()];
    for &a in axes {
        let c = if a < 0 { a + nd } else { a };
        if c < 0 || c >= nd {
            bail!(
                op = ctx,
                BadArgument: "axis {a} is out of range for an input of {nd} dimensions"
            );
        }
        mask[c as usize] = true;
    }
    Ok(mask)
}

/// Index into the reduced tensor (reduced dimensions of size 1) of each flat element of `dims`.
fn reduced_index(dims: &[usize], mask: &[bool]) -> Vec<usize> {
    let n: usize = dims.iter().product();
    let mut out = vec![0usize; n];
    // Strides of the reduced shape.
    let mut strides = vec![0usize; dims.len()];
    let mut s = 1;
    for d in (0..dims.len()).rev() {
        if !mask[d] {
            strides[d] = s;
            s *= dims[d];
        }
    }
    let mut idx = vec![0usize; dims.len()];
    for o in out.iter_mut() {
        *o = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

fn forward(ctx: &mut OpContext<'_>, axes: &[i64], keepdims: bool) -> Result<()> {
    let dims = ctx.input(0)?.dims().to_vec();
    let mask = reduced(ctx, &dims, axes)?;
    let out_dims: Vec<usize> = dims
        .iter()
        .zip(&mask)
        .filter_map(|(&d, &m)| match (m, keepdims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let m: usize = dims
        .iter()
        .zip(&mask)
        .filter(|(_, &m)| !m)
        .map(|(d, _)| d)
        .product();
    let n: usize = dims.iter().product();
    let count = n.checked_div(m).unwrap_or(0) as f64;
    let index = reduced_index(&dims, &mask);
    let (mean, var) = {
        let x = ctx.input(0)?.as_slice::<f32>()?;
        let mut sum = vec![0f64; m];
        let mut sq = vec![0f64; m];
        for (&v, &o) in x.iter().zip(&index) {
            sum[o] += v as f64;
            sq[o] += v as f64 * v as f64;
        }
        let mean: Vec<f32> = sum.iter().map(|s| (s / count) as f32).collect();
        let var: Vec<f32> = sum
            .iter()
            .zip(&sq)
            .map(|(s, q)| {
                let mu = s / count;
                (q / count - mu * mu).max(0.0) as f32
            })
            .collect();
        (mean, var)
    };
    ctx.output(0)?
        .ensure::<f32>(&out_dims)
        .copy_from_slice(&mean);
    ctx.output(1)?
        .ensure::<f32>(&out_dims)
        .copy_from_slice(&var);
    Ok(())
}

fn backward(ctx: &mut OpContext<'_>, axes: &[i64]) -> Result<()> {
    let dims = ctx.input(2)?.dims().to_vec();
    let mask = reduced(ctx, &dims, axes)?;
    let m: usize = dims
        .iter()
        .zip(&mask)
        .filter(|(_, &m)| !m)
        .map(|(d, _)| d)
        .product();
    for i in [0, 1, 3] {
        if ctx.input(i)?.numel() != m {
            bail!(
                op = ctx,
                ShapeMismatch: "input {i} ('{}') has shape {:?}, expected {m} values (X {dims:?} \
                 reduced)",
                ctx.input_name(i),
                ctx.input(i)?.dims()
            );
        }
    }
    let n: usize = dims.iter().product();
    let norm = m as f32 / n.max(1) as f32;
    let index = reduced_index(&dims, &mask);
    let dx: Vec<f32> = {
        let dmean = ctx.input(0)?.as_slice::<f32>()?;
        let dvar = ctx.input(1)?.as_slice::<f32>()?;
        let x = ctx.input(2)?.as_slice::<f32>()?;
        let mean = ctx.input(3)?.as_slice::<f32>()?;
        x.iter()
            .zip(&index)
            .map(|(&v, &o)| (dmean[o] + 2.0 * (v - mean[o]) * dvar[o]) * norm)
            .collect()
    };
    ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn axes(v: &[i64]) -> Argument {
        Argument {
            name: Some("axes".into()),
            ints: v.to_vec(),
            ..Default::default()
        }
    }

    fn get(ws: &Workspace, n: &str) -> (Vec<usize>, Vec<f32>) {
        let t = ws.fetch(n).unwrap();
        (t.dims().to_vec(), t.as_slice::<f32>().unwrap().to_vec())
    }

    fn ws() -> std::sync::Arc<Workspace> {
        let ws = Workspace::new();
        ws.feed(
            "X",
            Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 6.0, 8.0]).unwrap(),
        );
        ws
    }

    #[test]
    fn moments_over_axes() {
        let ws = ws();
        let mut op = OperatorDef::new("Moments", ["X"], ["m", "v"]);
        op.arg.push(axes(&[-1]));
        ws.run_operator_once(&op).unwrap();
        assert_eq!(get(&ws, "m"), (vec![2, 1], vec![2.0, 6.0]));
        let (d, v) = get(&ws, "v");
        assert_eq!(d, vec![2, 1]);
        assert!((v[0] - 2.0 / 3.0).abs() < 1e-6 && (v[1] - 8.0 / 3.0).abs() < 1e-6);
        op.arg = vec![
            axes(&[0, 0]),
            Argument {
                name: Some("keepdims".into()),
                i: Some(0),
                ..Default::default()
            },
        ];
        ws.run_operator_once(&op).unwrap();
        assert_eq!(get(&ws, "m"), (vec![3], vec![2.5, 4.0, 5.5]));
        assert_eq!(get(&ws, "v"), (vec![3], vec![2.25, 4.0, 6.25]));
        // Default: every axis.
        let op = OperatorDef::new("Moments", ["X"], ["m", "v"]);
        ws.run_operator_once(&op).unwrap();
        assert_eq!(get(&ws, "m"), (vec![1, 1], vec![4.0]));
        let mut op = OperatorDef::new("Moments", ["X"], ["m", "v"]);
        op.arg.push(axes(&[2]));
        assert!(ws.run_operator_once(&op).is_err());
    }

    #[test]
    fn gradient_formula() {
        let ws = ws();
        ws.feed("dm", Tensor::from_vec(&[2, 1], vec![3.0f32, 0.0]).unwrap());
        ws.feed("dv", Tensor::from_vec(&[2, 1], vec![0.0f32, 1.5]).unwrap());
        ws.feed("m", Tensor::from_vec(&[2, 1], vec![2.0f32, 6.0]).unwrap());
        let mut op = OperatorDef::new("MomentsGradient", ["dm", "dv", "X", "m"], ["dX"]);
        op.arg.push(axes(&[1]));
        ws.run_operator_once(&op).unwrap();
        // Row 0: dmean / 3 = 1; row 1: 2 (x - 6) 1.5 / 3 = x - 6.
        assert_eq!(
            get(&ws, "dX"),
            (vec![2, 3], vec![1.0, 1.0, 1.0, -2.0, 0.0, 2.0])
        );
        ws.feed("m", Tensor::from_vec(&[3], vec![2.0f32, 6.0, 1.0]).unwrap());
        assert!(ws.run_operator_once(&op).is_err());
    }
}
