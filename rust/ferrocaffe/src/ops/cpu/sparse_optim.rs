//! Sparse optimizers: SparseAdam (with the optional RAdam rectification and effective-gradient
//! output) and SparseMomentumSGDUpdate.
//!
//! Both update the rows `INDICES[k]` of the parameter and its state with the gradient slice
//! `GRAD[k]` (the rows of GRAD follow the shape of INDICES), one index after the other, so a
//! repeated index is updated twice. The state is updated in place (the schemas enforce it);
//! an output that is not its input's blob gets the input's values first.

use super::optim::{scalar, state_to_output};
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::DataType;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("SparseAdam", create_sparse_adam);
    r.cpu("SparseMomentumSGDUpdate", create_sparse_momentum);
}

/// The rows to update and the row size, after the shape checks shared by the sparse
/// optimizers (here and in `rowwise_optim`): the state inputs `state` have as many values as
/// PARAM, INDICES holds int32 or int64 values within PARAM's rows, and GRAD's dimensions after
/// those of INDICES are PARAM's after the first.
pub(super) fn sparse_rows(
    ctx: &OpContext<'_>,
    param: usize,
    state: &[usize],
    indices: usize,
    grad: usize,
) -> Result<(Vec<usize>, usize)> {
    let p = ctx.input(param)?;
    let rows = *p.dims().first().ok_or_else(|| {
        err!(
            ShapeMismatch: "input {param} ('{}') must have at least one dimension",
            ctx.input_name(param)
        )
    })?;
    for &s in state {
        if ctx.input(s)?.numel() != p.numel() {
            bail!(
                ShapeMismatch: "input {s} ('{}') has {} values, expected {} (the size of '{}')",
                ctx.input_name(s),
                ctx.input(s)?.numel(),
                p.numel(),
                ctx.input_name(param)
            );
        }
    }
    let idx_t = ctx.input(indices)?;
    if !matches!(idx_t.dtype(), DataType::Int32 | DataType::Int64) {
        bail!(
            DtypeMismatch: "input {indices} ('{}') must hold int32 or int64 indices, got {}",
            ctx.input_name(indices),
            idx_t.dtype()
        );
    }
    let g = ctx.input(grad)?;
    let block = p.size_from_dim(1);
    let g_block = if idx_t.ndim() <= g.ndim() {
        g.size_from_dim(idx_t.ndim())
    } else {
        usize::MAX
    };
    if g_block != block || g.numel() != idx_t.numel() * block {
        bail!(
            ShapeMismatch: "'{}' {:?} must be the rows of '{}' {:?} at the indices '{}' {:?}",
            ctx.input_name(grad),
            g.dims(),
            ctx.input_name(param),
            p.dims(),
            ctx.input_name(indices),
            idx_t.dims()
        );
    }
    let idx = idx_t
        .to_i64_vec()?
        .into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .filter(|&r| r < rows)
                .ok_or_else(|| {
                    err!(
                        BadArgument: "index {i} of '{}' out of range for '{}' with {rows} rows",
                        ctx.input_name(indices),
                        ctx.input_name(param)
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((idx, block))
}

// -- SparseAdam ---------------------------------------------------------------------------

/// Coefficients of one SparseAdam step (iteration t = iter + 1).
#[derive(Clone, Copy, Debug)]
struct AdamStep {
    eps: f32,
    /// sqrt(1 - beta2^t) / (1 - beta1^t).
    correction: f64,
    /// 1 / (1 - beta1^t), the step while RAdam's variance is not tractable.
    beta1_correction: f64,
    /// None without RAdam; with it `Some(None)` while rho_t < 5 (the step then ignores the
    /// second moment) and `Some(Some(r_t))`, the rectification, afterwards.
    radam: Option<Option<f32>>,
}

impl AdamStep {
    fn new(beta1: f32, beta2: f32, eps: f32, radam: bool, iter: i64) -> AdamStep {
        let t = iter.saturating_add(1) as f64;
        let b1t = (beta1 as f64).powf(t);
        let b2t = (beta2 as f64).powf(t);
        let correction = (1.0 - b2t).sqrt() / (1.0 - b1t);
        let rectified = radam.then(|| {
            // rho_inf = 2 / (1 - beta2) - 1 and rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t);
            // r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t)).
            let rho_inf = (2.0 / (1.0 - beta2) - 1.0) as f64;
            let rho_t = rho_inf - 2.0 * t * b2t / (1.0 - b2t);
            (rho_t >= 5.0).then(|| {
                let r_corr = (rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0))).sqrt();
                (((rho_t - 4.0) * (rho_t - 2.0) / rho_t).sqrt() * r_corr) as f32
            })
        });
        AdamStep {
            eps,
            correction,
            beta1_correction: 1.0 / (1.0 - b1t),
            radam: rectified,
        }
    }

    /// The effective gradient (the step before the learning rate) for the new moments, in
    /// double precision when `wide` (Caffe2's one-value rows) and in single otherwise.
    fn effective(&self, m: f32, v: f32, wide: bool) -> f64 {
        let denom = v.sqrt() + self.eps;
        if wide {
            match self.radam {
                Some(None) => self.beta1_correction * m as f64,
                Some(Some(r)) => r as f64 * self.correction * m as f64 / denom as f64,
                None => self.correction * m as f64 / denom as f64,
            }
        } else {
            let f = match self.radam {
                Some(None) => self.beta1_correction as f32 * m,
                Some(Some(r)) => r * self.correction as f32 * m / denom,
                None => self.correction as f32 * m / denom,
            };
            f as f64
        }
    }
}

fn create_sparse_adam(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let beta1 = init.args.float("beta1", 0.9)?;
    let beta2 = init.args.float("beta2", 0.999)?;
    let eps = init.args.float("epsilon", 1e-5)?;
    let radam = init.args.bool("enableRAdam", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        sparse_adam(ctx, beta1, beta2, eps, radam)
    })))
}

/// Inputs (param, moment_1, moment_2, indices, grad, lr, iter); outputs (param, moment_1,
/// moment_2[, effective grad]).
fn sparse_adam(ctx: &mut OpContext<'_>, b1: f32, b2: f32, eps: f32, radam: bool) -> Result<()> {
    let (idx, block) = sparse_rows(ctx, 0, &[1, 2], 3, 4)?;
    let lr = scalar(ctx, 5)?;
    let iter = *ctx.input(6)?.to_i64_vec()?.first().ok_or_else(
        || err!(ShapeMismatch: "input 6 ('{}') (the iteration) is empty", ctx.input_name(6)),
    )?;
    let step = AdamStep::new(b1, b2, eps, radam, iter);
    let g = ctx.input(4)?.as_slice::<f32>()?.to_vec();
    let g_dims = ctx.input(4)?.dims().to_vec();
    for k in 0..3 {
        state_to_output(ctx, k, k)?;
    }
    let mut m1 = ctx.output(1)?.as_slice::<f32>()?.to_vec();
    let mut m2 = ctx.output(2)?.as_slice::<f32>()?.to_vec();
    let with_grad = ctx.num_outputs() > 3;
    let wide = block == 1;
    let mut ng = vec![0f32; if with_grad { g.len() } else { 0 }];
    {
        let p = ctx.output(0)?.as_mut_slice::<f32>()?;
        for (k, &row) in idx.iter().enumerate() {
            for j in 0..block {
                let (pi, gi) = (row * block + j, g[k * block + j]);
                m1[pi] = m1[pi] * b1 + gi * (1.0 - b1);
                m2[pi] = m2[pi] * b2 + gi * gi * (1.0 - b2);
                let eff = step.effective(m1[pi], m2[pi], wide);
                if with_grad {
                    let e = eff as f32;
                    ng[k * block + j] = e;
                    p[pi] += lr * e;
                } else if wide {
                    p[pi] = (p[pi] as f64 + lr as f64 * eff) as f32;
                } else {
                    p[pi] += lr * eff as f32;
                }
            }
        }
    }
    ctx.output(1)?.as_mut_slice::<f32>()?.copy_from_slice(&m1);
    ctx.output(2)?.as_mut_slice::<f32>()?.copy_from_slice(&m2);
    if with_grad {
        ctx.output(3)?.ensure::<f32>(&g_dims).copy_from_slice(&ng);
    }
    Ok(())
}

// -- SparseMomentumSGDUpdate -------------------------------------------------------------------

fn create_sparse_momentum(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let momentum = init.args.float("momentum", 0.0)?;
    let nesterov = init.args.bool("nesterov", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        sparse_momentum(ctx, momentum, nesterov)
    })))
}

/// Inputs (grad, moment, lr, param, indices); outputs (grad, moment, param). Per element:
/// plainly `m' = lr g + mu m`, the step being m'; with Nesterov `m' = mu m + lr g` and the
/// step `(1 + mu) m' - mu m`. The step is written to the grad output and taken off param.
fn sparse_momentum(ctx: &mut OpContext<'_>, mu: f32, nesterov: bool) -> Result<()> {
    let lr = scalar(ctx, 2)?;
    let (idx, block) = sparse_rows(ctx, 3, &[1], 4, 0)?;
    let g = ctx.input(0)?.as_slice::<f32>()?.to_vec();
    let g_dims = ctx.input(0)?.dims().to_vec();
    state_to_output(ctx, 1, 1)?;
    state_to_output(ctx, 3, 2)?;
    let mut m = ctx.output(1)?.as_slice::<f32>()?.to_vec();
    let mut ng = vec![0f32; g.len()];
    {
        let p = ctx.output(2)?.as_mut_slice::<f32>()?;
        for (k, &row) in idx.iter().enumerate() {
            for j in 0..block {
                let (pi, gi) = (row * block + j, k * block + j);
                let step = if nesterov {
                    let m_new = mu * m[pi] + lr * g[gi];
                    let s = (1.0 + mu) * m_new - mu * m[pi];
                    m[pi] = m_new;
                    s
                } else {
                    let adjusted = lr * g[gi] + mu * m[pi];
                    m[pi] = adjusted;
                    adjusted
                };
                ng[gi] = step;
                p[pi] -= step;
            }
        }
    }
    ctx.output(1)?.as_mut_slice::<f32>()?.copy_from_slice(&m);
    ctx.output(0)?.ensure::<f32>(&g_dims).copy_from_slice(&ng);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn f32s(ws: &Workspace, name: &str) -> Vec<f32> {
        ws.fetch(name).unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    fn close(a: &[f32], b: &[f64]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!(
                (*x as f64 - y).abs() < 1e-6 * (1.0 + y.abs()),
                "{a:?} vs {b:?}"
            );
        }
    }

    fn momentum_ws() -> std::sync::Arc<Workspace> {
        let ws = Workspace::new();
        ws.feed(
            "param",
            Tensor::from_vec(&[3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
        );
        ws.feed("mom", Tensor::from_vec(&[3, 2], vec![0.5f32; 6]).unwrap());
        ws.feed("lr", Tensor::from_vec(&[1], vec![0.1f32]).unwrap());
        ws.feed("idx", Tensor::from_vec(&[2], vec![2i64, 0]).unwrap());
        ws.feed(
            "g",
            Tensor::from_vec(&[2, 2], vec![1.0f32, -1.0, 2.0, 4.0]).unwrap(),
        );
        ws
    }

    fn momentum_op(nesterov: bool) -> OperatorDef {
        let mut op = OperatorDef::new(
            "SparseMomentumSGDUpdate",
            ["g", "mom", "lr", "param", "idx"],
            ["g_out", "mom", "param"],
        );
        op.arg.push(Argument::float("momentum", 0.9));
        op.arg.push(Argument::int("nesterov", i64::from(nesterov)));
        op
    }

    #[test]
    fn sparse_momentum_plain_updates_only_indexed_rows() {
        let ws = momentum_ws();
        ws.run_operator_once(&momentum_op(false)).unwrap();
        // Row 2 with g = [1, -1]: m' = 0.1 g + 0.9 * 0.5 = [0.55, 0.35]; row 0 with [2, 4]:
        // [0.65, 0.85]. The step is m' and the parameter loses it.
        close(&f32s(&ws, "g_out"), &[0.55, 0.35, 0.65, 0.85]);
        close(&f32s(&ws, "mom"), &[0.65, 0.85, 0.5, 0.5, 0.55, 0.35]);
        close(
            &f32s(&ws, "param"),
            &[1.0 - 0.65, 2.0 - 0.85, 3.0, 4.0, 5.0 - 0.55, 6.0 - 0.35],
        );
        assert_eq!(ws.fetch("g_out").unwrap().dims(), &[2, 2]);
    }

    #[test]
    fn sparse_momentum_nesterov() {
        let ws = momentum_ws();
        ws.run_operator_once(&momentum_op(true)).unwrap();
        // m' as above; step = 1.9 m' - 0.9 * 0.5.
        let step = |m: f64| 1.9 * m - 0.45;
        close(
            &f32s(&ws, "g_out"),
            &[step(0.55), step(0.35), step(0.65), step(0.85)],
        );
        close(&f32s(&ws, "mom"), &[0.65, 0.85, 0.5, 0.5, 0.55, 0.35]);
        close(
            &f32s(&ws, "param"),
            &[
                1.0 - step(0.65),
                2.0 - step(0.85),
                3.0,
                4.0,
                5.0 - step(0.55),
                6.0 - step(0.35),
            ],
        );
    }

    #[test]
    fn sparse_momentum_errors_name_blobs() {
        let ws = momentum_ws();
        ws.feed("idx", Tensor::from_vec(&[2], vec![3i64, 0]).unwrap());
        let e = ws
            .run_operator_once(&momentum_op(false))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("index 3 of 'idx'") && e.contains("'param'"),
            "{e}"
        );
        let ws = momentum_ws();
        ws.feed("g", Tensor::from_vec(&[2, 3], vec![0.0f32; 6]).unwrap());
        let e = ws
            .run_operator_once(&momentum_op(false))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'g' [2, 3]") && e.contains("'param' [3, 2]"),
            "{e}"
        );
    }

    fn adam_ws(block: usize) -> std::sync::Arc<Workspace> {
        let ws = Workspace::new();
        let n = 3 * block;
        ws.feed(
            "p",
            Tensor::from_vec(&[3, block], (0..n).map(|v| v as f32).collect()).unwrap(),
        );
        ws.feed(
            "m1",
            Tensor::from_vec(&[3, block], vec![0.1f32; n]).unwrap(),
        );
        ws.feed(
            "m2",
            Tensor::from_vec(&[3, block], vec![0.04f32; n]).unwrap(),
        );
        ws.feed("idx", Tensor::from_vec(&[1], vec![1i32]).unwrap());
        ws.feed(
            "g",
            Tensor::from_vec(&[1, block], vec![0.5f32; block]).unwrap(),
        );
        ws.feed("lr", Tensor::from_vec(&[1], vec![-0.01f32]).unwrap());
        ws.feed("it", Tensor::from_vec(&[1], vec![1i64]).unwrap());
        ws
    }

    fn adam_op(outs: &[&str], radam: bool) -> OperatorDef {
        let mut op = OperatorDef::new(
            "SparseAdam",
            ["p", "m1", "m2", "idx", "g", "lr", "it"],
            outs.iter().copied(),
        );
        op.arg.push(Argument::float("beta1", 0.5));
        op.arg.push(Argument::float("beta2", 0.75));
        op.arg.push(Argument::float("epsilon", 0.1));
        op.arg.push(Argument::int("enableRAdam", i64::from(radam)));
        op
    }

    #[test]
    fn sparse_adam_matches_hand_computation() {
        // t = 2: m1' = 0.5 * 0.1 + 0.5 * 0.5 = 0.3; m2' = 0.75 * 0.04 + 0.25 * 0.25 = 0.0925;
        // correction = sqrt(1 - 0.75^2) / (1 - 0.5^2); effective gradient
        // correction * 0.3 / (sqrt(0.0925) + 0.1), the step -0.01 times it.
        let corr = (1.0f64 - 0.5625).sqrt() / 0.75;
        let eff = corr * 0.3 / (0.0925f64.sqrt() + 0.1);
        for block in [1usize, 2] {
            let ws = adam_ws(block);
            ws.run_operator_once(&adam_op(&["p", "m1", "m2"], false))
                .unwrap();
            let mut want_p: Vec<f64> = (0..3 * block).map(|v| v as f64).collect();
            let mut want_m1 = vec![0.1; 3 * block];
            let mut want_m2 = vec![0.04; 3 * block];
            for j in block..2 * block {
                want_p[j] -= 0.01 * eff;
                want_m1[j] = 0.3;
                want_m2[j] = 0.0925;
            }
            close(&f32s(&ws, "p"), &want_p);
            close(&f32s(&ws, "m1"), &want_m1);
            close(&f32s(&ws, "m2"), &want_m2);
            let ws = adam_ws(block);
            ws.run_operator_once(&adam_op(&["p", "m1", "m2", "eff"], false))
                .unwrap();
            close(&f32s(&ws, "eff"), &vec![eff; block]);
            close(&f32s(&ws, "p"), &want_p);
        }
    }

    #[test]
    fn radam_rectification() {
        // beta2 = 0.75: rho_inf = 7, and at t = 2 rho_t = 7 - 4 * 0.5625 / 0.4375 < 5, so the
        // step is the bias-corrected first moment: 0.3 / (1 - 0.25).
        let ws = adam_ws(2);
        ws.run_operator_once(&adam_op(&["p", "m1", "m2", "eff"], true))
            .unwrap();
        close(&f32s(&ws, "eff"), &[0.4, 0.4]);
        close(
            &f32s(&ws, "p"),
            &[0.0, 1.0, 2.0 - 0.004, 3.0 - 0.004, 4.0, 5.0],
        );
        // Far along, rho_t >= 5 and the step is r_t times the Adam step.
        let s = AdamStep::new(0.9, 0.999, 1e-8, true, 999);
        let t = 1000.0f64;
        let (b2t, rho_inf) = (0.999f64.powf(t), 2.0 / 0.001 - 1.0);
        let rho_t = rho_inf - 2.0 * t * b2t / (1.0 - b2t);
        let r = ((rho_t - 4.0) * (rho_t - 2.0) * rho_inf
            / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
            .sqrt();
        let got = s.radam.flatten().unwrap() as f64;
        assert!((got - r).abs() < 1e-5 * r, "{got} vs {r}");
        assert_eq!(AdamStep::new(0.9, 0.999, 1e-8, false, 999).radam, None);
    }
}
