//! ArgMax and ArgMin: the int64 index of the largest / smallest value along `axis` (default
//! -1, negative counts from the end). `keepdims` (default 1) keeps the axis with size 1;
//! otherwise it is dropped. Ties go to the first index, or the last with `select_last_index`.
//! Inputs of type float, double, int32 or int64.

use crate::bail;
use crate::dispatch;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::Element;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("ArgMax", |i| create(i, true));
    r.cpu("ArgMin", |i| create(i, false));
}

fn create(init: &OpInit<'_>, max: bool) -> Result<Box<dyn Operator>> {
    let axis = init.args.int("axis", -1)?;
    let keepdims = init.args.bool("keepdims", true)?;
    let last = init.args.bool("select_last_index", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let x = ctx.input(0)?;
        let dims = x.dims().to_vec();
        let nd = dims.len() as i64;
        let a = if axis < 0 { axis + nd } else { axis };
        if a < 0 || a >= nd {
            bail!(
                op = ctx,
                BadArgument: "axis {axis} is out of range for an input of {nd} dimensions"
            );
        }
        let a = a as usize;
        let outer: usize = dims[..a].iter().product();
        let len = dims[a];
        let inner: usize = dims[a + 1..].iter().product();
        if len == 0 {
            bail!(op = ctx, ShapeMismatch: "cannot take the arg of an empty axis");
        }
        let mut out_dims = dims.clone();
        if keepdims {
            out_dims[a] = 1;
        } else {
            out_dims.remove(a);
        }
        let idx = dispatch!(x.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64], |T| {
            Ok(arg::<T>(x.as_slice::<T>()?, outer, len, inner, max, last))
        })?;
        ctx.output(0)?
            .ensure::<i64>(&out_dims)
            .copy_from_slice(&idx);
        Ok(())
    })))
}

fn arg<T: Element + PartialOrd>(
    x: &[T],
    outer: usize,
    len: usize,
    inner: usize,
    max: bool,
    last: bool,
) -> Vec<i64> {
    let mut out = vec![0i64; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| x[(o * len + k) * inner + i];
            let mut best = 0usize;
            for k in 1..len {
                let (v, b) = (at(k), at(best));
                let better = if max { v > b } else { v < b };
                if better || (last && v == b) {
                    best = k;
                }
            }
            out[o * inner + i] = best as i64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn run(op_type: &str, x: Tensor, args: Vec<Argument>) -> crate::Result<(Vec<usize>, Vec<i64>)> {
        let ws = Workspace::new();
        ws.feed("X", x);
        let mut op = OperatorDef::new(op_type, ["X"], ["Y"]);
        op.arg = args;
        ws.run_operator_once(&op)?;
        let y = ws.fetch("Y")?;
        Ok((y.dims().to_vec(), y.as_slice::<i64>()?.to_vec()))
    }

    #[test]
    fn argmax_argmin_along_axes() {
        let x = || Tensor::from_vec(&[2, 3], vec![1.0f32, 5.0, 5.0, 7.0, -2.0, 0.0]).unwrap();
        assert_eq!(
            run("ArgMax", x(), vec![]).unwrap(),
            (vec![2, 1], vec![1, 0])
        );
        assert_eq!(
            run("ArgMax", x(), vec![Argument::int("select_last_index", 1)]).unwrap(),
            (vec![2, 1], vec![2, 0])
        );
        assert_eq!(
            run(
                "ArgMin",
                x(),
                vec![Argument::int("axis", 0), Argument::int("keepdims", 0)]
            )
            .unwrap(),
            (vec![3], vec![0, 1, 1])
        );
        let xi = Tensor::from_vec(&[3], vec![4i64, -1, 9]).unwrap();
        assert_eq!(run("ArgMin", xi, vec![]).unwrap(), (vec![1], vec![1]));
        assert!(run("ArgMax", x(), vec![Argument::int("axis", 2)]).is_err());
        let xb = Tensor::from_vec(&[2], vec![true, false]).unwrap();
        assert!(run("ArgMax", xb, vec![]).is_err());
    }
}
