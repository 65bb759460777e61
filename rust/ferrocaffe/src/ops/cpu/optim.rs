//! Optimizers: LearningRate, WeightedSum and its gradient, MomentumSGD, MomentumSGDUpdate, Adagrad,
//! SparseAdagrad, Adam.
//!
//! State inputs are updated in place (the schemas enforce or allow it); when an output is not
//! its input's blob, the input is copied into it first and updated there.

use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("LearningRate", create_lr);
    r.cpu("WeightedSum", |_| Ok(Box::new(FnOp(weighted_sum))));
    r.cpu("WeightedSumGradient", |i| {
        let grad_on_w = i.args.bool("grad_on_w", false)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            weighted_sum_grad(ctx, grad_on_w)
        })))
    });
    r.cpu("MomentumSGD", |i| create_momentum(i, false));
    r.cpu("MomentumSGDUpdate", |i| create_momentum(i, true));
    r.cpu("Adagrad", create_adagrad);
    r.cpu("SparseAdagrad", create_sparse_adagrad);
    r.cpu("Adam", create_adam);
}

/// Makes output `j` hold input `i`'s values (nothing to do when they are one blob).
pub(super) fn state_to_output(ctx: &mut OpContext<'_>, i: usize, j: usize) -> Result<()> {
    if ctx.is_inplace(i, j) {
        return Ok(());
    }
    let (ins, mut outs) = ctx.split();
    let src = ins.tensor(i)?;
    outs.tensor(j)?.copy_from(src);
    Ok(())
}

/// Float values of input `i`, read through its output when it is computed in place.
fn read_input(ctx: &OpContext<'_>, i: usize) -> Result<Vec<f32>> {
    Ok(ctx.input(i)?.as_slice::<f32>()?.to_vec())
}

/// The single value of input `i` (a learning rate, a decay...).
pub(super) fn scalar(ctx: &OpContext<'_>, i: usize) -> Result<f32> {
    let t = ctx.input(i)?;
    if t.numel() != 1 {
        bail!(
            ShapeMismatch: "input {i} ('{}') must hold one value, got shape {:?}",
            ctx.input_name(i),
            t.dims()
        );
    }
    Ok(t.get_f64(0)? as f32)
}

#[derive(Clone, Debug)]
enum Policy {
    Fixed,
    Step {
        stepsize: i64,
        gamma: f32,
    },
    Exp {
        gamma: f32,
    },
    Inv {
        gamma: f32,
        power: f32,
    },
    Poly {
        max_iter: i64,
        power: f32,
    },
    LinearWarmup {
        start: f32,
        num_iter: i64,
    },
    ConstantWarmup {
        multiplier: f32,
        num_iter: i64,
    },
    Multistep {
        steps: Vec<i64>,
        gamma: f32,
    },
    /// `active_period` iterations at 1 then `inactive_period` at 0 (swapped without
    /// `active_first`).
    Alter {
        active_first: bool,
        active: i64,
        inactive: i64,
    },
    /// Linear warmup from `start` over `num_iter`, then `inv` decay floored at `end`.
    Hill {
        num_iter: i64,
        start: f32,
        gamma: f32,
        power: f32,
        end: f32,
    },
    /// `m1` until `n1`, then linear towards `m2` (reached at `n2`), floored at `m2`.
    Slope {
        n1: i64,
        m1: f32,
        n2: i64,
        m2: f32,
    },
    /// `m1` before `num_iter`, `m2` from there on.
    Gate {
        m1: f32,
        m2: f32,
        num_iter: i64,
    },
    /// Sub-policies in turn: each entry is (first iteration, policy, scale); sub-policy k
    /// covers `sub_policy_num_iters[k]` iterations, counting from 1.
    Composite(Vec<(i64, Policy, f32)>),
}

impl Policy {
    fn multiplier(&self, it: i64) -> f64 {
        let itf = it as f64;
        match self {
            Policy::Fixed => 1.0,
            Policy::Step { stepsize, gamma } => {
                f64::from(*gamma).powi((it / (*stepsize).max(1)) as i32)
            }
            Policy::Exp { gamma } => f64::from(*gamma).powf(itf),
            Policy::Inv { gamma, power } => inv(*gamma, *power, itf),
            Policy::Poly { max_iter, power } => (1.0 - itf / (*max_iter).max(1) as f64)
                .max(0.0)
                .powf(f64::from(*power)),
            Policy::LinearWarmup { start, num_iter } => linear_warmup(*start, *num_iter, it),
            Policy::ConstantWarmup {
                multiplier,
                num_iter,
            } => {
                if it >= *num_iter {
                    1.0
                } else {
                    f64::from(*multiplier)
                }
            }
            Policy::Multistep { steps, gamma } => {
                f64::from(*gamma).powi(steps.iter().filter(|&&s| it >= s).count() as i32)
            }
            Policy::Alter {
                active_first,
                active,
                inactive,
            } => {
                let period = active.saturating_add(*inactive).max(1);
                let on = it.rem_euclid(period) < *active;
                if on == *active_first {
                    1.0
                } else {
                    0.0
                }
            }
            Policy::Hill {
                num_iter,
                start,
                gamma,
                power,
                end,
            } => {
                if it < *num_iter {
                    linear_warmup(*start, *num_iter, it)
                } else {
                    inv(*gamma, *power, (it - num_iter) as f64).max(f64::from(*end))
                }
            }
            Policy::Slope { n1, m1, n2, m2 } => {
                let (m1, m2) = (f64::from(*m1), f64::from(*m2));
                if it < *n1 {
                    m1
                } else {
                    let span = (n2 - n1) as f64;
                    (m1 + (itf - *n1 as f64) * (m2 - m1) / span).max(m2)
                }
            }
            Policy::Gate { m1, m2, num_iter } => f64::from(if it >= *num_iter { *m2 } else { *m1 }),
            Policy::Composite(parts) => {
                let k = parts
                    .iter()
                    .rposition(|(first, _, _)| it >= *first)
                    .unwrap_or(0);
                let (_, policy, scale) = &parts[k];
                policy.multiplier(it) * f64::from(*scale)
            }
        }
    }
}

fn inv(gamma: f32, power: f32, it: f64) -> f64 {
    (1.0 + f64::from(gamma) * it).powf(-f64::from(power))
}

fn linear_warmup(start: f32, num_iter: i64, it: i64) -> f64 {
    if it >= num_iter {
        1.0
    } else {
        let start = f64::from(start);
        start + (1.0 - start) * it as f64 / num_iter.max(1) as f64
    }
}

/// The policy `name` with its arguments read under `prefix` (`sub_policy_<k>_` for the parts
/// of a composite policy, which cannot nest).
fn parse_policy(init: &OpInit<'_>, prefix: &str, name: &str) -> Result<Policy> {
    let a = &init.args;
    let key = |k: &str| format!("{prefix}{k}");
    let float = |k: &str, d: f32| a.float(&key(k), d);
    let int = |k: &str, d: i64| a.int(&key(k), d);
    let gamma = || float("gamma", 0.0);
    Ok(match name {
        "fixed" => Policy::Fixed,
        "step" => Policy::Step {
            stepsize: int("stepsize", 0)?,
            gamma: gamma()?,
        },
        "exp" => Policy::Exp { gamma: gamma()? },
        "inv" => Policy::Inv {
            gamma: gamma()?,
            power: float("power", 0.0)?,
        },
        "poly" => Policy::Poly {
            max_iter: int("max_iter", -1)?,
            power: float("power", 0.0)?,
        },
        "linearWarmup" => Policy::LinearWarmup {
            start: float("start_multiplier", 0.0)?,
            num_iter: int("num_iter", 0)?,
        },
        "constantWarmup" => Policy::ConstantWarmup {
            multiplier: float("multiplier", 0.5)?,
            num_iter: int("num_iter", 0)?,
        },
        "multistep" => Policy::Multistep {
            steps: a.ints(&key("stepsize")),
            gamma: gamma()?,
        },
        "alter" => {
            let active = int("active_period", -1)?;
            let inactive = int("inactive_period", -1)?;
            if active < 0 || inactive < 0 {
                bail!(
                    op = init,
                    BadArgument: "alter policy needs active_period and inactive_period >= 0, \
                     got {active} and {inactive}"
                );
            }
            Policy::Alter {
                active_first: a.bool(&key("active_first"), true)?,
                active,
                inactive,
            }
        }
        "hill" => Policy::Hill {
            num_iter: int("num_iter", 0)?,
            start: float("start_multiplier", 0.0)?,
            gamma: gamma()?,
            power: float("power", 0.0)?,
            end: float("end_multiplier", 0.0)?,
        },
        "slope" => {
            let (n1, n2) = (int("num_iter_1", 0)?, int("num_iter_2", 0)?);
            if n2 <= n1 {
                bail!(
                    op = init,
                    BadArgument: "slope policy needs num_iter_2 > num_iter_1, got {n2} and {n1}"
                );
            }
            Policy::Slope {
                n1,
                m1: float("multiplier_1", 1.0)?,
                n2,
                m2: float("multiplier_2", 1.0)?,
            }
        }
        "gate" => Policy::Gate {
            m1: float("multiplier_1", 1.0)?,
            m2: float("multiplier_2", 1.0)?,
            num_iter: int("num_iter", 0)?,
        },
        "composite" if prefix.is_empty() => {
            let iters = a.ints("sub_policy_num_iters");
            if iters.is_empty() {
                bail!(op = init, BadArgument: "composite policy needs sub_policy_num_iters");
            }
            let mut parts = Vec::with_capacity(iters.len());
            let mut first = 1i64;
            for (k, &n) in iters.iter().enumerate() {
                if n <= 0 {
                    bail!(
                        op = init,
                        BadArgument: "sub_policy_num_iters[{k}] must be positive, got {n}"
                    );
                }
                let sub = format!("sub_policy_{k}_");
                let sub_name = a.string(&format!("{sub}policy"), "")?;
                if sub_name.is_empty() {
                    bail!(op = init, BadArgument: "composite policy needs {sub}policy");
                }
                let scale = a.float(&format!("{sub}lr_scale"), 1.0)?;
                parts.push((first, parse_policy(init, &sub, &sub_name)?, scale));
                first = first.saturating_add(n);
            }
            Policy::Composite(parts)
        }
        other => bail!(op = init, BadArgument: "Unknown learning rate policy: {other}"),
    })
}

fn create_lr(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let a = &init.args;
    if !a.has("base_lr") {
        bail!(op = init, BadArgument: "LearningRate needs the base_lr argument");
    }
    let base = f64::from(a.float("base_lr", 0.0)?);
    let name = a.string("policy", "fixed")?;
    let policy = parse_policy(init, "", &name)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let it = ctx.input(0)?.to_i64_vec()?;
        let it = *it
            .first()
            .ok_or_else(|| err!(ShapeMismatch: "the iteration input is empty"))?;
        ctx.output(0)?.ensure::<f32>(&[])[0] = (base * policy.multiplier(it)) as f32;
        Ok(())
    })))
}

/// Y = sum_i w_i * X_i over inputs (X_0, w_0, X_1, w_1, ...); Y may be X_0.
fn weighted_sum(ctx: &mut OpContext<'_>) -> Result<()> {
    let n = ctx.num_inputs();
    if n == 0 || !n.is_multiple_of(2) {
        bail!(Schema: "WeightedSum needs pairs of (X, weight) inputs");
    }
    let dims = ctx.input(0)?.dims().to_vec();
    let inplace0 = ctx.is_inplace(0, 0);
    let mut terms: Vec<(Vec<f32>, f32)> = Vec::with_capacity(n / 2);
    for k in (0..n).step_by(2) {
        let w = scalar(ctx, k + 1)?;
        if k == 0 && inplace0 {
            terms.push((Vec::new(), w));
            continue;
        }
        let x = ctx.input(k)?;
        if x.dims() != dims.as_slice() {
            bail!(ShapeMismatch: "Input {k} has shape {:?}, expected {dims:?}", x.dims());
        }
        terms.push((x.as_slice::<f32>()?.to_vec(), w));
    }
    let y = ctx.output(0)?;
    if inplace0 {
        let w0 = terms[0].1;
        let ys = y.as_mut_slice::<f32>()?;
        for v in ys.iter_mut() {
            *v *= w0;
        }
    } else {
        let ys = y.ensure::<f32>(&dims);
        let (x0, w0) = &terms[0];
        for (v, &x) in ys.iter_mut().zip(x0) {
            *v = x * w0;
        }
    }
    let ys = y.as_mut_slice::<f32>()?;
    for (x, w) in &terms[1..] {
        for (v, &xv) in ys.iter_mut().zip(x) {
            *v += w * xv;
        }
    }
    Ok(())
}

/// Inputs (dY, X_0, w_0, X_1, w_1, ...); outputs dX_i = w_i * dY, then with `grad_on_w` the
/// weights' gradients dw_i = <dY, X_i> (one value each).
fn weighted_sum_grad(ctx: &mut OpContext<'_>, grad_on_w: bool) -> Result<()> {
    let n_in = ctx.num_inputs();
    if n_in % 2 != 1 {
        bail!(Schema: "WeightedSumGradient needs dY then (X, weight) pairs, got {n_in} inputs");
    }
    let pairs = n_in / 2;
    let n_out = if grad_on_w { 2 * pairs } else { pairs };
    if ctx.num_outputs() != n_out {
        bail!(
            Schema: "WeightedSumGradient with grad_on_w={} and {pairs} (X, weight) pairs needs \
             {n_out} outputs, got {}",
            u8::from(grad_on_w),
            ctx.num_outputs()
        );
    }
    let dims = ctx.input(0)?.dims().to_vec();
    let dy = read_input(ctx, 0)?;
    for k in 0..pairs {
        let w = scalar(ctx, 2 * k + 2)?;
        let dw = if grad_on_w {
            let x = ctx.input(2 * k + 1)?;
            if x.numel() != dy.len() {
                bail!(
                    ShapeMismatch: "input {} ('{}') has {} values, expected {} (the size of dY)",
                    2 * k + 1,
                    ctx.input_name(2 * k + 1),
                    x.numel(),
                    dy.len()
                );
            }
            let xs = x.as_slice::<f32>()?;
            Some(dy.iter().zip(xs).map(|(a, b)| a * b).sum::<f32>())
        } else {
            None
        };
        let dx = ctx.output(k)?.ensure::<f32>(&dims);
        for (o, &g) in dx.iter_mut().zip(&dy) {
            *o = w * g;
        }
        if let Some(v) = dw {
            ctx.output(pairs + k)?.ensure::<f32>(&[1])[0] = v;
        }
    }
    Ok(())
}

fn create_momentum(init: &OpInit<'_>, update: bool) -> Result<Box<dyn Operator>> {
    let momentum = init.args.float("momentum", 0.0)?;
    let nesterov = init.args.bool("nesterov", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = scalar(ctx, 2)?;
        let g = read_input(ctx, 0)?;
        let m = read_input(ctx, 1)?;
        if g.len() != m.len() {
            bail!(ShapeMismatch: "grad and moment must have the same size");
        }
        let dims = ctx.input(0)?.dims().to_vec();
        let mut ng = vec![0f32; g.len()];
        let mut nm = vec![0f32; g.len()];
        for i in 0..g.len() {
            if nesterov {
                let mi_new = momentum * m[i] + lr * g[i];
                nm[i] = mi_new;
                ng[i] = (1.0 + momentum) * mi_new - momentum * m[i];
            } else {
                let adj = lr * g[i] + momentum * m[i];
                nm[i] = adj;
                ng[i] = adj;
            }
        }
        if update {
            state_to_output(ctx, 3, 2)?;
            let p = ctx.output(2)?.as_mut_slice::<f32>()?;
            if p.len() != ng.len() {
                bail!(ShapeMismatch: "param must have the size of grad");
            }
            for (pv, d) in p.iter_mut().zip(&ng) {
                *pv -= d;
            }
        }
        ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&ng);
        ctx.output(1)?.ensure::<f32>(&dims).copy_from_slice(&nm);
        Ok(())
    })))
}

fn create_adagrad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let eps = init.args.float("epsilon", 1e-5)?;
    let decay = init.args.float("decay", 1.0)?;
    let wd = init.args.float("weight_decay", 0.0)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = scalar(ctx, 3)?;
        let mut g = read_input(ctx, 2)?;
        state_to_output(ctx, 0, 0)?;
        state_to_output(ctx, 1, 1)?;
        let dims = ctx.output(0)?.dims().to_vec();
        let mut eff = Vec::new();
        let mut upd = Vec::new();
        {
            let mut h = ctx.output(1)?.as_slice::<f32>()?.to_vec();
            let p = ctx.output(0)?.as_mut_slice::<f32>()?;
            if p.len() != g.len() || h.len() != g.len() {
                bail!(ShapeMismatch: "param, moment and grad must have the same size");
            }
            for i in 0..g.len() {
                // Weight decay joins the gradient before it is accumulated.
                g[i] += wd * p[i];
                h[i] = decay * h[i] + g[i] * g[i];
                let e = lr / (h[i].sqrt() + eps);
                p[i] += e * g[i];
                eff.push(e);
                upd.push(e * g[i]);
            }
            ctx.output(1)?.as_mut_slice::<f32>()?.copy_from_slice(&h);
        }
        if ctx.num_outputs() > 2 {
            ctx.output(2)?.ensure::<f32>(&dims).copy_from_slice(&eff);
        }
        if ctx.num_outputs() > 3 {
            ctx.output(3)?.ensure::<f32>(&dims).copy_from_slice(&upd);
        }
        Ok(())
    })))
}

fn create_sparse_adagrad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let eps = init.args.float("epsilon", 1e-5)?;
    let wd = init.args.float("weight_decay", 0.0)?;
    let halflife = init.args.int("counter_halflife", -1)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        // The optional sixth input counts each row's updates; with counter_halflife > 0 a row
        // seen `count` times decays by weight_decay * halflife / count.
        let counts = if ctx.num_inputs() > 5 && halflife > 0 {
            let c = ctx.input(5)?;
            Some(
                (0..c.numel())
                    .map(|i| c.get_f64(i))
                    .collect::<Result<Vec<f64>>>()?,
            )
        } else {
            None
        };
        let lr = scalar(ctx, 4)?;
        let idx = ctx.input(2)?.to_i64_vec()?;
        let g = read_input(ctx, 3)?;
        state_to_output(ctx, 0, 0)?;
        state_to_output(ctx, 1, 1)?;
        let rows = ctx.output(0)?.dims().first().copied().unwrap_or(0);
        let n = ctx.output(0)?.numel();
        let block = n.checked_div(rows).unwrap_or(0);
        if idx.len() * block != g.len() {
            bail!(
                ShapeMismatch: "grad has {} values, expected {} indices x {block}",
                g.len(),
                idx.len()
            );
        }
        let mut h = ctx.output(1)?.as_slice::<f32>()?.to_vec();
        if h.len() != n {
            bail!(ShapeMismatch: "moment must have the size of param");
        }
        let p = ctx.output(0)?.as_mut_slice::<f32>()?;
        for (k, &r) in idx.iter().enumerate() {
            let r = usize::try_from(r)
                .ok()
                .filter(|&r| r < rows)
                .ok_or_else(|| err!(BadArgument: "Index out of bounds: {r}, range 0 to {rows}"))?;
            let mut row_wd = wd;
            if let Some(c) = &counts {
                let count = *c.get(r).ok_or_else(
                    || err!(ShapeMismatch: "the counter input has {} rows, param {rows}", c.len()),
                )?;
                if count > 0.0 {
                    row_wd = (f64::from(wd) * halflife as f64 / count) as f32;
                }
            }
            for j in 0..block {
                let pi = r * block + j;
                let gi = g[k * block + j] + row_wd * p[pi];
                h[pi] += gi * gi;
                p[pi] += lr * gi / (h[pi].sqrt() + eps);
            }
        }
        ctx.output(1)?.as_mut_slice::<f32>()?.copy_from_slice(&h);
        Ok(())
    })))
}

fn create_adam(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let b1 = init.args.float("beta1", 0.9)?;
    let b2 = init.args.float("beta2", 0.999)?;
    // Caffe2's Adam reads epsilon with the default 1e-5.
    let eps = init.args.float("epsilon", 1e-5)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = scalar(ctx, 4)?;
        let it = ctx.input(5)?.to_i64_vec()?;
        let t = *it
            .first()
            .ok_or_else(|| err!(ShapeMismatch: "the iteration input is empty"))?
            as f32
            + 1.0;
        let g = read_input(ctx, 3)?;
        for k in 0..3 {
            state_to_output(ctx, k, k)?;
        }
        let correction = (1.0 - b2.powf(t)).sqrt() / (1.0 - b1.powf(t));
        let mut m1 = ctx.output(1)?.as_slice::<f32>()?.to_vec();
        let mut m2 = ctx.output(2)?.as_slice::<f32>()?.to_vec();
        if m1.len() != g.len() || m2.len() != g.len() {
            bail!(ShapeMismatch: "param, moments and grad must have the same size");
        }
        // The optional output is the effective gradient, the step without the learning rate.
        let with_grad = ctx.num_outputs() > 3;
        let mut step = vec![0f32; g.len()];
        for i in 0..g.len() {
            m1[i] = b1 * m1[i] + (1.0 - b1) * g[i];
            m2[i] = b2 * m2[i] + (1.0 - b2) * g[i] * g[i];
            let denom = m2[i].sqrt() + eps;
            step[i] = if with_grad {
                correction * m1[i] / denom
            } else {
                lr * correction * m1[i] / denom
            };
        }
        {
            let p = ctx.output(0)?.as_mut_slice::<f32>()?;
            if p.len() != g.len() {
                bail!(ShapeMismatch: "param must have the size of grad");
            }
            for (pv, s) in p.iter_mut().zip(&step) {
                *pv += if with_grad { lr * s } else { *s };
            }
        }
        ctx.output(1)?.as_mut_slice::<f32>()?.copy_from_slice(&m1);
        ctx.output(2)?.as_mut_slice::<f32>()?.copy_from_slice(&m2);
        if with_grad {
            let dims = ctx.input(3)?.dims().to_vec();
            ctx.output(3)?.ensure::<f32>(&dims).copy_from_slice(&step);
        }
        Ok(())
    })))
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn f32s(ws: &Workspace, name: &str) -> Vec<f32> {
        ws.fetch(name).unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    fn weighted_sum_ws() -> std::sync::Arc<Workspace> {
        let ws = Workspace::new();
        ws.feed("dY", Tensor::from_vec(&[2], vec![1.0f32, -2.0]).unwrap());
        ws.feed("X0", Tensor::from_vec(&[2], vec![3.0f32, 4.0]).unwrap());
        ws.feed("w0", Tensor::from_vec(&[1], vec![0.5f32]).unwrap());
        ws.feed("X1", Tensor::from_vec(&[2], vec![-1.0f32, 1.0]).unwrap());
        ws.feed("w1", Tensor::from_vec(&[1], vec![2.0f32]).unwrap());
        ws
    }

    #[test]
    fn weighted_sum_gradient_scales_dy() {
        let ws = weighted_sum_ws();
        let op = OperatorDef::new(
            "WeightedSumGradient",
            ["dY", "X0", "w0", "X1", "w1"],
            ["dX0", "dX1"],
        );
        ws.run_operator_once(&op).unwrap();
        assert_eq!(f32s(&ws, "dX0"), vec![0.5, -1.0]);
        assert_eq!(f32s(&ws, "dX1"), vec![2.0, -4.0]);
    }

    #[test]
    fn weighted_sum_gradient_on_weights() {
        let ws = weighted_sum_ws();
        let mut op = OperatorDef::new(
            "WeightedSumGradient",
            ["dY", "X0", "w0", "X1", "w1"],
            ["dX0", "dX1", "dw0", "dw1"],
        );
        op.arg.push(Argument::int("grad_on_w", 1));
        ws.run_operator_once(&op).unwrap();
        assert_eq!(f32s(&ws, "dX1"), vec![2.0, -4.0]);
        // dw_i = <dY, X_i>: 3 - 8 and -1 - 2, each of shape [1].
        assert_eq!(f32s(&ws, "dw0"), vec![-5.0]);
        assert_eq!(f32s(&ws, "dw1"), vec![-3.0]);
        assert_eq!(ws.fetch("dw0").unwrap().dims(), &[1]);
        // Without grad_on_w four outputs are too many.
        op.arg.clear();
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("needs 2 outputs, got 4"), "{e}");
    }

    #[test]
    fn adam_effective_gradient_output_excludes_the_learning_rate() {
        let ws = Workspace::new();
        ws.feed("p", Tensor::from_vec(&[1], vec![1.0f32]).unwrap());
        ws.feed("m1", Tensor::from_vec(&[1], vec![0.0f32]).unwrap());
        ws.feed("m2", Tensor::from_vec(&[1], vec![0.0f32]).unwrap());
        ws.feed("g", Tensor::from_vec(&[1], vec![2.0f32]).unwrap());
        ws.feed("lr", Tensor::from_vec(&[1], vec![-0.5f32]).unwrap());
        ws.feed("it", Tensor::from_vec(&[1], vec![0i64]).unwrap());
        let op = OperatorDef::new(
            "Adam",
            ["p", "m1", "m2", "g", "lr", "it"],
            ["p", "m1", "m2", "eff"],
        );
        ws.run_operator_once(&op).unwrap();
        // t = 1, default betas and epsilon 1e-5: m1 = 0.2, m2 = 0.004,
        // correction = sqrt(0.001) / 0.1, eff = correction * 0.2 / (sqrt(0.004) + 1e-5).
        let corr = 0.001f64.sqrt() / 0.1;
        let eff = corr * 0.2 / (0.004f64.sqrt() + 1e-5);
        let got = f32s(&ws, "eff")[0] as f64;
        assert!((got - eff).abs() < 1e-6, "{got} vs {eff}");
        let p = f32s(&ws, "p")[0] as f64;
        assert!((p - (1.0 - 0.5 * eff)).abs() < 1e-6, "{p}");
    }
}
