//! Learning-rate scaling ops: Lars (layer-wise adaptive rate scaling with clipping) and
//! LearningRateAdaption (hypergradient step on the learning rate).
//!
//! - `Lars(X, dX, wd, trust, lr_max) -> lr_rescaled` (shape `[1]`): with the L2 norms of X and
//!   dX, `trust / (|dX| / |X| + wd + offset)` when `|X| > 0`, else 1, then clipped to
//!   `[lr_min, lr_max]` (min with lr_max first, then max with lr_min). Arguments `offset`
//!   (0.5) and `lr_min` (0.02), both must be >= 0.
//! - `LearningRateAdaption(lr, grad, effgrad) -> lr'` (shape of lr, may be lr itself): with
//!   `x = <grad, effgrad>`, `lr' = lr * (1 - lr_alpha * x / (max(|grad|, 1e-12) *
//!   max(|effgrad|, 1e-12)))` when `normalized_lr_adaption` (the default), else
//!   `lr' = lr - lr_alpha * x`. Argument `lr_alpha` (0.01).

use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Lars", create_lars);
    r.cpu("LearningRateAdaption", create_adaption);
}

fn floats<'c>(ctx: &'c OpContext<'_>, i: usize) -> Result<&'c [f32]> {
    ctx.input(i)?.as_slice::<f32>()
}

fn one(ctx: &OpContext<'_>, i: usize) -> Result<f32> {
    let v = floats(ctx, i)?;
    match v {
        [x] => Ok(*x),
        _ => Err(err!(
            ShapeMismatch: "input {i} ('{}') must hold one value, got {}",
            ctx.input_name(i),
            v.len()
        )),
    }
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

fn create_lars(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let offset = init.args.float("offset", 0.5)?;
    let lr_min = init.args.float("lr_min", 0.02)?;
    if offset < 0.0 || lr_min < 0.0 {
        bail!(
            op = init,
            BadArgument: "offset ({offset}) and lr_min ({lr_min}) must not be negative"
        );
    }
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let x = floats(ctx, 0)?;
        let dx = floats(ctx, 1)?;
        if x.len() != dx.len() {
            bail!(
                op = ctx,
                ShapeMismatch: "Gradient size doesn't match parameter size: {} vs {}",
                dx.len(),
                x.len()
            );
        }
        let (wd, trust, lr_max) = (one(ctx, 2)?, one(ctx, 3)?, one(ctx, 4)?);
        let x_norm = norm(x);
        let val = if x_norm > 0.0 {
            trust / (norm(dx) / x_norm + wd + offset)
        } else {
            1.0
        };
        ctx.output(0)?.ensure::<f32>(&[1])[0] = val.min(lr_max).max(lr_min);
        Ok(())
    })))
}

fn create_adaption(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let alpha = init.args.float("lr_alpha", 0.01)?;
    let normalized = init.args.bool("normalized_lr_adaption", true)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let lr = one(ctx, 0)?;
        let lr_dims = ctx.input(0)?.dims().to_vec();
        let g = floats(ctx, 1)?;
        let e = floats(ctx, 2)?;
        if g.len() != e.len() {
            bail!(
                op = ctx,
                ShapeMismatch: "grad ({} values) and effgrad ({}) must have the same size",
                g.len(),
                e.len()
            );
        }
        const EPS: f32 = 1e-12;
        let dot: f32 = g.iter().zip(e).map(|(a, b)| a * b).sum();
        let new_lr = if normalized {
            let gn = norm(g).max(EPS);
            let en = norm(e).max(EPS);
            lr * (1.0 - alpha * dot / (gn * en))
        } else {
            lr - alpha * dot
        };
        ctx.output(0)?.ensure::<f32>(&lr_dims)[0] = new_lr;
        Ok(())
    })))
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn lars_ws(x: Vec<f32>, dx: Vec<f32>) -> std::sync::Arc<Workspace> {
        let ws = Workspace::new();
        ws.feed("X", Tensor::from_vec(&[x.len()], x).unwrap());
        ws.feed("dX", Tensor::from_vec(&[dx.len()], dx).unwrap());
        ws.feed("wd", Tensor::from_vec(&[1], vec![0.1f32]).unwrap());
        ws.feed("trust", Tensor::from_vec(&[1], vec![2.0f32]).unwrap());
        ws.feed("lr_max", Tensor::from_vec(&[1], vec![10.0f32]).unwrap());
        ws
    }

    fn lars(ws: &std::sync::Arc<Workspace>, args: Vec<Argument>) -> crate::Result<f32> {
        let mut op = OperatorDef::new("Lars", ["X", "dX", "wd", "trust", "lr_max"], ["out"]);
        op.arg = args;
        ws.run_operator_once(&op)?;
        let t = ws.fetch("out")?;
        assert_eq!(t.dims(), &[1]);
        Ok(t.as_slice::<f32>()?[0])
    }

    #[test]
    fn lars_rescales_and_clips() {
        // |X| = 5, |dX| = 10: 2 / (2 + 0.1 + 0.5).
        let ws = lars_ws(vec![3.0, 4.0], vec![6.0, 8.0]);
        let v = lars(&ws, vec![]).unwrap();
        assert!((v - 2.0 / 2.6).abs() < 1e-6, "{v}");
        // lr_min clips from below, lr_max from above.
        let v = lars(&ws, vec![Argument::float("lr_min", 1.0)]).unwrap();
        assert_eq!(v, 1.0);
        ws.feed("lr_max", Tensor::from_vec(&[1], vec![0.5f32]).unwrap());
        assert_eq!(lars(&ws, vec![]).unwrap(), 0.5);
        // A zero parameter gives 1 (then clipped).
        let ws = lars_ws(vec![0.0, 0.0], vec![6.0, 8.0]);
        assert_eq!(lars(&ws, vec![]).unwrap(), 1.0);
    }

    #[test]
    fn lars_errors() {
        let ws = lars_ws(vec![3.0, 4.0], vec![6.0]);
        let e = lars(&ws, vec![]).unwrap_err().to_string();
        assert!(e.contains("Gradient size"), "{e}");
        let ws = lars_ws(vec![3.0, 4.0], vec![6.0, 8.0]);
        let e = lars(&ws, vec![Argument::float("offset", -1.0)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("must not be negative"), "{e}");
    }

    #[test]
    fn learning_rate_adaption_both_modes() {
        let ws = Workspace::new();
        ws.feed("lr", Tensor::from_vec(&[1], vec![-0.5f32]).unwrap());
        ws.feed("g", Tensor::from_vec(&[2], vec![3.0f32, 4.0]).unwrap());
        ws.feed("e", Tensor::from_vec(&[2], vec![4.0f32, 3.0]).unwrap());
        let mut op = OperatorDef::new("LearningRateAdaption", ["lr", "g", "e"], ["lr2"]);
        op.arg.push(Argument::float("lr_alpha", 0.5));
        ws.run_operator_once(&op).unwrap();
        // dot = 24, norms 5 and 5: -0.5 * (1 - 0.5 * 24 / 25).
        let v = ws.fetch("lr2").unwrap().as_slice::<f32>().unwrap()[0];
        assert!((v - (-0.5 * (1.0 - 0.48))).abs() < 1e-6, "{v}");
        op.arg.push(Argument {
            name: Some("normalized_lr_adaption".into()),
            i: Some(0),
            ..Default::default()
        });
        op.output[0] = "lr".into();
        ws.run_operator_once(&op).unwrap();
        let v = ws.fetch("lr").unwrap().as_slice::<f32>().unwrap()[0];
        assert_eq!(v, -0.5 - 0.5 * 24.0);
        ws.feed("e", Tensor::from_vec(&[1], vec![1.0f32]).unwrap());
        assert!(ws.run_operator_once(&op).is_err());
    }
}
