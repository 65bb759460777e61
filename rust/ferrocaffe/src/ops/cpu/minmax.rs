//! Max and Min of several same-shaped inputs, and their gradients (every input equal to the
//! result gets the output gradient).

use super::elementwise::{input_dtype, nary_same_shape};
use crate::bail;
use crate::dispatch;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Max", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let dt = input_dtype(ctx, 0)?;
            dispatch!(dt, [Float => f32, Double => f64, Int32 => i32, Int64 => i64], |T| {
                nary_same_shape::<T>(ctx, |a, b| if b > a { b } else { a })
            })
        })))
    });
    r.cpu("Min", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let dt = input_dtype(ctx, 0)?;
            dispatch!(dt, [Float => f32, Double => f64, Int32 => i32, Int64 => i64], |T| {
                nary_same_shape::<T>(ctx, |a, b| if b < a { b } else { a })
            })
        })))
    });
    r.cpu_many(&["MaxGradient", "MinGradient"], |_| {
        Ok(Box::new(FnOp(select_grad)))
    });
}

/// Inputs (Y, dY, X_0, ..., X_n-1), outputs dX_i = dY where X_i == Y, else 0.
fn select_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let n = ctx.num_inputs().saturating_sub(2);
    if ctx.num_outputs() != n {
        bail!(op = ctx, Schema: "expected {n} outputs, got {}", ctx.num_outputs());
    }
    let (ins, mut outs) = ctx.split();
    let y = ins.tensor(0)?;
    let dy = ins.tensor(1)?.as_slice::<f32>()?;
    let ys = y.as_slice::<f32>()?;
    if dy.len() != ys.len() {
        bail!(ShapeMismatch: "Y and dY must have the same size");
    }
    for i in 0..n {
        let x = ins.tensor(i + 2)?;
        let xs = x.as_slice::<f32>()?;
        if xs.len() != ys.len() {
            bail!(ShapeMismatch: "input {} must have the shape of Y", i + 2);
        }
        let dims = x.dims().to_vec();
        let dx = outs.tensor(i)?.ensure::<f32>(&dims);
        for k in 0..dx.len() {
            dx[k] = if xs[k] == ys[k] { dy[k] } else { 0.0 };
        }
    }
    Ok(())
}
