//! More optimizers: Ftrl / SparseFtrl, GFtrl (group lasso FTRL), Wngrad / SparseWngrad,
//! Adadelta / SparseAdadelta, RmsProp, Storm / SparseStorm, DecayAdagrad and YellowFin, with
//! Caffe2's update rules (its `sgd/*_op.h` kernels).
//!
//! Every kernel reads its inputs into buffers first and writes its outputs after, so an output
//! may be its input's blob (the schemas allow or enforce it) or a new one. The learning rate is
//! added to the parameter (`param + lr * step`): the optimizers pass a negative rate.

use super::optim::scalar;
use super::sparse_optim::sparse_rows;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, ensure};

/// Registers the family.
pub fn register(r: &mut Registry) {
    for engine in ["", "SIMD"] {
        r.register("Ftrl", crate::device::DeviceType::Cpu, engine, |i| {
            create_ftrl(i, false)
        });
        r.register("SparseFtrl", crate::device::DeviceType::Cpu, engine, |i| {
            create_ftrl(i, true)
        });
        r.register(
            "GFtrl",
            crate::device::DeviceType::Cpu,
            engine,
            create_gftrl,
        );
    }
    r.cpu("Wngrad", |i| create_wngrad(i, false));
    r.cpu("SparseWngrad", |i| create_wngrad(i, true));
    r.cpu("Adadelta", |i| create_adadelta(i, false));
    r.cpu("SparseAdadelta", |i| create_adadelta(i, true));
    r.cpu("RmsProp", create_rmsprop);
    r.cpu("Storm", |i| create_storm(i, false));
    r.cpu("SparseStorm", |i| create_storm(i, true));
    r.cpu("DecayAdagrad", create_decay_adagrad);
    r.cpu("YellowFin", create_yellowfin);
}

/// Input `i` as float values.
fn floats(ctx: &OpContext<'_>, i: usize) -> Result<Vec<f32>> {
    Ok(ctx.input(i)?.as_slice::<f32>()?.to_vec())
}

/// Fails unless input `i` holds `n` values.
fn check_len(ctx: &OpContext<'_>, i: usize, n: usize, what: &str) -> Result<()> {
    let got = ctx.input(i)?.numel();
    ensure!(
        got == n,
        ShapeMismatch: "input {i} ('{}') has {got} values, expected {n} ({what})",
        ctx.input_name(i)
    );
    Ok(())
}

/// Writes `v` to output `j` with input `like`'s shape.
fn write(ctx: &mut OpContext<'_>, j: usize, like: usize, v: &[f32]) -> Result<()> {
    let dims = ctx.input(like)?.dims().to_vec();
    ctx.output(j)?.ensure::<f32>(&dims).copy_from_slice(v);
    Ok(())
}

/// The first value of an int64/int32 input (an iteration counter).
fn first_int(ctx: &OpContext<'_>, i: usize) -> Result<i64> {
    let v = ctx.input(i)?.to_i64_vec()?;
    match v.first() {
        Some(&x) => Ok(x),
        None => bail!(ShapeMismatch: "input {i} ('{}') is empty", ctx.input_name(i)),
    }
}

// -- FTRL ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct FtrlParams {
    alpha_inv: f32,
    beta: f32,
    lambda1: f32,
    lambda2: f32,
}

impl FtrlParams {
    fn from_args(init: &OpInit<'_>) -> Result<FtrlParams> {
        let alpha = init.args.float("alpha", 0.005)?;
        if alpha == 0.0 {
            bail!(op = init, BadArgument: "alpha must not be 0");
        }
        Ok(FtrlParams {
            alpha_inv: 1.0 / alpha,
            beta: init.args.float("beta", 1.0)?,
            lambda1: init.args.float("lambda1", 0.001)?,
            lambda2: init.args.float("lambda2", 0.001)?,
        })
    }

    /// The run-time learning rate input, when present, replaces the `alpha` argument.
    fn with_alpha_input(mut self, ctx: &OpContext<'_>, i: usize) -> Result<FtrlParams> {
        if ctx.num_inputs() > i {
            let a = scalar(ctx, i)?;
            ensure!(a != 0.0, BadArgument: "the alpha input must not be 0");
            self.alpha_inv = 1.0 / a;
        }
        Ok(self)
    }

    /// One coordinate: returns (w, n, z) after the gradient `g`.
    fn step(&self, w: f32, n: f32, z: f32, g: f32) -> (f32, f32, f32) {
        let n_new = n + g * g;
        let sigma = (n_new.sqrt() - n.sqrt()) * self.alpha_inv;
        let z_new = z + g - sigma * w;
        let w_new = if z_new.abs() > self.lambda1 {
            (self.lambda1 * z_new.signum() - z_new)
                / ((self.beta + n_new.sqrt()) * self.alpha_inv + self.lambda2)
        } else {
            0.0
        };
        (w_new, n_new, z_new)
    }
}

/// Ftrl (var, n_z, grad[, alpha]) and SparseFtrl (var, n_z, indices, grad[, alpha]); n_z holds
/// the pairs (n, z) of every coordinate.
fn create_ftrl(init: &OpInit<'_>, sparse: bool) -> Result<Box<dyn Operator>> {
    let params = FtrlParams::from_args(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let alpha_at = if sparse { 4 } else { 3 };
        let p = params.with_alpha_input(ctx, alpha_at)?;
        let mut w = floats(ctx, 0)?;
        let two_n = w.len().saturating_mul(2);
        check_len(ctx, 1, two_n, "two per value of var")?;
        let mut nz = floats(ctx, 1)?;
        if sparse {
            let (rows, block) = sparse_rows(ctx, 0, &[], 2, 3)?;
            let g = floats(ctx, 3)?;
            for (k, &r) in rows.iter().enumerate() {
                for j in 0..block {
                    let at = r * block + j;
                    let (nw, nn, nzz) = p.step(w[at], nz[2 * at], nz[2 * at + 1], g[k * block + j]);
                    w[at] = nw;
                    nz[2 * at] = nn;
                    nz[2 * at + 1] = nzz;
                }
            }
        } else {
            check_len(ctx, 2, w.len(), "the size of var")?;
            let g = floats(ctx, 2)?;
            for (i, &gi) in g.iter().enumerate() {
                let (nw, nn, nzz) = p.step(w[i], nz[2 * i], nz[2 * i + 1], gi);
                w[i] = nw;
                nz[2 * i] = nn;
                nz[2 * i + 1] = nzz;
            }
        }
        write(ctx, 0, 0, &w)?;
        write(ctx, 1, 1, &nz)
    })))
}

/// GFtrl (var, n_z, grad[, alpha]): FTRL with a group lasso penalty over the columns of var
/// (seen as [rows, numel / rows]); a column is zeroed while the norm of its z values is at
/// most lambda1 * sqrt(rows).
fn create_gftrl(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let params = FtrlParams::from_args(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let p = params.with_alpha_input(ctx, 3)?;
        let rows = ctx.input(0)?.dims().first().copied().unwrap_or(1);
        let mut w = floats(ctx, 0)?;
        let two_n = w.len().saturating_mul(2);
        check_len(ctx, 1, two_n, "two per value of var")?;
        check_len(ctx, 2, w.len(), "the size of var")?;
        let mut nz = floats(ctx, 1)?;
        let g = floats(ctx, 2)?;
        let cols = w.len().checked_div(rows).unwrap_or(0);
        let threshold = p.lambda1 * (rows as f32).sqrt();
        for c in 0..cols {
            let mut z_norm = 0f32;
            let mut fresh = Vec::with_capacity(rows);
            for r in 0..rows {
                let at = r * cols + c;
                let (n, z, gi) = (nz[2 * at], nz[2 * at + 1], g[at]);
                let n_new = n + gi * gi;
                let sigma = (n_new.sqrt() - n.sqrt()) * p.alpha_inv;
                let z_new = z + gi - sigma * w[at];
                z_norm += z_new * z_new;
                fresh.push((n_new, z_new));
            }
            let z_norm = z_norm.sqrt();
            for (r, &(n_new, z_new)) in fresh.iter().enumerate() {
                let at = r * cols + c;
                w[at] = if z_norm > threshold {
                    z_new * (threshold / z_norm - 1.0)
                        / ((p.beta + n_new.sqrt()) * p.alpha_inv + p.lambda2)
                } else {
                    0.0
                };
                nz[2 * at] = n_new;
                nz[2 * at + 1] = z_new;
            }
        }
        write(ctx, 0, 0, &w)?;
        write(ctx, 1, 1, &nz)
    })))
}

// -- Wngrad -------------------------------------------------------------------------------

/// Wngrad (param, seq_b, grad, lr) with optional effective_lr and update outputs, and
/// SparseWngrad (param, seq_b, indices, grad, lr): the step is lr / (b + epsilon) * grad, then
/// b grows by |grad|^2 / (b + epsilon).
fn create_wngrad(init: &OpInit<'_>, sparse: bool) -> Result<Box<dyn Operator>> {
    let eps = init.args.float("epsilon", 1e-5)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = scalar(ctx, if sparse { 4 } else { 3 })?;
        let b = scalar(ctx, 1)?;
        let mut w = floats(ctx, 0)?;
        let grad_at = if sparse { 3 } else { 2 };
        let g = floats(ctx, grad_at)?;
        let eff = lr / (b + eps);
        if sparse {
            let (rows, block) = sparse_rows(ctx, 0, &[], 2, 3)?;
            for (k, &r) in rows.iter().enumerate() {
                for j in 0..block {
                    w[r * block + j] += eff * g[k * block + j];
                }
            }
        } else {
            check_len(ctx, 2, w.len(), "the size of param")?;
            for (wi, gi) in w.iter_mut().zip(&g) {
                *wi += eff * gi;
            }
        }
        let sq: f32 = g.iter().map(|x| x * x).sum();
        let b_new = b + sq / (b + eps);
        write(ctx, 0, 0, &w)?;
        write(ctx, 1, 1, &[b_new])?;
        if ctx.num_outputs() > 2 {
            ctx.output(2)?.ensure::<f32>(&[1])[0] = eff;
        }
        if ctx.num_outputs() > 3 {
            let upd: Vec<f32> = g.iter().map(|x| eff * x).collect();
            write(ctx, 3, grad_at, &upd)?;
        }
        Ok(())
    })))
}

// -- Adadelta -----------------------------------------------------------------------------

/// One Adadelta coordinate: (w, h, d) after the gradient `g`.
fn adadelta_step(w: f32, h: f32, d: f32, g: f32, lr: f32, eps: f32, decay: f32) -> [f32; 3] {
    let h_new = decay * h + (1.0 - decay) * g * g;
    let step = (d + eps).sqrt() / (h_new + eps).sqrt() * g;
    [
        w + lr * step,
        h_new,
        decay * d + (1.0 - decay) * step * step,
    ]
}

/// Adadelta (param, moment_grad, moment_delta, grad, lr) and SparseAdadelta (param,
/// moment_grad, moment_delta, indices, grad, lr).
fn create_adadelta(init: &OpInit<'_>, sparse: bool) -> Result<Box<dyn Operator>> {
    let eps = init.args.float("epsilon", 1e-5)?;
    let decay = init.args.float("decay", 0.95)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = scalar(ctx, if sparse { 5 } else { 4 })?;
        let mut w = floats(ctx, 0)?;
        check_len(ctx, 1, w.len(), "the size of param")?;
        check_len(ctx, 2, w.len(), "the size of param")?;
        let mut h = floats(ctx, 1)?;
        let mut d = floats(ctx, 2)?;
        let n = w.len();
        let mut apply = |at: usize, gi: f32| {
            let [a, b, c] = adadelta_step(w[at], h[at], d[at], gi, lr, eps, decay);
            w[at] = a;
            h[at] = b;
            d[at] = c;
        };
        if sparse {
            let (rows, block) = sparse_rows(ctx, 0, &[1, 2], 3, 4)?;
            let g = floats(ctx, 4)?;
            for (k, &r) in rows.iter().enumerate() {
                for j in 0..block {
                    apply(r * block + j, g[k * block + j]);
                }
            }
        } else {
            check_len(ctx, 3, n, "the size of param")?;
            for (i, gi) in floats(ctx, 3)?.into_iter().enumerate() {
                apply(i, gi);
            }
        }
        write(ctx, 0, 0, &w)?;
        write(ctx, 1, 1, &h)?;
        write(ctx, 2, 2, &d)
    })))
}

// -- RmsProp ------------------------------------------------------------------------------

/// RmsProp (grad, mean_squares, mom, lr) -> (grad_out, mean_squares, mom): ms moves towards
/// g^2 by (1 - decay); mom = momentum * mom + lr * g / sqrt(epsilon + ms); grad_out = mom.
fn create_rmsprop(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let decay = init.args.float("decay", 0.9)?;
    let momentum = init.args.float("momentum", 0.0)?;
    let eps = init.args.float("epsilon", 1e-5)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = scalar(ctx, 3)?;
        let g = floats(ctx, 0)?;
        check_len(ctx, 1, g.len(), "the size of grad")?;
        check_len(ctx, 2, g.len(), "the size of grad")?;
        let mut ms = floats(ctx, 1)?;
        let mut mom = floats(ctx, 2)?;
        for i in 0..g.len() {
            ms[i] += (1.0 - decay) * (g[i] * g[i] - ms[i]);
            mom[i] = mom[i] * momentum + lr * g[i] / (eps + ms[i]).sqrt();
        }
        write(ctx, 0, 0, &mom)?;
        write(ctx, 1, 1, &ms)?;
        write(ctx, 2, 2, &mom)
    })))
}

// -- Storm --------------------------------------------------------------------------------

/// Storm (param, moment, grad_sq_sum, grad, lr) and SparseStorm (param, moment, grad_sq_sum,
/// grad, indices, lr): the squared gradient sum grows by |grad|^2, the rate is
/// lr * (beta + sum)^(-1/3), the moment keeps (1 - momentum * rate^2) of its distance to the
/// gradient, and the parameter moves by rate * moment.
fn create_storm(init: &OpInit<'_>, sparse: bool) -> Result<Box<dyn Operator>> {
    let momentum = init.args.float("momentum", 10.0)?;
    let beta = init.args.float("beta", 0.1)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = scalar(ctx, if sparse { 5 } else { 4 })?;
        let sum = scalar(ctx, 2)?;
        let mut w = floats(ctx, 0)?;
        check_len(ctx, 1, w.len(), "the size of param")?;
        let mut m = floats(ctx, 1)?;
        let g = floats(ctx, 3)?;
        let sum_new = sum + g.iter().map(|x| x * x).sum::<f32>();
        let rate = lr * (beta + sum_new).powf(-1.0 / 3.0);
        let keep = 1.0 - momentum * rate * rate;
        let n = w.len();
        let mut apply = |at: usize, gi: f32| {
            m[at] = gi + keep * (m[at] - gi);
            w[at] += rate * m[at];
        };
        if sparse {
            let (rows, block) = sparse_rows(ctx, 0, &[1], 4, 3)?;
            for (k, &r) in rows.iter().enumerate() {
                for j in 0..block {
                    apply(r * block + j, g[k * block + j]);
                }
            }
        } else {
            check_len(ctx, 3, n, "the size of param")?;
            for (i, &gi) in g.iter().enumerate() {
                apply(i, gi);
            }
        }
        write(ctx, 0, 0, &w)?;
        write(ctx, 1, 1, &m)?;
        write(ctx, 2, 2, &[sum_new])
    })))
}

// -- DecayAdagrad -------------------------------------------------------------------------

/// DecayAdagrad (param, moment_1, moment_2, grad, lr, iter): Adam's first moment (bias
/// corrected with `bias_correction_first`) over an Adagrad-style second moment that decays by
/// beta2; `weight_decay` adds weight_decay * param to the step.
fn create_decay_adagrad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let b1 = init.args.float("beta1", 0.9)?;
    let b2 = init.args.float("beta2", 0.999)?;
    let eps = init.args.float("epsilon", 1e-5)?;
    let wd = init.args.float("weight_decay", 0.0)?;
    let correct_first = init.args.bool("bias_correction_first", true)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = scalar(ctx, 4)?;
        let t = first_int(ctx, 5)?.saturating_add(1);
        let mut w = floats(ctx, 0)?;
        for i in 1..4 {
            check_len(ctx, i, w.len(), "the size of param")?;
        }
        let mut m = floats(ctx, 1)?;
        let mut v = floats(ctx, 2)?;
        let g = floats(ctx, 3)?;
        let correction = if correct_first {
            1.0 - (b1 as f64).powf(t as f64)
        } else {
            1.0
        };
        ensure!(
            correction != 0.0,
            BadArgument: "DecayAdagrad: beta1 = {b1} gives no first-moment bias correction"
        );
        let correction = correction as f32;
        for i in 0..w.len() {
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + g[i] * g[i];
            w[i] += lr * (m[i] / correction / (v[i].sqrt() + eps) + wd * w[i]);
        }
        write(ctx, 0, 0, &w)?;
        write(ctx, 1, 1, &m)?;
        write(ctx, 2, 2, &v)
    })))
}

// -- YellowFin ----------------------------------------------------------------------------

/// Positions in YellowFin's scalars memory.
const SM_G_NORM: usize = 0;
const SM_G_NORM2: usize = 1;
const SM_H_MIN: usize = 2;
const SM_H_MAX: usize = 3;
const SM_DISTANCE: usize = 4;
const SCALARS: usize = 5;

/// YellowFin's single-step tuning: the learning rate and momentum from the distance to the
/// optimum, the gradient variance and the curvature range [h_min, h_max].
pub(crate) fn yellowfin_lr_mu(distance: f64, variance: f64, h_min: f64, h_max: f64) -> (f64, f64) {
    let p = distance * distance * h_min * h_min / 2.0 / variance;
    let w3 = (-(p * p + 4.0 / 27.0 * p * p * p).sqrt() - p) / 2.0;
    let w = w3.signum() * w3.abs().powf(1.0 / 3.0);
    let y = w - p / 3.0 / w;
    let root = if y.is_finite() {
        (y + 1.0).min(1.0 - 1e-6)
    } else {
        0.0
    };
    let dr = (h_max / h_min).sqrt();
    let mu = ((dr - 1.0) / (dr + 1.0)).powi(2).max(root * root);
    let lr = (1.0 - mu.sqrt()).powi(2) / h_min;
    (lr, mu)
}

/// YellowFin (param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars_memory, grad,
/// iter): tunes the rate and momentum of momentum SGD from moving averages (factor `beta`,
/// debiased with `zero_debias`) of the gradient statistics, then takes the momentum step.
fn create_yellowfin(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let beta = f64::from(init.args.float("beta", 0.999)?);
    let width = init.args.int("curv_win_width", 20)?;
    let eps = f64::from(init.args.float("epsilon", 1e-6)?);
    let nesterov = init.args.bool("nesterov", false)?;
    let zero_debias = init.args.bool("zero_debias", true)?;
    let width = match usize::try_from(width) {
        Ok(w) if w > 0 => w,
        _ => bail!(op = init, BadArgument: "curv_win_width must be positive, got {width}"),
    };
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let iter = first_int(ctx, 9)?;
        ensure!(iter >= 1, BadArgument: "YellowFin: the iteration must be at least 1, got {iter}");
        let w = floats(ctx, 0)?;
        let n = w.len();
        for i in [1, 5, 6, 8] {
            check_len(ctx, i, n, "the size of param")?;
        }
        check_len(ctx, 4, width, "curv_win_width")?;
        check_len(ctx, 7, SCALARS, "the scalars memory")?;
        let lr_avg = f64::from(scalar(ctx, 2)?);
        let mu_avg = f64::from(scalar(ctx, 3)?);
        let moment = floats(ctx, 1)?;
        let mut win = floats(ctx, 4)?;
        let mut g_avg = floats(ctx, 5)?;
        let mut g2_avg = floats(ctx, 6)?;
        let mut sm: Vec<f64> = floats(ctx, 7)?.into_iter().map(f64::from).collect();
        let g = floats(ctx, 8)?;

        let debias = if zero_debias {
            1.0 - beta.powf(iter as f64)
        } else {
            1.0
        };
        let avg = |old: f64, x: f64| beta * old + (1.0 - beta) * x;
        let mut g_deb_sq = 0f64;
        let mut g_norm2 = 0f64;
        for i in 0..n {
            let gi = f64::from(g[i]);
            let a = avg(f64::from(g_avg[i]), gi);
            g_avg[i] = a as f32;
            g2_avg[i] = avg(f64::from(g2_avg[i]), gi * gi) as f32;
            let d = a / debias;
            g_deb_sq += d * d;
            g_norm2 += gi * gi;
        }
        let g_norm2 = g_norm2.max(eps);
        sm[SM_G_NORM2] = avg(sm[SM_G_NORM2], g_norm2);
        let g_norm2_deb = sm[SM_G_NORM2] / debias;
        sm[SM_G_NORM] = avg(sm[SM_G_NORM], g_norm2.sqrt());
        let g_norm_deb = (sm[SM_G_NORM] / debias).max(eps);

        let slot = usize::try_from((iter - 1) % width as i64).unwrap_or(0);
        win[slot] = g_norm2.ln() as f32;
        let filled = usize::try_from(iter).unwrap_or(usize::MAX).min(width);
        let (lo, hi) = win[..filled]
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &x| {
                (lo.min(f64::from(x)), hi.max(f64::from(x)))
            });
        sm[SM_H_MIN] = avg(sm[SM_H_MIN], lo);
        sm[SM_H_MAX] = avg(sm[SM_H_MAX], hi);
        let h_min = (sm[SM_H_MIN] / debias).exp();
        let h_max = (sm[SM_H_MAX] / debias).exp();

        let variance = (g_norm2_deb - g_deb_sq).max(eps);
        sm[SM_DISTANCE] = avg(sm[SM_DISTANCE], g_norm_deb / g_norm2_deb);
        let distance = sm[SM_DISTANCE] / debias;

        let (lr_new, mu_new) = if iter > 1 {
            let (lr, mu) = yellowfin_lr_mu(distance, variance, h_min, h_max);
            (avg(lr_avg, lr), avg(mu_avg, mu))
        } else {
            (lr_avg, mu_avg)
        };
        let (lr, mu) = (lr_new as f32, mu_new as f32);
        let mut w_new = w;
        let mut m_new = moment.clone();
        for i in 0..n {
            m_new[i] = mu * moment[i] + lr * g[i];
            w_new[i] -= if nesterov {
                (1.0 + mu) * m_new[i] - mu * moment[i]
            } else {
                m_new[i]
            };
        }
        let sm32: Vec<f32> = sm.iter().map(|&x| x as f32).collect();
        write(ctx, 0, 0, &w_new)?;
        write(ctx, 1, 1, &m_new)?;
        write(ctx, 2, 2, &[lr])?;
        write(ctx, 3, 3, &[mu])?;
        write(ctx, 4, 4, &win)?;
        write(ctx, 5, 5, &g_avg)?;
        write(ctx, 6, 6, &g2_avg)?;
        write(ctx, 7, 7, &sm32)
    })))
}

#[cfg(test)]
mod tests {
    use super::yellowfin_lr_mu;
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn feed(ws: &Workspace, name: &str, dims: &[usize], v: Vec<f32>) {
        ws.feed(name, Tensor::from_vec(dims, v).unwrap());
    }

    fn f32s(ws: &Workspace, name: &str) -> Vec<f32> {
        ws.fetch(name).unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    #[test]
    fn ftrl_matches_the_closed_form() {
        let ws = Workspace::new();
        feed(&ws, "w", &[2], vec![0.5, -0.5]);
        feed(&ws, "nz", &[2, 2], vec![0.0, 0.0, 1.0, 0.2]);
        feed(&ws, "g", &[2], vec![1.0, 2.0]);
        let mut op = OperatorDef::new("Ftrl", ["w", "nz", "g"], ["w", "nz"]);
        op.arg.push(Argument::float("alpha", 0.5));
        op.arg.push(Argument::float("beta", 1.0));
        op.arg.push(Argument::float("lambda1", 0.1));
        op.arg.push(Argument::float("lambda2", 0.0));
        ws.run_operator_once(&op).unwrap();
        // Coordinate 0: n = 1, sigma = (1 - 0) * 2 = 2, z = 0 + 1 - 2 * 0.5 = 0 -> w = 0.
        // Coordinate 1: n = 5, sigma = (sqrt 5 - 1) * 2, z = 0.2 + 2 + sigma * 0.5.
        let sigma = (5f32.sqrt() - 1.0) * 2.0;
        let z = 0.2 + 2.0 + sigma * 0.5;
        let w1 = (0.1 - z) / ((1.0 + 5f32.sqrt()) * 2.0);
        let w = f32s(&ws, "w");
        assert_eq!(w[0], 0.0);
        assert!((w[1] - w1).abs() < 1e-6, "{w:?} vs {w1}");
        assert_eq!(f32s(&ws, "nz")[2], 5.0);
    }

    #[test]
    fn storm_rejects_a_gradient_of_another_size() {
        let ws = Workspace::new();
        feed(&ws, "w", &[2], vec![0.0, 0.0]);
        feed(&ws, "m", &[2], vec![0.0, 0.0]);
        feed(&ws, "s", &[1], vec![0.0]);
        feed(&ws, "g", &[3], vec![1.0, 1.0, 1.0]);
        feed(&ws, "lr", &[1], vec![-0.1]);
        let op = OperatorDef::new("Storm", ["w", "m", "s", "g", "lr"], ["w", "m", "s"]);
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("has 3 values, expected 2"), "{e}");
    }

    #[test]
    fn yellowfin_lr_mu_of_a_flat_range() {
        // With h_min = h_max the momentum comes from the cubic root alone.
        let (lr, mu) = yellowfin_lr_mu(1.0, 1.0, 1.0, 1.0);
        assert!((0.0..1.0).contains(&mu), "{mu}");
        assert!((lr - (1.0 - mu.sqrt()).powi(2)).abs() < 1e-12);
    }
}
