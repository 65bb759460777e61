//! Gradient kernels of the float unary math ops (Sin, Cos, Tan, Acos, Asin, Atan, Cbrt,
//! Reciprocal, RSqrt, Cube, Log1p), plus Caffe2's spelling `RSqrt` of the forward op (`Rsqrt` lives in
//! [`super::math`]).
//!
//! Input order follows the gradient makers of Caffe2, which differ per op:
//! - `(X, dY)`: SinGradient, CosGradient, TanGradient, AcosGradient, AsinGradient, AtanGradient,
//!   Log1pGradient (the derivative is a function of the forward input);
//! - `(dY, Y)`: CbrtGradient, RSqrtGradient (also registered as `RsqrtGradient`);
//! - `(dY, X)`: CubeGradient;
//! - `(Y, dY)`: ReciprocalGradient.
//!
//! Both inputs must have the same shape; the output `dX` gets it. Float only.

use super::elementwise::{binary, input_meta, unary};
use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext};
use crate::ops::registry::Registry;

/// Which input holds the output gradient.
#[derive(Clone, Copy)]
enum Order {
    /// `(X or Y, dY)`
    ValueFirst,
    /// `(dY, Y)`
    GradFirst,
}

/// Registers the family.
pub fn register(r: &mut Registry) {
    macro_rules! grad {
        ($($name:literal, $order:expr => $f:expr),* $(,)?) => {$(
            r.cpu($name, |_| Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
                let f: fn(f64, f64) -> f64 = $f;
                run(ctx, $order, f)
            }))));
        )*};
    }
    // The closures take (value, dY) whatever the input order.
    grad!(
        "SinGradient", Order::ValueFirst => |x, g| g * x.cos(),
        "CosGradient", Order::ValueFirst => |x, g| -g * x.sin(),
        "TanGradient", Order::ValueFirst => |x, g| g / (x.cos() * x.cos()),
        "AcosGradient", Order::ValueFirst => |x, g| -g / (1.0 - x * x).sqrt(),
        "AsinGradient", Order::ValueFirst => |x, g| g / (1.0 - x * x).sqrt(),
        "AtanGradient", Order::ValueFirst => |x, g| g / (1.0 + x * x),
        "CbrtGradient", Order::GradFirst => |y, g| g / (y * y) / 3.0,
        "RSqrtGradient", Order::GradFirst => |y, g| -0.5 * g * y * y * y,
        "RsqrtGradient", Order::GradFirst => |y, g| -0.5 * g * y * y * y,
        "ReciprocalGradient", Order::ValueFirst => |y, g| -g * y * y,
        "Log1pGradient", Order::ValueFirst => |x, g| g / (1.0 + x),
        "CubeGradient", Order::GradFirst => |x, g| 3.0 * g * x * x,
    );
    r.cpu("RSqrt", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            unary::<f32, f32>(ctx, |x| 1.0 / x.sqrt())
        })))
    });
}

fn run(ctx: &mut OpContext<'_>, order: Order, f: fn(f64, f64) -> f64) -> Result<()> {
    let (a, _) = input_meta(ctx, 0)?;
    let (b, _) = input_meta(ctx, 1)?;
    if a != b {
        bail!(
            op = ctx,
            ShapeMismatch: "inputs '{}' {a:?} and '{}' {b:?} must have the same shape",
            ctx.input_name(0),
            ctx.input_name(1)
        );
    }
    match order {
        Order::ValueFirst => {
            binary::<f32, f32, f32>(ctx, &a, &a, &a, &a, |v, g| f(v as f64, g as f64) as f32)
        }
        Order::GradFirst => {
            binary::<f32, f32, f32>(ctx, &a, &a, &a, &a, |g, v| f(v as f64, g as f64) as f32)
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn run(op: &str, a: &[f32], b: &[f32]) -> Vec<f32> {
        let ws = Workspace::new();
        ws.feed("A", Tensor::from_vec(&[a.len()], a.to_vec()).unwrap());
        ws.feed("B", Tensor::from_vec(&[b.len()], b.to_vec()).unwrap());
        ws.run_operator_once(&OperatorDef::new(op, ["A", "B"], ["C"]))
            .unwrap();
        ws.fetch("C").unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    fn close(a: &[f32], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((*x as f64 - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn cube_takes_dy_then_x_and_log1p_x_then_dy() {
        let (x, g) = ([0.5f32, -2.0], [2.0f32, 3.0]);
        // CubeGradient(dY, X) = 3 X^2 dY; Log1pGradient(X, dY) = dY / (1 + X).
        close(&run("CubeGradient", &g, &x), &[1.5, 36.0]);
        close(&run("Log1pGradient", &x, &g), &[2.0 / 1.5, -3.0]);
    }

    #[test]
    fn trig_gradients_take_x_then_dy() {
        let x = [0.3f32, -0.7];
        let g = [2.0f32, -1.5];
        let xs = x.map(|v| v as f64);
        let gs = g.map(|v| v as f64);
        let each = |f: fn(f64, f64) -> f64| -> Vec<f64> {
            xs.iter().zip(&gs).map(|(&a, &b)| f(a, b)).collect()
        };
        close(&run("SinGradient", &x, &g), &each(|x, g| g * x.cos()));
        close(&run("CosGradient", &x, &g), &each(|x, g| -g * x.sin()));
        close(
            &run("TanGradient", &x, &g),
            &each(|x, g| g / x.cos().powi(2)),
        );
        close(
            &run("AcosGradient", &x, &g),
            &each(|x, g| -g / (1.0 - x * x).sqrt()),
        );
        close(
            &run("AsinGradient", &x, &g),
            &each(|x, g| g / (1.0 - x * x).sqrt()),
        );
        close(
            &run("AtanGradient", &x, &g),
            &each(|x, g| g / (1.0 + x * x)),
        );
    }

    #[test]
    fn output_based_gradients_follow_caffe2_input_order() {
        // CbrtGradient(dY, Y): dY / (3 Y^2).
        close(
            &run("CbrtGradient", &[3.0, 1.0], &[2.0, -1.0]),
            &[0.25, 1.0 / 3.0],
        );
        // RSqrtGradient(dY, Y): -0.5 dY Y^3.
        close(
            &run("RSqrtGradient", &[2.0, 1.0], &[0.5, 2.0]),
            &[-0.125, -4.0],
        );
        close(
            &run("RsqrtGradient", &[2.0, 1.0], &[0.5, 2.0]),
            &[-0.125, -4.0],
        );
        // ReciprocalGradient(Y, dY): -dY Y^2.
        close(
            &run("ReciprocalGradient", &[0.5, 2.0], &[4.0, 1.0]),
            &[-1.0, -4.0],
        );
    }

    #[test]
    fn shape_mismatch_and_type_errors() {
        let ws = Workspace::new();
        ws.feed("A", Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap());
        ws.feed("B", Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap());
        ws.feed("I", Tensor::from_vec(&[2], vec![1i32, 2]).unwrap());
        let e = ws
            .run_operator_once(&OperatorDef::new("SinGradient", ["A", "B"], ["C"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("same shape"), "{e}");
        let e = ws
            .run_operator_once(&OperatorDef::new("CosGradient", ["I", "A"], ["C"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mismatch"), "{e}");
    }

    #[test]
    fn rsqrt_forward_and_in_place_gradient() {
        let ws = Workspace::new();
        ws.feed("X", Tensor::from_vec(&[2], vec![4.0f32, 0.25]).unwrap());
        ws.run_operator_once(&OperatorDef::new("RSqrt", ["X"], ["Y"]))
            .unwrap();
        assert_eq!(
            ws.fetch("Y").unwrap().as_slice::<f32>().unwrap(),
            &[0.5, 2.0]
        );
        ws.feed("dY", Tensor::from_vec(&[2], vec![1.0f32, 1.0]).unwrap());
        ws.run_operator_once(&OperatorDef::new("CbrtGradient", ["dY", "Y"], ["dY"]))
            .unwrap();
        let got = ws.fetch("dY").unwrap().as_slice::<f32>().unwrap().to_vec();
        close(&got, &[4.0 / 3.0, 1.0 / 12.0]);
    }
}
