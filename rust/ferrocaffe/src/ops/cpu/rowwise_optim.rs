//! Sparse optimizers with per-row state: RowWiseSparseAdagrad, RowWiseSparseAdam,
//! SmartDecaySparseAdam, and RowWiseCounter (the per-row update frequency used by
//! RowWiseSparseAdagrad's weight decay).
//!
//! Each updates the rows `INDICES[k]` of the parameter (and its state) with the gradient slice
//! `GRAD[k]`, one index after the other (a repeated index is updated twice). The state is
//! updated in place (the schemas enforce it); an output that is not its input's blob gets the
//! input's values first. Indices are int32 or int64 and must lie in `[0, rows)`.
//!
//! - `RowWiseSparseAdagrad(param, moment, indices, grad, lr[, counter]) -> (param, moment)`:
//!   one moment value per row. With `g = grad + weight_decay * freq * w` (`freq =
//!   counter_halflife / counter[row]` when the counter input is given and positive there, else
//!   1): `moment += mean(g^2)`, `w += lr * g / (sqrt(moment) + epsilon)`. Arguments `epsilon`
//!   (1e-5), `weight_decay` (0), `counter_halflife` (-1).
//! - `RowWiseSparseAdam(param, m1, m2, indices, grad, lr, iter) -> (param, m1, m2[, grad'])`:
//!   Adam with one second moment per row (`m2 = beta2 * m2 + (1 - beta2) * mean(g^2)`) and the
//!   bias correction `sqrt(1 - beta2^t) / (1 - beta1^t)`, `t = iter + 1`; the optional output is
//!   the effective gradient (the step before the learning rate), shaped like GRAD.
//! - `SmartDecaySparseAdam(param, m1, m2, last_seen, indices, grad, lr, iter) ->
//!   (param, m1, m2, last_seen)`: Adam without bias correction whose moments decay by
//!   `beta^k`, `k = t - last_seen[row]` the steps since the row was last updated, plus the
//!   first-moment updates skipped meanwhile: `catchup = m1 * beta1 * (1 - beta1^(k-1)) /
//!   (1 - beta1)` when k > 1; `w += lr * (m1' + catchup) / (sqrt(m2') + epsilon)`, and
//!   `last_seen[row] = t`.
//! - `RowWiseCounter(prev_iter, counter, indices, iter) -> (prev_iter, counter)`: with
//!   `counter_halflife` > 0, for each index `counter = 1 + 2^(-max(0, iter - prev_iter) /
//!   halflife) * counter` and `prev_iter = max(iter, prev_iter)`; otherwise nothing changes.
//!   prev_iter is int64, counter double.
//!
//! The Adam ops take `beta1` (0.9), `beta2` (0.999) and `epsilon` (1e-5).

use super::optim::{scalar, state_to_output};
use super::sparse_optim;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("RowWiseSparseAdagrad", create_adagrad);
    r.cpu("RowWiseSparseAdam", |i| create_adam(i, false));
    r.cpu("SmartDecaySparseAdam", |i| create_adam(i, true));
    r.cpu("RowWiseCounter", create_counter);
}

/// The first int64 value of input `i` (the iteration).
fn iteration(ctx: &OpContext<'_>, i: usize) -> Result<i64> {
    let t = ctx.input(i)?;
    if t.dtype() != DataType::Int64 || t.numel() != 1 {
        bail!(
            DtypeMismatch: "input {i} ('{}') must be one int64 (the iteration), got {} of shape \
             {:?}",
            ctx.input_name(i),
            t.dtype(),
            t.dims()
        );
    }
    Ok(t.as_slice::<i64>()?[0])
}

/// Checks that input `i` holds `n` values of `dtype`.
fn expect(ctx: &OpContext<'_>, i: usize, dtype: DataType, n: usize, what: &str) -> Result<()> {
    let t = ctx.input(i)?;
    if t.dtype() != dtype || t.numel() != n {
        bail!(
            DtypeMismatch: "input {i} ('{}') must hold {n} {dtype} values ({what}), got {} of \
             shape {:?}",
            ctx.input_name(i),
            t.dtype(),
            t.dims()
        );
    }
    Ok(())
}

/// Rows of `param` to update (checked), the row size and PARAM's row count, for GRAD being
/// the rows at INDICES (the checks of [`sparse_optim::sparse_rows`], no full-size state).
fn sparse_rows(
    ctx: &OpContext<'_>,
    param: usize,
    indices: usize,
    grad: usize,
) -> Result<(Vec<usize>, usize, usize)> {
    let (idx, block) = sparse_optim::sparse_rows(ctx, param, &[], indices, grad)?;
    let rows = ctx.input(param)?.dims()[0];
    Ok((idx, block, rows))
}

/// Float values of output `j` for in-place update.
fn floats_mut(t: &mut Tensor) -> Result<&mut [f32]> {
    t.as_mut_slice::<f32>()
}

/// The output tensors, one per output (repeated output blobs are refused).
fn all_outputs<'c>(
    outs: &'c mut crate::ops::operator::Outputs<'_, '_>,
) -> Result<Vec<&'c mut Tensor>> {
    let n = outs.len();
    let v = outs.tensors();
    if v.len() != n {
        bail!(Schema: "the outputs of this op must be distinct blobs");
    }
    Ok(v)
}

// -- RowWiseSparseAdagrad -------------------------------------------------------------------

fn create_adagrad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let eps = init.args.float("epsilon", 1e-5)?;
    let wd = init.args.float("weight_decay", 0.0)?;
    let halflife = init.args.int("counter_halflife", -1)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        rowwise_adagrad(ctx, eps, wd, halflife as f64)
    })))
}

fn rowwise_adagrad(ctx: &mut OpContext<'_>, eps: f32, wd: f32, halflife: f64) -> Result<()> {
    let (idx, block, rows) = sparse_rows(ctx, 0, 2, 3)?;
    expect(ctx, 1, DataType::Float, rows, "one moment per row")?;
    let lr = scalar(ctx, 4)?;
    let counter = if ctx.num_inputs() > 5 {
        let c = ctx.input(5)?;
        if c.dtype() != DataType::Double || c.numel() < rows {
            bail!(
                ShapeMismatch: "input 5 ('{}') (the counter) must hold at least {rows} double \
                 values, got {} of shape {:?}",
                ctx.input_name(5),
                c.dtype(),
                c.dims()
            );
        }
        Some(c.as_slice::<f64>()?.to_vec())
    } else {
        None
    };
    state_to_output(ctx, 0, 0)?;
    state_to_output(ctx, 1, 1)?;
    let (ins, mut outs) = ctx.split();
    let g = ins.tensor(3)?.as_slice::<f32>()?;
    let mut o = all_outputs(&mut outs)?;
    let (p_out, rest) = o.split_at_mut(1);
    let w = floats_mut(p_out[0])?;
    let h = floats_mut(rest[0])?;
    for (k, &r) in idx.iter().enumerate() {
        let freq = match &counter {
            Some(c) if c[r] > 0.0 => (halflife / c[r]) as f32,
            _ => 1.0,
        };
        let decay = wd * freq;
        let row = &mut w[r * block..(r + 1) * block];
        let gk = &g[k * block..(k + 1) * block];
        let sq: f32 = row
            .iter()
            .zip(gk)
            .map(|(&wj, &gj)| {
                let v = decay.mul_add(wj, gj);
                v * v
            })
            .sum();
        h[r] += sq / block as f32;
        let step = lr / (h[r].sqrt() + eps);
        for (wj, &gj) in row.iter_mut().zip(gk) {
            *wj += decay.mul_add(*wj, gj) * step;
        }
    }
    Ok(())
}

// -- RowWiseSparseAdam / SmartDecaySparseAdam ---------------------------------------------

#[derive(Clone, Copy)]
struct Betas {
    b1: f32,
    b2: f32,
    eps: f32,
}

fn create_adam(init: &OpInit<'_>, smart_decay: bool) -> Result<Box<dyn Operator>> {
    let b = Betas {
        b1: init.args.float("beta1", 0.9)?,
        b2: init.args.float("beta2", 0.999)?,
        eps: init.args.float("epsilon", 1e-5)?,
    };
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        if smart_decay {
            smart_decay_adam(ctx, b)
        } else {
            rowwise_adam(ctx, b)
        }
    })))
}

fn rowwise_adam(ctx: &mut OpContext<'_>, b: Betas) -> Result<()> {
    let (idx, block, rows) = sparse_rows(ctx, 0, 3, 4)?;
    let n = ctx.input(0)?.numel();
    expect(ctx, 1, DataType::Float, n, "the size of param")?;
    expect(ctx, 2, DataType::Float, rows, "one second moment per row")?;
    let lr = scalar(ctx, 5)?;
    let t = iteration(ctx, 6)?.saturating_add(1);
    let t = i32::try_from(t).unwrap_or(i32::MAX);
    // Caffe2 computes the correction (and the steps using it) in double precision.
    let correction = (1.0 - (b.b2 as f64).powi(t)).sqrt() / (1.0 - (b.b1 as f64).powi(t));
    let g_dims = ctx.input(4)?.dims().to_vec();
    for k in 0..3 {
        state_to_output(ctx, k, k)?;
    }
    let with_grad = ctx.num_outputs() > 3;
    let (ins, mut outs) = ctx.split();
    let g = ins.tensor(4)?.as_slice::<f32>()?;
    let mut o = all_outputs(&mut outs)?;
    if with_grad {
        o[3].reset(DataType::Float, &g_dims);
    }
    let (state, extra) = o.split_at_mut(3);
    let [w, m1, m2] = state else {
        bail!(Schema: "RowWiseSparseAdam needs 3 or 4 outputs");
    };
    let (w, m1, m2) = (floats_mut(w)?, floats_mut(m1)?, floats_mut(m2)?);
    let mut ng = match extra.first_mut() {
        Some(t) => Some(floats_mut(t)?),
        None => None,
    };
    for (k, &r) in idx.iter().enumerate() {
        let gk = &g[k * block..(k + 1) * block];
        let mean_sq = gk.iter().map(|v| v * v).sum::<f32>() / block as f32;
        m2[r] = m2[r] * b.b2 + mean_sq * (1.0 - b.b2);
        let denom = m2[r].sqrt() + b.eps;
        for (j, &gj) in gk.iter().enumerate() {
            let pi = r * block + j;
            let mi = m1[pi] * b.b1 + gj * (1.0 - b.b1);
            m1[pi] = mi;
            match ng.as_deref_mut() {
                Some(ng) => {
                    let e = (correction * mi as f64 / denom as f64) as f32;
                    ng[k * block + j] = e;
                    w[pi] += lr * e;
                }
                None => {
                    w[pi] =
                        (w[pi] as f64 + lr as f64 * correction * mi as f64 / denom as f64) as f32;
                }
            }
        }
    }
    Ok(())
}

fn smart_decay_adam(ctx: &mut OpContext<'_>, b: Betas) -> Result<()> {
    let (idx, block, rows) = sparse_rows(ctx, 0, 4, 5)?;
    let n = ctx.input(0)?.numel();
    expect(ctx, 1, DataType::Float, n, "the size of param")?;
    expect(ctx, 2, DataType::Float, n, "the size of param")?;
    expect(ctx, 3, DataType::Int64, rows, "one iteration per row")?;
    let lr = scalar(ctx, 6)?;
    let t = iteration(ctx, 7)?.saturating_add(1);
    for k in 0..4 {
        state_to_output(ctx, k, k)?;
    }
    let (ins, mut outs) = ctx.split();
    let g = ins.tensor(5)?.as_slice::<f32>()?;
    let mut o = all_outputs(&mut outs)?;
    let (f, seen) = o.split_at_mut(3);
    let last_seen = seen[0].as_mut_slice::<i64>()?;
    let [w, m1, m2] = f else {
        bail!(Schema: "SmartDecaySparseAdam needs 4 outputs");
    };
    let (w, m1, m2) = (floats_mut(w)?, floats_mut(m1)?, floats_mut(m2)?);
    for (k, &r) in idx.iter().enumerate() {
        let steps = t.saturating_sub(last_seen[r]) as f32;
        last_seen[r] = t;
        let b1k = b.b1.powf(steps);
        let b2k = b.b2.powf(steps);
        let catch = if steps > 1.0 {
            b.b1 * (1.0 - b.b1.powf(steps - 1.0)) / (1.0 - b.b1)
        } else {
            0.0
        };
        for j in 0..block {
            let pi = r * block + j;
            let gj = g[k * block + j];
            let catchup = m1[pi] * catch;
            let mi = m1[pi] * b1k + gj * (1.0 - b.b1);
            let vi = m2[pi] * b2k + gj * gj * (1.0 - b.b2);
            m1[pi] = mi;
            m2[pi] = vi;
            w[pi] += lr * (mi + catchup) / (vi.sqrt() + b.eps);
        }
    }
    Ok(())
}

// -- RowWiseCounter --------------------------------------------------------------------------

fn create_counter(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let halflife = init.args.int("counter_halflife", -1)?;
    let neg_log_rho = if halflife > 0 {
        std::f64::consts::LN_2 / halflife as f64
    } else {
        0.0
    };
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n = ctx.input(0)?.numel();
        expect(ctx, 0, DataType::Int64, n, "the previous iterations")?;
        expect(
            ctx,
            1,
            DataType::Double,
            n,
            "one counter per previous iteration",
        )?;
        let iter = iteration(ctx, 3)?;
        let idx_t = ctx.input(2)?;
        if !matches!(idx_t.dtype(), DataType::Int32 | DataType::Int64) {
            bail!(
                DtypeMismatch: "input 2 ('{}') must hold int32 or int64 indices, got {}",
                ctx.input_name(2),
                idx_t.dtype()
            );
        }
        let idx = idx_t.to_i64_vec()?;
        state_to_output(ctx, 0, 0)?;
        state_to_output(ctx, 1, 1)?;
        if idx.is_empty() || halflife <= 0 {
            return Ok(());
        }
        let rows = idx
            .iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .filter(|&r| r < n)
                    .ok_or_else(|| err!(BadArgument: "index {i} out of range for {n} counters"))
            })
            .collect::<Result<Vec<_>>>()?;
        let (_, mut outs) = ctx.split();
        let mut o = all_outputs(&mut outs)?;
        let (a, c) = o.split_at_mut(1);
        let prev = a[0].as_mut_slice::<i64>()?;
        let counter = c[0].as_mut_slice::<f64>()?;
        for r in rows {
            let delta = iter.saturating_sub(prev[r]).max(0);
            counter[r] = 1.0 + (-(delta as f64) * neg_log_rho).exp() * counter[r];
            prev[r] = prev[r].max(iter);
        }
        Ok(())
    })))
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::{Element, Tensor};
    use crate::workspace::Workspace;

    fn feed<T: Element>(ws: &Workspace, name: &str, dims: &[usize], v: Vec<T>) {
        ws.feed(name, Tensor::from_vec(dims, v).unwrap());
    }

    fn get<T: Element>(ws: &Workspace, name: &str) -> Vec<T> {
        ws.fetch(name).unwrap().as_slice::<T>().unwrap().to_vec()
    }

    fn close(a: &[f32], b: &[f64]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!(
                (*x as f64 - y).abs() < 1e-5 * (1.0 + y.abs()),
                "{a:?} vs {b:?}"
            );
        }
    }

    #[test]
    fn rowwise_adagrad_updates_rows_with_mean_square() {
        let ws = Workspace::new();
        feed(&ws, "p", &[3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        feed(&ws, "h", &[3], vec![0.0f32, 1.0, 0.0]);
        feed(&ws, "i", &[1], vec![1i64]);
        feed(&ws, "g", &[1, 2], vec![1.0f32, 3.0]);
        feed(&ws, "lr", &[1], vec![0.5f32]);
        let mut op = OperatorDef::new(
            "RowWiseSparseAdagrad",
            ["p", "h", "i", "g", "lr"],
            ["p", "h"],
        );
        op.arg.push(Argument::float("epsilon", 0.0));
        ws.run_operator_once(&op).unwrap();
        // h[1] = 1 + (1 + 9) / 2 = 6; step = 0.5 / sqrt(6).
        let s = 0.5 / 6f64.sqrt();
        assert_eq!(get::<f32>(&ws, "h"), vec![0.0, 6.0, 0.0]);
        close(
            &get::<f32>(&ws, "p"),
            &[1.0, 2.0, 3.0 + s, 4.0 + 3.0 * s, 5.0, 6.0],
        );
    }

    #[test]
    fn rowwise_adagrad_weight_decay_scaled_by_counter() {
        let ws = Workspace::new();
        feed(&ws, "p", &[2, 1], vec![2.0f32, 4.0]);
        feed(&ws, "h", &[2], vec![0.0f32, 0.0]);
        feed(&ws, "i", &[2], vec![0i32, 1]);
        feed(&ws, "g", &[2, 1], vec![1.0f32, 1.0]);
        feed(&ws, "lr", &[1], vec![1.0f32]);
        feed(&ws, "c", &[2], vec![2.0f64, 0.0]);
        let mut op = OperatorDef::new(
            "RowWiseSparseAdagrad",
            ["p", "h", "i", "g", "lr", "c"],
            ["p", "h"],
        );
        op.arg.push(Argument::float("epsilon", 0.0));
        op.arg.push(Argument::float("weight_decay", 0.5));
        op.arg.push(Argument::int("counter_halflife", 4));
        ws.run_operator_once(&op).unwrap();
        // Row 0: freq = 4 / 2 = 2, g = 1 + 0.5 * 2 * 2 = 3; row 1: counter 0, freq 1,
        // g = 1 + 0.5 * 4 = 3. Both: h = 9, w += 3 / 3.
        assert_eq!(get::<f32>(&ws, "h"), vec![9.0, 9.0]);
        assert_eq!(get::<f32>(&ws, "p"), vec![3.0, 5.0]);
    }

    #[test]
    fn rowwise_adagrad_errors() {
        let ws = Workspace::new();
        feed(&ws, "p", &[2, 2], vec![0.0f32; 4]);
        feed(&ws, "h", &[4], vec![0.0f32; 4]);
        feed(&ws, "i", &[1], vec![0i64]);
        feed(&ws, "g", &[1, 2], vec![1.0f32, 1.0]);
        feed(&ws, "lr", &[1], vec![1.0f32]);
        let op = OperatorDef::new(
            "RowWiseSparseAdagrad",
            ["p", "h", "i", "g", "lr"],
            ["p", "h"],
        );
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("one moment per row"), "{e}");
        feed(&ws, "h", &[2], vec![0.0f32; 2]);
        feed(&ws, "i", &[1], vec![2i64]);
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
        feed(&ws, "i", &[2], vec![0i64, 1]);
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("must be the rows"), "{e}");
        // Not in place: refused by the schema.
        let bad = OperatorDef::new(
            "RowWiseSparseAdagrad",
            ["p", "h", "i", "g", "lr"],
            ["p2", "h"],
        );
        assert!(ws.run_operator_once(&bad).is_err());
    }

    fn adam_ws() -> std::sync::Arc<Workspace> {
        let ws = Workspace::new();
        feed(&ws, "p", &[2, 2], vec![1.0f32, 1.0, 1.0, 1.0]);
        feed(&ws, "m1", &[2, 2], vec![0.0f32; 4]);
        feed(&ws, "m2", &[2], vec![0.0f32; 2]);
        feed(&ws, "i", &[1], vec![1i32]);
        feed(&ws, "g", &[1, 2], vec![1.0f32, 3.0]);
        feed(&ws, "lr", &[1], vec![-0.1f32]);
        feed(&ws, "it", &[1], vec![0i64]);
        ws
    }

    #[test]
    fn rowwise_adam_one_second_moment_per_row() {
        let ws = adam_ws();
        let op = OperatorDef::new(
            "RowWiseSparseAdam",
            ["p", "m1", "m2", "i", "g", "lr", "it"],
            ["p", "m1", "m2", "eff"],
        );
        ws.run_operator_once(&op).unwrap();
        // t = 1: m2[1] = 0.001 * 5, m1 = 0.1 g, correction = sqrt(0.001) / 0.1.
        let v = 0.001f64 * 5.0;
        let corr = 0.001f64.sqrt() / 0.1;
        let e: Vec<f64> = [0.1, 0.3]
            .iter()
            .map(|m| corr * m / (v.sqrt() + 1e-5))
            .collect();
        close(&get::<f32>(&ws, "m2"), &[0.0, v]);
        close(&get::<f32>(&ws, "m1"), &[0.0, 0.0, 0.1, 0.3]);
        close(&get::<f32>(&ws, "eff"), &e);
        assert_eq!(ws.fetch("eff").unwrap().dims(), &[1, 2]);
        close(
            &get::<f32>(&ws, "p"),
            &[1.0, 1.0, 1.0 - 0.1 * e[0], 1.0 - 0.1 * e[1]],
        );
        // Three outputs: the same parameter step.
        let ws2 = adam_ws();
        let op = OperatorDef::new(
            "RowWiseSparseAdam",
            ["p", "m1", "m2", "i", "g", "lr", "it"],
            ["p", "m1", "m2"],
        );
        ws2.run_operator_once(&op).unwrap();
        close(
            &get::<f32>(&ws2, "p"),
            &get::<f32>(&ws, "p")
                .iter()
                .map(|&v| v as f64)
                .collect::<Vec<_>>(),
        );
        // m2 must have one value per row.
        feed(&ws2, "m2", &[4], vec![0.0f32; 4]);
        let e = ws2.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("one second moment per row"), "{e}");
    }

    #[test]
    fn smart_decay_adam_catches_up_skipped_steps() {
        let ws = Workspace::new();
        feed(&ws, "p", &[2, 1], vec![1.0f32, 1.0]);
        feed(&ws, "m1", &[2, 1], vec![0.5f32, 0.5]);
        feed(&ws, "m2", &[2, 1], vec![0.25f32, 0.25]);
        feed(&ws, "seen", &[2], vec![7i64, 9]);
        feed(&ws, "i", &[2], vec![0i64, 1]);
        feed(&ws, "g", &[2, 1], vec![1.0f32, 1.0]);
        feed(&ws, "lr", &[1], vec![-0.1f32]);
        feed(&ws, "it", &[1], vec![9i64]);
        let mut op = OperatorDef::new(
            "SmartDecaySparseAdam",
            ["p", "m1", "m2", "seen", "i", "g", "lr", "it"],
            ["p", "m1", "m2", "seen"],
        );
        op.arg.push(Argument::float("beta1", 0.5));
        op.arg.push(Argument::float("beta2", 0.5));
        op.arg.push(Argument::float("epsilon", 0.0));
        ws.run_operator_once(&op).unwrap();
        // t = 10. Row 0: k = 3, m1 = 0.5 * 0.125 + 0.5 = 0.5625, m2 = 0.25 * 0.125 + 0.5
        // = 0.53125, catchup = 0.5 * 0.5 * (1 - 0.25) / 0.5 = 0.375.
        // Row 1: k = 1, m1 = 0.75, m2 = 0.625, no catchup.
        assert_eq!(get::<i64>(&ws, "seen"), vec![10, 10]);
        close(&get::<f32>(&ws, "m1"), &[0.5625, 0.75]);
        close(&get::<f32>(&ws, "m2"), &[0.53125, 0.625]);
        let p0 = 1.0 - 0.1 * (0.5625 + 0.375) / 0.53125f64.sqrt();
        let p1 = 1.0 - 0.1 * 0.75 / 0.625f64.sqrt();
        close(&get::<f32>(&ws, "p"), &[p0, p1]);
    }

    #[test]
    fn rowwise_counter_decays_by_half_life() {
        let ws = Workspace::new();
        feed(&ws, "prev", &[3], vec![0i64, 6, 10]);
        feed(&ws, "cnt", &[3], vec![1.0f64, 2.0, 3.0]);
        feed(&ws, "i", &[3], vec![0i32, 1, 1]);
        feed(&ws, "it", &[1], vec![8i64]);
        let mut op = OperatorDef::new(
            "RowWiseCounter",
            ["prev", "cnt", "i", "it"],
            ["prev", "cnt"],
        );
        op.arg.push(Argument::int("counter_halflife", 4));
        ws.run_operator_once(&op).unwrap();
        // Row 0: delta 8 -> 1 + 0.25 * 1; row 1: delta 2 -> 1 + 2^-0.5 * 2, then again with
        // delta 0 -> 1 + that.
        let c = get::<f64>(&ws, "cnt");
        let r1 = 1.0 + 2f64.powf(-0.5) * 2.0;
        assert!(
            (c[0] - 1.25).abs() < 1e-12 && (c[1] - (1.0 + r1)).abs() < 1e-12,
            "{c:?}"
        );
        assert_eq!(c[2], 3.0);
        assert_eq!(get::<i64>(&ws, "prev"), vec![8, 8, 10]);
        // Without a positive half-life nothing changes.
        op.arg.clear();
        ws.run_operator_once(&op).unwrap();
        assert_eq!(get::<f64>(&ws, "cnt"), c);
        // Out-of-range index.
        op.arg.push(Argument::int("counter_halflife", 4));
        feed(&ws, "i", &[1], vec![3i32]);
        assert!(ws.run_operator_once(&op).is_err());
    }
}
