//! ElementwiseLinear (`Y = w * X + b` per column of X flattened at `axis`) and its gradient.
//!
//! X is seen as an (N, D) matrix, N the product of the dimensions before `axis` (default 1),
//! D the product of the rest; w and b are vectors of D values.

use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext};
use crate::ops::registry::Registry;
use crate::tensor::Tensor;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("ElementwiseLinear", |i| {
        let axis = i.args.int("axis", 1)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            forward(ctx, axis)
        })))
    });
    r.cpu("ElementwiseLinearGradient", |i| {
        let axis = i.args.int("axis", 1)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            gradient(ctx, axis)
        })))
    });
}

/// (N, D) of `x` split at `axis` (Caffe2's `canonical_axis_index`: -ndim <= axis < ndim).
fn split_at_axis(x: &Tensor, axis: i64) -> Result<(usize, usize)> {
    let nd = x.ndim() as i64;
    let a = if axis < 0 { axis + nd } else { axis };
    if a < 0 || a >= nd {
        bail!(
            BadArgument: "axis {axis} out of range for X of shape {:?} (needs -{nd} <= axis < \
             {nd})",
            x.dims()
        );
    }
    Ok((x.size_to_dim(a as usize), x.size_from_dim(a as usize)))
}

/// Checks that input `i` is a vector of `d` values.
fn check_vector(ctx: &OpContext<'_>, i: usize, d: usize) -> Result<()> {
    let t = ctx.input(i)?;
    if t.ndim() != 1 || t.dims()[0] != d {
        bail!(
            ShapeMismatch: "input {i} ('{}') must be a 1-D tensor of D = {d} values, got shape \
             {:?}",
            ctx.input_name(i),
            t.dims()
        );
    }
    Ok(())
}

/// Inputs X, w, b; output Y (shape of X).
fn forward(ctx: &mut OpContext<'_>, axis: i64) -> Result<()> {
    let (n, d) = split_at_axis(ctx.input(0)?, axis)?;
    check_vector(ctx, 1, d)?;
    check_vector(ctx, 2, d)?;
    let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
    let w = ctx.input(1)?.as_slice::<f32>()?.to_vec();
    let b = ctx.input(2)?.as_slice::<f32>()?.to_vec();
    let dims = ctx.input(0)?.dims().to_vec();
    let y = ctx.output(0)?.ensure::<f32>(&dims);
    for row in 0..n {
        let k = row * d;
        for j in 0..d {
            y[k + j] = w[j] * x[k + j] + b[j];
        }
    }
    Ok(())
}

/// Inputs dY, X, w; outputs dX (shape of X), dw and db (shape of w).
fn gradient(ctx: &mut OpContext<'_>, axis: i64) -> Result<()> {
    let (n, d) = split_at_axis(ctx.input(1)?, axis)?;
    check_vector(ctx, 2, d)?;
    let dy = ctx.input(0)?.as_slice::<f32>()?.to_vec();
    if dy.len() != n * d {
        bail!(
            ShapeMismatch: "input 0 ('{}') has {} values, expected {} (the size of X)",
            ctx.input_name(0),
            dy.len(),
            n * d
        );
    }
    let x = ctx.input(1)?.as_slice::<f32>()?.to_vec();
    let w = ctx.input(2)?.as_slice::<f32>()?.to_vec();
    let x_dims = ctx.input(1)?.dims().to_vec();
    let w_dims = ctx.input(2)?.dims().to_vec();
    let mut dx = vec![0f32; n * d];
    let mut dw = vec![0f32; d];
    let mut db = vec![0f32; d];
    for row in 0..n {
        let k = row * d;
        for j in 0..d {
            let g = dy[k + j];
            dx[k + j] = g * w[j];
            dw[j] += g * x[k + j];
            db[j] += g;
        }
    }
    ctx.output(0)?.ensure::<f32>(&x_dims).copy_from_slice(&dx);
    ctx.output(1)?.ensure::<f32>(&w_dims).copy_from_slice(&dw);
    ctx.output(2)?.ensure::<f32>(&w_dims).copy_from_slice(&db);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn f32s(ws: &Workspace, name: &str) -> Vec<f32> {
        ws.fetch(name).unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    fn with_axis(mut op: OperatorDef, axis: i64) -> OperatorDef {
        op.arg.push(Argument {
            name: Some("axis".into()),
            i: Some(axis),
            ..Default::default()
        });
        op
    }

    #[test]
    fn forward_scales_and_shifts_columns() {
        let ws = Workspace::new();
        ws.feed(
            "X",
            Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
        );
        ws.feed(
            "w",
            Tensor::from_vec(&[3], vec![2.0f32, 0.5, -1.0]).unwrap(),
        );
        ws.feed(
            "b",
            Tensor::from_vec(&[3], vec![0.0f32, 1.0, 10.0]).unwrap(),
        );
        ws.run_operator_once(&OperatorDef::new(
            "ElementwiseLinear",
            ["X", "w", "b"],
            ["Y"],
        ))
        .unwrap();
        // Row 0: 2*1+0, 0.5*2+1, -1*3+10; row 1: 2*4, 0.5*5+1, -6+10.
        assert_eq!(f32s(&ws, "Y"), vec![2.0, 2.0, 7.0, 8.0, 3.5, 4.0]);
        assert_eq!(ws.fetch("Y").unwrap().dims(), &[2, 3]);
    }

    #[test]
    fn axis_flattens_trailing_dimensions() {
        let ws = Workspace::new();
        ws.feed(
            "X",
            Tensor::from_vec(&[1, 2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
        );
        ws.feed("w", Tensor::from_vec(&[2], vec![10.0f32, 100.0]).unwrap());
        ws.feed("b", Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap());
        let op = OperatorDef::new("ElementwiseLinear", ["X", "w", "b"], ["Y"]);
        ws.run_operator_once(&with_axis(op, 2)).unwrap();
        assert_eq!(f32s(&ws, "Y"), vec![11.0, 202.0, 31.0, 402.0]);
        // With the default axis (1), D = 4 and w of 2 values is refused, naming the blob.
        let op = OperatorDef::new("ElementwiseLinear", ["X", "w", "b"], ["Y"]);
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("'w'") && e.contains("D = 4"), "{e}");
        let op = OperatorDef::new("ElementwiseLinear", ["X", "w", "b"], ["Y"]);
        let e = ws
            .run_operator_once(&with_axis(op, 3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("axis 3 out of range"), "{e}");
    }

    #[test]
    fn gradient_matches_hand_computation() {
        let ws = Workspace::new();
        ws.feed(
            "dY",
            Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
        );
        ws.feed(
            "X",
            Tensor::from_vec(&[2, 2], vec![0.5f32, -1.0, 2.0, 1.0]).unwrap(),
        );
        ws.feed("w", Tensor::from_vec(&[2], vec![3.0f32, -2.0]).unwrap());
        ws.run_operator_once(&OperatorDef::new(
            "ElementwiseLinearGradient",
            ["dY", "X", "w"],
            ["dX", "dw", "db"],
        ))
        .unwrap();
        assert_eq!(f32s(&ws, "dX"), vec![3.0, -4.0, 9.0, -8.0]);
        // dw_j = sum_n dY[n, j] * X[n, j]; db_j = sum_n dY[n, j].
        assert_eq!(f32s(&ws, "dw"), vec![1.0 * 0.5 + 3.0 * 2.0, -2.0 + 4.0]);
        assert_eq!(f32s(&ws, "db"), vec![4.0, 6.0]);
        assert_eq!(ws.fetch("dw").unwrap().dims(), &[2]);
    }
}
