//! Fully connected layers: FC (`Y = X W^T + b`), FCTransposed (`Y = X W + b`) and their
//! gradient ops, on [`crate::blas::GemmContext::sgemm`] in the op context's GEMM context.
//!
//! X is flattened to `M x K` at `axis` (default 1), W to `N x K` (`K x N` transposed) at
//! `axis_w` (default 1); Y has X's dims before `axis` followed by N.

use super::elementwise::Dims;
use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::Tensor;
use crate::{bail, err};

/// Registers the FC family.
pub fn register(r: &mut Registry) {
    r.cpu("FC", |i| create(i, false, false));
    r.cpu("FCTransposed", |i| create(i, true, false));
    r.cpu("FCGradient", |i| create(i, false, true));
    r.cpu("FCTransposedGradient", |i| create(i, true, true));
}

use crate::blas::{for_each_part, part_len};

struct Fc {
    axis: isize,
    axis_w: isize,
    transposed: bool,
    gradient: bool,
    /// Gradient ops only: add dW (output 0) and/or db (output 1) into the existing output
    /// instead of overwriting it. Set through [`ACCUMULATE_ARG`] by `RecurrentNetworkGradient`,
    /// which sums parameter gradients over timesteps this way (no per-step temporary).
    accumulate: [bool; 2],
    /// Gradient ops only: leave dW (output 0) and/or db (output 1) alone; set through
    /// [`DEFERRED_ARG`] by `RecurrentNetworkGradient`, which sums them after the steps.
    deferred: [bool; 2],
    /// Forward only: an in-place Relu on Y folded into this op ([`Operator::fuse_relu`]).
    relu: bool,
}

/// Internal argument of `FCGradient` / `FCTransposedGradient`: output indices (0: dW, 1: db)
/// to accumulate into, which must already hold a tensor of the right shape.
pub const ACCUMULATE_ARG: &str = "rnn_internal_accumulate_outputs";

/// Internal argument of `FCGradient`: output indices (0: dW, 1: db) not computed here
/// (`RecurrentNetworkGradient` adds them up over all timesteps in one product afterwards).
pub const DEFERRED_ARG: &str = "rnn_internal_deferred_outputs";

fn canonical(axis: isize, nd: usize) -> Option<usize> {
    let a = if axis < 0 { axis + nd as isize } else { axis };
    (0..=nd as isize).contains(&a).then_some(a as usize)
}

impl Fc {
    /// (M, K, N, y_dims) after checking the shapes.
    fn sizes(&self, x: &Tensor, w: &Tensor) -> Result<(usize, usize, usize, Dims)> {
        let ax = canonical(self.axis, x.ndim()).ok_or_else(
            || err!(BadArgument: "axis {} out of range for X of shape {:?}", self.axis, x.dims()),
        )?;
        let axw = canonical(self.axis_w, w.ndim()).ok_or_else(|| {
            err!(BadArgument: "axis_w {} out of range for W of shape {:?}", self.axis_w, w.dims())
        })?;
        let m = x.size_to_dim(ax);
        let k = x.size_from_dim(ax);
        let (n, kw) = if self.transposed {
            (w.size_from_dim(axw), w.size_to_dim(axw))
        } else {
            (w.size_to_dim(axw), w.size_from_dim(axw))
        };
        if k != kw {
            bail!(
                ShapeMismatch: "Dimension mismatch: X: {:?}, W: {:?} (K = {k} from X, {kw} from W)",
                x.dims(),
                w.dims()
            );
        }
        let mut y_dims = Dims::from_slice(&x.dims()[..ax]);
        y_dims.push(n);
        Ok((m, k, n, y_dims))
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let b = ins.tensor(2)?;
        let (m, k, n, y_dims) = self.sizes(x, w)?;
        if b.numel() != n {
            bail!(ShapeMismatch: "bias has {} values, expected N = {n}", b.numel());
        }
        let (xs, ws, bs) = (
            x.as_slice::<f32>()?,
            w.as_slice::<f32>()?,
            b.as_slice::<f32>()?,
        );
        let y = outs.tensor(0)?.ensure::<f32>(&y_dims);
        gemm.sgemm_bias(false, !self.transposed, m, n, k, xs, ws, bs, y);
        if self.relu {
            // Over Y while it is in cache.
            super::math::relu_in_place(y);
        }
        Ok(())
    }

    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let dy = ins.tensor(2)?;
        let (m, k, n, _) = self.sizes(x, w)?;
        if dy.numel() != m * n {
            bail!(ShapeMismatch: "dY has {} values, expected M x N = {m} x {n}", dy.numel());
        }
        let (xs, ws, dys) = (
            x.as_slice::<f32>()?,
            w.as_slice::<f32>()?,
            dy.as_slice::<f32>()?,
        );
        let w_dims = w.dims().to_vec();
        let x_dims = x.dims().to_vec();
        if !self.deferred[0] {
            let dw_t = outs.tensor(0)?;
            let beta = self.accumulated(0, dw_t, &w_dims)?;
            let dw = dw_t.ensure::<f32>(&w_dims);
            if self.transposed {
                gemm.sgemm(true, false, k, n, m, 1.0, xs, dys, beta, dw);
            } else {
                gemm.sgemm(true, false, n, k, m, 1.0, dys, xs, beta, dw);
            }
        }
        if !self.deferred[1] {
            let db_t = outs.tensor(1)?;
            let beta = self.accumulated(1, db_t, &[n])?;
            let db = db_t.ensure::<f32>(&[n]);
            if beta == 0.0 {
                db.fill(0.0);
            }
            add_column_sums(dys, m, db);
        }
        if outs.len() > 2 {
            let dx = outs.tensor(2)?.ensure::<f32>(&x_dims);
            gemm.sgemm(false, self.transposed, m, k, n, 1.0, dys, ws, 0.0, dx);
        }
        Ok(())
    }
}

impl Fc {
    /// The GEMM beta for gradient output `i`: 1 when it accumulates (after checking that the
    /// output already holds a float tensor of shape `dims`), else 0.
    fn accumulated(&self, i: usize, t: &Tensor, dims: &[usize]) -> Result<f32> {
        if !self.accumulate[i] {
            return Ok(0.0);
        }
        if t.dtype() != crate::tensor::DataType::Float || t.dims() != dims {
            bail!(
                DtypeMismatch: "gradient output {i} accumulates into a tensor of {:?} {:?}, \
                 expected float {dims:?}",
                t.dtype(),
                t.dims()
            );
        }
        Ok(1.0)
    }
}

/// `db += ` the column sums of `dy` (`m` rows of `db.len()` columns), in parts of columns
/// shared with the GEMM helper thread; each column is summed in row order, whatever the parts.
pub fn add_column_sums(dy: &[f32], m: usize, db: &mut [f32]) {
    let n = db.len();
    let per = part_len(n, m * n);
    for_each_part(db.chunks_mut(per).enumerate().collect(), &|(p, db)| {
        for row in dy.chunks(n.max(1)).take(m) {
            for (d, v) in db.iter_mut().zip(&row[p * per..]) {
                *d += v;
            }
        }
    });
}

impl Operator for Fc {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            self.backward(ctx)
        } else {
            self.forward(ctx)
        }
    }

    /// FC -> in-place Relu: one dispatch and one pass over Y fewer.
    fn fuse_relu(&mut self) -> bool {
        self.relu = !self.gradient;
        self.relu
    }
}

fn create(init: &OpInit<'_>, transposed: bool, gradient: bool) -> Result<Box<dyn Operator>> {
    Ok(Box::new(Fc {
        axis: init.args.int("axis", 1)? as isize,
        axis_w: init.args.int("axis_w", 1)? as isize,
        transposed,
        gradient,
        accumulate: {
            let outs = init.args.ints(ACCUMULATE_ARG);
            [outs.contains(&0), outs.contains(&1)]
        },
        deferred: {
            let outs = init.args.ints(DEFERRED_ARG);
            [outs.contains(&0), outs.contains(&1)]
        },
        relu: false,
    }))
}
