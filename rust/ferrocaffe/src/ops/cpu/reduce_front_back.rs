//! Reductions over leading or trailing dimensions: `ReduceFront{Sum,Mean,Max}` and
//! `ReduceBack{Sum,Mean,Max}` (argument `num_reduce_dim`, default 1; an optional LENGTHS input
//! limits how many of the reduced elements each output reads) and their gradients; also
//! `SumElementsInt`, `RowwiseMax` and `ColwiseMax`.
//!
//! A tensor of shape `d` seen as a matrix: front reductions reduce the rows of
//! `[prod(d[..k]), prod(d[k..])]`, back reductions the columns of
//! `[prod(d[..n-k]), prod(d[n-k..])]`, with `k = num_reduce_dim`.

use crate::error::{try_vec, Result};
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    for (name, red, front) in [
        ("ReduceFrontSum", Red::Sum, true),
        ("ReduceFrontMean", Red::Mean, true),
        ("ReduceFrontMax", Red::Max, true),
        ("ReduceBackSum", Red::Sum, false),
        ("ReduceBackMean", Red::Mean, false),
        ("ReduceBackMax", Red::Max, false),
    ] {
        let f: crate::ops::registry::Factory = match (red, front) {
            (Red::Sum, true) => |i| create(i, Red::Sum, true, false),
            (Red::Mean, true) => |i| create(i, Red::Mean, true, false),
            (Red::Max, true) => |i| create(i, Red::Max, true, false),
            (Red::Sum, false) => |i| create(i, Red::Sum, false, false),
            (Red::Mean, false) => |i| create(i, Red::Mean, false, false),
            (Red::Max, false) => |i| create(i, Red::Max, false, false),
        };
        r.cpu(name, f);
        let g: crate::ops::registry::Factory = match (red, front) {
            (Red::Sum, true) => |i| create(i, Red::Sum, true, true),
            (Red::Mean, true) => |i| create(i, Red::Mean, true, true),
            (Red::Max, true) => |i| create(i, Red::Max, true, true),
            (Red::Sum, false) => |i| create(i, Red::Sum, false, true),
            (Red::Mean, false) => |i| create(i, Red::Mean, false, true),
            (Red::Max, false) => |i| create(i, Red::Max, false, true),
        };
        let gname = format!("{name}Gradient");
        r.cpu(&gname, g);
    }
    r.cpu("SumElementsInt", |_| Ok(Box::new(FnOp(sum_elements_int))));
    r.cpu("RowwiseMax", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| batch_max(c, true))))
    });
    r.cpu("ColwiseMax", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| batch_max(c, false))))
    });
    r.cpu("RowwiseMaxGradient", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
            batch_max_grad(c, true)
        })))
    });
    r.cpu("ColwiseMaxGradient", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
            batch_max_grad(c, false)
        })))
    });
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Red {
    Sum,
    Mean,
    Max,
}

struct FrontBack {
    red: Red,
    front: bool,
    gradient: bool,
    num_reduce_dim: usize,
}

fn create(init: &OpInit<'_>, red: Red, front: bool, gradient: bool) -> Result<Box<dyn Operator>> {
    let k = init.args.int("num_reduce_dim", 1)?;
    let num_reduce_dim = usize::try_from(k)
        .map_err(|_| err!(BadArgument: "num_reduce_dim must be non-negative, got {k}"))?;
    Ok(Box::new(FrontBack {
        red,
        front,
        gradient,
        num_reduce_dim,
    }))
}

/// `(rows, cols, out_dims)` of a front or back reduction of `dims`.
fn split(dims: &[usize], k: usize, front: bool) -> Result<(usize, usize, Vec<usize>)> {
    if k > dims.len() {
        bail!(
            BadArgument: "For N-dim input tensor, support num_reduce_dims in range [0, N]: \
             num_reduce_dim {k}, input has {} dimensions",
            dims.len()
        );
    }
    let at = if front { k } else { dims.len() - k };
    let rows = dims[..at].iter().product();
    let cols = dims[at..].iter().product();
    let out = if front {
        dims[at..].to_vec()
    } else {
        dims[..at].to_vec()
    };
    Ok((rows, cols, out))
}

/// The LENGTHS input as counts, each at most `bound`, one per output.
fn read_lengths(t: &Tensor, n_out: usize, bound: usize) -> Result<Vec<usize>> {
    if t.numel() != n_out {
        bail!(
            ShapeMismatch: "LENGTHS has {} values, expected one per output ({n_out})",
            t.numel()
        );
    }
    t.to_i64_vec()?
        .into_iter()
        .map(|l| {
            usize::try_from(l).ok().filter(|&u| u <= bound).ok_or_else(
                || err!(BadArgument: "length {l} out of range [0, {bound}] of the reduced size"),
            )
        })
        .collect()
}

impl Operator for FrontBack {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            return self.backward(ctx);
        }
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        if x.dtype() != DataType::Float {
            bail!(DtypeMismatch: "X must be float, got {}", x.dtype().name());
        }
        let (rows, cols, out_dims) = split(x.dims(), self.num_reduce_dim, self.front)?;
        let (n_out, reduced) = if self.front {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let lens = if ins.len() > 1 {
            Some(read_lengths(ins.tensor(1)?, n_out, reduced)?)
        } else {
            None
        };
        let xs = x.as_slice::<f32>()?;
        let y = outs.tensor(0)?.try_ensure::<f32>(&out_dims)?;
        let red = self.red;
        let init = if red == Red::Max {
            f32::NEG_INFINITY
        } else {
            0.0
        };
        if self.front {
            // Walk X row by row so that memory is read in order.
            y.fill(init);
            for i in 0..rows {
                let row = &xs[i * cols..(i + 1) * cols];
                for (j, (o, &v)) in y.iter_mut().zip(row).enumerate() {
                    if lens.as_ref().is_some_and(|l| i >= l[j]) {
                        continue;
                    }
                    *o = if red == Red::Max { o.max(v) } else { *o + v };
                }
            }
        } else {
            for (i, o) in y.iter_mut().enumerate() {
                let n = lens.as_ref().map_or(cols, |l| l[i]);
                let row = &xs[i * cols..i * cols + n];
                *o = if red == Red::Max {
                    row.iter().fold(init, |a, &v| a.max(v))
                } else {
                    row.iter().sum()
                };
            }
        }
        if red == Red::Mean {
            for (j, o) in y.iter_mut().enumerate() {
                let n = lens.as_ref().map_or(reduced, |l| l[j]);
                *o /= n as f32;
            }
        }
        Ok(())
    }
}

impl FrontBack {
    /// Sum/Mean: (dY, X or X's shape as int64, [LENGTHS]); Max: (dY, X, Y, [LENGTHS]).
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (ins, mut outs) = ctx.split();
        let dy_t = ins.tensor(0)?;
        let second = ins.tensor(1)?;
        let is_max = self.red == Red::Max;
        let dims: Vec<usize> = if !is_max && second.dtype() == DataType::Int64 && second.ndim() == 1
        {
            second
                .as_slice::<i64>()?
                .iter()
                .map(|&d| {
                    usize::try_from(d)
                        .map_err(|_| err!(BadArgument: "negative dimension {d} in the shape"))
                })
                .collect::<Result<_>>()?
        } else {
            second.dims().to_vec()
        };
        let (rows, cols, out_dims) = split(&dims, self.num_reduce_dim, self.front)?;
        let (n_out, reduced) = if self.front {
            (cols, rows)
        } else {
            (rows, cols)
        };
        if dy_t.numel() != n_out {
            bail!(
                ShapeMismatch: "dY has shape {:?}, expected {out_dims:?}",
                dy_t.dims()
            );
        }
        let len_at = if is_max { 3 } else { 2 };
        let lens = if ins.len() > len_at {
            Some(read_lengths(ins.tensor(len_at)?, n_out, reduced)?)
        } else {
            None
        };
        let dy = dy_t.as_slice::<f32>()?;
        let (xs, ys) = if is_max {
            let x = second.as_slice::<f32>()?;
            let y = ins.tensor(2)?.as_slice::<f32>()?;
            if y.len() != n_out {
                bail!(ShapeMismatch: "Y holds {} values, expected {n_out}", y.len());
            }
            (x, y)
        } else {
            (&[][..], &[][..])
        };
        let total = rows
            .checked_mul(cols)
            .ok_or_else(|| err!(BadArgument: "shape {dims:?} is too large"))?;
        let mut dx = try_vec(total, 0f32, "dX")?;
        for i in 0..rows {
            for j in 0..cols {
                let (o, pos) = if self.front { (j, i) } else { (i, j) };
                let n = lens.as_ref().map_or(reduced, |l| l[o]);
                if pos >= n {
                    continue;
                }
                let k = i * cols + j;
                dx[k] = match self.red {
                    Red::Sum => dy[o],
                    Red::Mean => dy[o] / n as f32,
                    Red::Max => {
                        if xs[k] == ys[o] {
                            dy[o]
                        } else {
                            0.0
                        }
                    }
                };
            }
        }
        let out = outs.tensor(0)?;
        out.try_reset(DataType::Float, &dims)?;
        out.as_mut_slice::<f32>()?.copy_from_slice(&dx);
        Ok(())
    }
}

/// `SumElementsInt`: the int32 sum of an int32 tensor, a scalar.
fn sum_elements_int(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    if x.dtype() != DataType::Int32 {
        bail!(DtypeMismatch: "SumElementsInt takes int32, got {}", x.dtype().name());
    }
    let s = x
        .as_slice::<i32>()?
        .iter()
        .fold(0i32, |a, &v| a.wrapping_add(v));
    outs.tensor(0)?.ensure::<i32>(&[])[0] = s;
    Ok(())
}

/// `(batch, m, n)` of a 3-d float input.
fn three_d(x: &Tensor) -> Result<(usize, usize, usize)> {
    match *x.dims() {
        [b, m, n] => Ok((b, m, n)),
        ref d => bail!(ShapeMismatch: "X should be a 3-D tensor (batch, M, N), got shape {d:?}"),
    }
}

/// `RowwiseMax`: (B, M, N) -> (B, M), the max of each row; `ColwiseMax`: (B, M, N) -> (B, N).
fn batch_max(ctx: &mut OpContext<'_>, rowwise: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let (b, m, n) = three_d(x)?;
    let xs = x.as_slice::<f32>()?;
    let out_w = if rowwise { m } else { n };
    let y = outs.tensor(0)?.try_ensure::<f32>(&[b, out_w])?;
    y.fill(f32::NEG_INFINITY);
    for bi in 0..b {
        for i in 0..m {
            for j in 0..n {
                let v = xs[(bi * m + i) * n + j];
                let o = &mut y[bi * out_w + if rowwise { i } else { j }];
                *o = o.max(v);
            }
        }
    }
    Ok(())
}

/// Gradient of `RowwiseMax` / `ColwiseMax`: (X, Y, dY) -> dX, dY routed to the maxima.
fn batch_max_grad(ctx: &mut OpContext<'_>, rowwise: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let (b, m, n) = three_d(x)?;
    let out_w = if rowwise { m } else { n };
    let y = ins.tensor(1)?.as_slice::<f32>()?;
    let dy = ins.tensor(2)?.as_slice::<f32>()?;
    if y.len() != b * out_w || dy.len() != b * out_w {
        bail!(ShapeMismatch: "Y and dY must have shape [{b}, {out_w}]");
    }
    let xs = x.as_slice::<f32>()?;
    let dims = x.dims().to_vec();
    let dx = outs.tensor(0)?.try_ensure::<f32>(&dims)?;
    for bi in 0..b {
        for i in 0..m {
            for j in 0..n {
                let k = (bi * m + i) * n + j;
                let o = bi * out_w + if rowwise { i } else { j };
                dx[k] = if xs[k] == y[o] { dy[o] } else { 0.0 };
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn front_and_back_sums_with_lengths() {
        let ws = Workspace::new();
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        ws.feed("x", Tensor::from_vec(&[2, 3], x).unwrap());
        ws.feed("l", Tensor::from_vec(&[3], vec![1i32, 2, 0]).unwrap());
        ws.run_operator_once(&OperatorDef::new("ReduceFrontSum", ["x", "l"], ["y"]))
            .unwrap();
        assert_eq!(
            ws.fetch("y").unwrap().as_slice::<f32>().unwrap(),
            &[0.0, 5.0, 0.0]
        );
        ws.feed("lb", Tensor::from_vec(&[2], vec![2i32, 3]).unwrap());
        ws.run_operator_once(&OperatorDef::new("ReduceBackMean", ["x", "lb"], ["z"]))
            .unwrap();
        assert_eq!(
            ws.fetch("z").unwrap().as_slice::<f32>().unwrap(),
            &[0.5, 4.0]
        );
        let bad = Tensor::from_vec(&[3], vec![1i32, 9, 0]).unwrap();
        ws.feed("l", bad);
        let e = ws
            .run_operator_once(&OperatorDef::new("ReduceFrontSum", ["x", "l"], ["y"]))
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::BadArgument);
    }
}
