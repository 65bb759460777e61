//! `MakeTwoClass` and its gradient: a probability `p` becomes the two-class distribution
//! `(1 - p, p)` along a new last axis.

use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext};
use crate::ops::registry::Registry;
use crate::{bail, ensure};

/// Registers `MakeTwoClass` and `MakeTwoClassGradient`.
pub fn register(r: &mut Registry) {
    r.cpu("MakeTwoClass", |_| Ok(Box::new(FnOp(make_two_class))));
    r.cpu("MakeTwoClassGradient", |_| {
        Ok(Box::new(FnOp(make_two_class_gradient)))
    });
}

/// `Y[..., 0] = 1 - X`, `Y[..., 1] = X`; every `X` must lie in `[0, 1]`.
fn make_two_class(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let xs = x.as_slice::<f32>()?;
    if let Some(bad) = xs.iter().find(|v| !(0.0..=1.0).contains(*v)) {
        bail!(BadArgument: "MakeTwoClass expects probabilities in [0, 1], got {bad}");
    }
    let mut dims = x.dims().to_vec();
    dims.push(2);
    let y = outs.tensor(0)?.ensure::<f32>(&dims);
    for (pair, &p) in y.chunks_exact_mut(2).zip(xs) {
        pair[0] = 1.0 - p;
        pair[1] = p;
    }
    Ok(())
}

/// `dX = dY[..., 1] - dY[..., 0]`.
fn make_two_class_gradient(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let dy = ins.tensor(0)?;
    let dims = dy.dims();
    ensure!(
        dims.last() == Some(&2),
        ShapeMismatch: "MakeTwoClassGradient expects a last dimension of 2, got shape {dims:?}"
    );
    let dx_dims = dims[..dims.len() - 1].to_vec();
    let dys = dy.as_slice::<f32>()?;
    let dx = outs.tensor(0)?.ensure::<f32>(&dx_dims);
    for (g, pair) in dx.iter_mut().zip(dys.chunks_exact(2)) {
        *g = pair[1] - pair[0];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn two_class_forward_and_gradient() {
        let ws = Workspace::new();
        ws.feed(
            "x",
            Tensor::from_vec(&[3], vec![0.0f32, 0.25, 1.0]).unwrap(),
        );
        ws.run_operator_once(&OperatorDef::new("MakeTwoClass", ["x"], ["y"]))
            .unwrap();
        let y = ws.fetch("y").unwrap();
        assert_eq!(y.dims(), &[3, 2]);
        assert_eq!(
            y.as_slice::<f32>().unwrap(),
            &[1.0, 0.0, 0.75, 0.25, 0.0, 1.0]
        );

        ws.feed(
            "dy",
            Tensor::from_vec(&[2, 2], vec![1.0f32, 3.0, 5.0, 2.0]).unwrap(),
        );
        ws.run_operator_once(&OperatorDef::new("MakeTwoClassGradient", ["dy"], ["dx"]))
            .unwrap();
        let dx = ws.fetch("dx").unwrap();
        assert_eq!(dx.dims(), &[2]);
        assert_eq!(dx.as_slice::<f32>().unwrap(), &[2.0, -3.0]);
    }

    #[test]
    fn two_class_rejects_values_outside_unit_interval() {
        let ws = Workspace::new();
        ws.feed("x", Tensor::from_vec(&[2], vec![0.5f32, 1.5]).unwrap());
        let e = ws
            .run_operator_once(&OperatorDef::new("MakeTwoClass", ["x"], ["y"]))
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::BadArgument);
        ws.feed(
            "dy",
            Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap(),
        );
        let e = ws
            .run_operator_once(&OperatorDef::new("MakeTwoClassGradient", ["dy"], ["dx"]))
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::ShapeMismatch);
    }
}
