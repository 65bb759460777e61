//! SigmoidCrossEntropyWithLogits, WeightedSigmoidCrossEntropyWithLogits (each term scaled by
//! a weight of the logits' shape; plain loss only) and their gradients.
//!
//! The logits and targets share a shape; the last dimension holds the classes of one example.
//! The loss of an example is minus the mean over its classes of the log-likelihood term:
//! plain (`t log s(x) + (1 - t) log(1 - s(x))`), with `log_D_trick`
//! (`(2t - 1) log s(x)`), or with `unjoined_lr_loss` (`t x - (1 - t) log(1 + e^x)`, the plain
//! term when the negatives may later turn positive), `s` the logistic function. Every log is
//! computed from `e^-|x|` so that no exponential overflows.

use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::Tensor;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("SigmoidCrossEntropyWithLogits", |i| create(i, false));
    r.cpu("SigmoidCrossEntropyWithLogitsGradient", |i| create(i, true));
    // The weighted ops: a per-element weight input after the targets, plain kind.
    r.cpu("WeightedSigmoidCrossEntropyWithLogits", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            forward(ctx, Kind::Plain, Some(2))
        })))
    });
    r.cpu("WeightedSigmoidCrossEntropyWithLogitsGradient", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            backward(ctx, Kind::Plain, Some(3))
        })))
    });
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Plain,
    LogDTrick,
    Unjoined,
}

/// `log(1 + e^-|x|)`, the part of `log(1 + e^x)` that cannot overflow.
fn log1p_exp_neg_abs(x: f32) -> f32 {
    (1.0 + (-x.abs()).exp()).ln()
}

/// The per-element term whose class mean, negated, is the loss.
fn term(kind: Kind, x: f32, t: f32) -> f32 {
    let pos = if x >= 0.0 { 1.0 } else { 0.0 };
    match kind {
        // t log s(x) + (1 - t) log(1 - s(x)) = x (t - [x >= 0]) - log(1 + e^-|x|).
        Kind::Plain => x * (t - pos) - log1p_exp_neg_abs(x),
        // log s(x) = x - log(1 + e^x).
        Kind::LogDTrick => (2.0 * t - 1.0) * (x - (x * pos + log1p_exp_neg_abs(x))),
        Kind::Unjoined => x * t + (t - 1.0) * x * pos - (1.0 - t) * log1p_exp_neg_abs(x),
    }
}

/// Derivative of [`term`] with respect to x.
fn term_grad(kind: Kind, x: f32, t: f32) -> f32 {
    match kind {
        Kind::Plain => t - 1.0 / (1.0 + (-x).exp()),
        Kind::LogDTrick => (2.0 * t - 1.0) / (1.0 + x.exp()),
        Kind::Unjoined => t - (1.0 - t) / (1.0 + (-x).exp()),
    }
}

fn create(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let log_d = init.args.bool("log_D_trick", false)?;
    let unjoined = init.args.bool("unjoined_lr_loss", false)?;
    // Only the forward op refuses both; its gradient lets `unjoined_lr_loss` win.
    if log_d && unjoined && !gradient {
        bail!(
            op = init,
            BadArgument: "log_D_trick_ and unjoined_lr_loss_ cannot be set as True simultaneously"
        );
    }
    let kind = if unjoined {
        Kind::Unjoined
    } else if log_d {
        Kind::LogDTrick
    } else {
        Kind::Plain
    };
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        if gradient {
            backward(ctx, kind, None)
        } else {
            forward(ctx, kind, None)
        }
    })))
}

/// (outer, inner) of the logits: inner is the last dimension (1 for a scalar).
fn outer_inner(t: &Tensor) -> (usize, usize) {
    match t.dims().split_last() {
        Some((&inner, lead)) => (lead.iter().product(), inner),
        None => (1, 1),
    }
}

/// Checks that the logits (input `li`) and targets (input `li + 1`) share a shape.
fn same_shape(ctx: &OpContext<'_>, li: usize) -> Result<()> {
    let (l, t) = (ctx.input(li)?, ctx.input(li + 1)?);
    if l.dims() != t.dims() {
        bail!(
            ShapeMismatch: "logits '{}' {:?} and targets '{}' {:?} must have the same shape",
            ctx.input_name(li),
            l.dims(),
            ctx.input_name(li + 1),
            t.dims()
        );
    }
    Ok(())
}

/// Inputs logits, targets (and the per-element weights at input `weights`); output the loss
/// of each example (logits' shape less its last dim).
fn forward(ctx: &mut OpContext<'_>, kind: Kind, weights: Option<usize>) -> Result<()> {
    same_shape(ctx, 0)?;
    if let Some(wi) = weights {
        weights_fit(ctx, 0, wi)?;
    }
    let (ins, mut outs) = ctx.split();
    let logits = ins.tensor(0)?;
    let (outer, inner) = outer_inner(logits);
    let out_dims = logits
        .dims()
        .split_last()
        .map_or(Vec::new(), |(_, lead)| lead.to_vec());
    let x = logits.as_slice::<f32>()?;
    let t = ins.tensor(1)?.as_slice::<f32>()?;
    let w = weights
        .map(|wi| ins.tensor(wi)?.as_slice::<f32>())
        .transpose()?;
    let weight = |j: usize| w.map_or(1.0, |w| w[j]);
    let y = outs.tensor(0)?.ensure::<f32>(&out_dims);
    for (i, o) in y.iter_mut().enumerate().take(outer) {
        let k = i * inner;
        let sum: f32 = (k..k + inner)
            .map(|j| weight(j) * term(kind, x[j], t[j]))
            .sum();
        *o = -sum / inner as f32;
    }
    Ok(())
}

/// Inputs dY, logits, targets (and the weights at input `weights`); output dlogits (logits'
/// shape).
fn backward(ctx: &mut OpContext<'_>, kind: Kind, weights: Option<usize>) -> Result<()> {
    same_shape(ctx, 1)?;
    if let Some(wi) = weights {
        weights_fit(ctx, 1, wi)?;
    }
    let (ins, mut outs) = ctx.split();
    let logits = ins.tensor(1)?;
    let (outer, inner) = outer_inner(logits);
    let g = ins.tensor(0)?.as_slice::<f32>()?;
    if g.len() != outer {
        bail!(
            ShapeMismatch: "the output gradient has {} values, expected one per example ({outer})",
            g.len()
        );
    }
    let dims = logits.dims().to_vec();
    let x = logits.as_slice::<f32>()?;
    let t = ins.tensor(2)?.as_slice::<f32>()?;
    let w = weights
        .map(|wi| ins.tensor(wi)?.as_slice::<f32>())
        .transpose()?;
    let weight = |j: usize| w.map_or(1.0, |w| w[j]);
    let dx = outs.tensor(0)?.ensure::<f32>(&dims);
    for (i, &gi) in g.iter().enumerate() {
        let factor = -gi / inner as f32;
        for j in i * inner..(i + 1) * inner {
            dx[j] = factor * weight(j) * term_grad(kind, x[j], t[j]);
        }
    }
    Ok(())
}

/// Checks that the weights (input `wi`) have the logits' (input `li`) shape.
fn weights_fit(ctx: &OpContext<'_>, li: usize, wi: usize) -> Result<()> {
    let (l, w) = (ctx.input(li)?, ctx.input(wi)?);
    if l.dims() != w.dims() {
        bail!(
            ShapeMismatch: "weights '{}' {:?} must have the shape of the logits {:?}",
            ctx.input_name(wi),
            w.dims(),
            l.dims()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Argument, OperatorDef};
    use crate::workspace::Workspace;

    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    fn close(a: &[f32], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((*x as f64 - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    fn flag(name: &str) -> Argument {
        Argument {
            name: Some(name.into()),
            i: Some(1),
            ..Default::default()
        }
    }

    fn run(args: &[&str], x: &[f32], t: &[f32], dims: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let ws = Workspace::new();
        ws.feed("x", Tensor::from_slice(dims, x).unwrap());
        ws.feed("t", Tensor::from_slice(dims, t).unwrap());
        let mut op = OperatorDef::new("SigmoidCrossEntropyWithLogits", ["x", "t"], ["y"]);
        op.arg.extend(args.iter().map(|a| flag(a)));
        ws.run_operator_once(&op).unwrap();
        let y = ws.fetch("y").unwrap();
        let n = y.numel();
        ws.feed("dy", Tensor::from_vec(y.dims(), vec![1.0f32; n]).unwrap());
        let mut g = OperatorDef::new(
            "SigmoidCrossEntropyWithLogitsGradient",
            ["dy", "x", "t"],
            ["dx"],
        );
        g.arg.extend(args.iter().map(|a| flag(a)));
        ws.run_operator_once(&g).unwrap();
        let dx = ws.fetch("dx").unwrap();
        assert_eq!(dx.dims(), dims);
        (
            y.as_slice::<f32>().unwrap().to_vec(),
            dx.as_slice::<f32>().unwrap().to_vec(),
        )
    }

    #[test]
    fn plain_loss_is_the_binary_cross_entropy() {
        let x = [0.5f32, -2.0, 30.0, -30.0];
        let t = [1.0f32, 0.25, 0.0, 1.0];
        let (y, dx) = run(&[], &x, &t, &[2, 2]);
        let bce = |x: f64, t: f64| {
            // Written with log-sigmoid terms that stay finite for |x| = 30.
            let ls = -(1.0 + (-x).exp()).ln();
            let l1s = -(1.0 + x.exp()).ln();
            -(t * ls + (1.0 - t) * l1s)
        };
        close(
            &y,
            &[
                (bce(0.5, 1.0) + bce(-2.0, 0.25)) / 2.0,
                (bce(30.0, 0.0) + bce(-30.0, 1.0)) / 2.0,
            ],
        );
        let want: Vec<f64> = x
            .iter()
            .zip(&t)
            .map(|(&x, &t)| (sigmoid(x as f64) - t as f64) / 2.0)
            .collect();
        close(&dx, &want);
    }

    #[test]
    fn log_d_trick_and_unjoined_terms() {
        let x = [0.7f32, -1.2];
        let t = [1.0f32, 0.0];
        let (y, dx) = run(&["log_D_trick"], &x, &t, &[2]);
        // (2t - 1) log s(x): +log s(0.7), -log s(-1.2); loss = -mean.
        let ls = |v: f64| sigmoid(v).ln();
        close(&y, &[-(ls(0.7) - ls(-1.2)) / 2.0]);
        close(
            &dx,
            &[
                -(1.0 / (1.0 + 0.7f64.exp())) / 2.0,
                (1.0 / (1.0 + (-1.2f64).exp())) / 2.0,
            ],
        );
        let (y, dx) = run(&["unjoined_lr_loss"], &x, &t, &[2]);
        // t x - (1 - t) log(1 + e^x).
        let u = |x: f64, t: f64| t * x - (1.0 - t) * (1.0 + x.exp()).ln();
        close(&y, &[-(u(0.7, 1.0) + u(-1.2, 0.0)) / 2.0]);
        close(&dx, &[-(1.0) / 2.0, -(-sigmoid(-1.2)) / 2.0]);
    }

    #[test]
    fn shapes_and_errors() {
        // A scalar logit gives a scalar loss.
        let (y, _) = run(&[], &[0.0], &[1.0], &[]);
        close(&y, &[std::f64::consts::LN_2]);
        let ws = Workspace::new();
        ws.feed("x", Tensor::from_vec(&[2], vec![0.0f32, 1.0]).unwrap());
        ws.feed("t", Tensor::from_vec(&[1, 2], vec![0.0f32, 1.0]).unwrap());
        let op = OperatorDef::new("SigmoidCrossEntropyWithLogits", ["x", "t"], ["y"]);
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("'x'") && e.contains("'t'"), "{e}");
        let mut op = OperatorDef::new("SigmoidCrossEntropyWithLogits", ["x", "x"], ["y"]);
        op.arg.push(flag("log_D_trick"));
        op.arg.push(flag("unjoined_lr_loss"));
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("cannot be set as True simultaneously"), "{e}");
    }
}
