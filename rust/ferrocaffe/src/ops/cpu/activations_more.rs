//! More activations and unary math with their gradients: Elu, Gelu (exact or tanh-based),
//! HardSigmoid, Mish, ReluN, Swish, Sinh, Cosh, Sign; and the integer bitwise ops
//! BitwiseAnd/Or/Xor (numpy or legacy broadcasting, like Add).
//!
//! Gradient input orders follow Caffe2's gradient makers:
//! - `(Y, dY)`: EluGradient, HardSigmoidGradient, ReluNGradient;
//! - `(dY, X)`: GeluGradient, SinhGradient, CoshGradient;
//! - `(X, Y, dY)`: SwishGradient, MishGradient.
//!
//! The float kernels compute in f64 and round once to f32.

use super::elementwise::{binary, input_dtype, input_meta, unary};
use super::math::BroadcastArgs;
use super::par::copy_if_inplace;
use crate::dispatch;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, ensure};

/// `sqrt(2 / pi)`, the slope inside the tanh approximation of Gelu.
const GELU_TANH_SCALE: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh approximation of Gelu.
const GELU_CUBIC: f64 = 0.044_715;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Elu", |i| {
        let alpha = f64::from(i.args.float("alpha", 1.0)?);
        float_map(move |x| if x > 0.0 { x } else { alpha * x.exp_m1() })
    });
    r.cpu("EluGradient", |i| {
        let alpha = f64::from(i.args.float("alpha", 1.0)?);
        pair_grad(
            Pair::ValueGrad,
            move |y, g| {
                if y > 0.0 {
                    g
                } else {
                    g * (y + alpha)
                }
            },
        )
    });
    r.cpu("Gelu", |i| {
        if i.args.bool("fast_gelu", false)? {
            float_map(gelu_tanh)
        } else {
            float_map(|x| x * normal_cdf(x))
        }
    });
    r.cpu("GeluGradient", |i| {
        if i.args.bool("fast_gelu", false)? {
            pair_grad(Pair::GradValue, |x, g| g * gelu_tanh_slope(x))
        } else {
            pair_grad(Pair::GradValue, |x, g| {
                g * (normal_cdf(x) + x * normal_pdf(x))
            })
        }
    });
    r.cpu("HardSigmoid", |i| {
        let alpha = f64::from(i.args.float("alpha", 0.2)?);
        let beta = f64::from(i.args.float("beta", 0.5)?);
        float_map(move |x| (alpha * x + beta).clamp(0.0, 1.0))
    });
    r.cpu("HardSigmoidGradient", |i| {
        let alpha = f64::from(i.args.float("alpha", 0.2)?);
        pair_grad(Pair::ValueGrad, move |y, g| {
            if y > 0.0 && y < 1.0 {
                g * alpha
            } else {
                0.0
            }
        })
    });
    r.cpu("ReluN", |i| {
        let n = relu_n_arg(i)?;
        float_map(move |x| x.clamp(0.0, n))
    });
    r.cpu("ReluNGradient", |i| {
        let n = relu_n_arg(i)?;
        pair_grad(
            Pair::ValueGrad,
            move |y, g| {
                if y > 0.0 && y < n {
                    g
                } else {
                    0.0
                }
            },
        )
    });
    r.cpu("Swish", |_| float_map(|x| x / (1.0 + (-x).exp())));
    r.cpu("SwishGradient", |_| {
        triple_grad(|x, y, g| g * (y + (1.0 - y) / (1.0 + (-x).exp())))
    });
    r.cpu("Mish", |_| float_map(|x| x * softplus(x).tanh()));
    r.cpu("MishGradient", |_| {
        triple_grad(|x, _y, g| {
            let t = softplus(x).tanh();
            let sig = 1.0 / (1.0 + (-x).exp());
            g * (t + x * (1.0 - t * t) * sig)
        })
    });
    r.cpu("Sinh", |_| float_map(f64::sinh));
    r.cpu("SinhGradient", |_| {
        pair_grad(Pair::GradValue, |x, g| g * x.cosh())
    });
    r.cpu("Cosh", |_| float_map(f64::cosh));
    r.cpu("CoshGradient", |_| {
        pair_grad(Pair::GradValue, |x, g| g * x.sinh())
    });
    r.cpu("BitwiseAnd", |i| create_bitwise(i, Bitwise::And));
    r.cpu("BitwiseOr", |i| create_bitwise(i, Bitwise::Or));
    r.cpu("BitwiseXor", |i| create_bitwise(i, Bitwise::Xor));
}

fn relu_n_arg(init: &OpInit<'_>) -> Result<f64> {
    let n = init.args.float("n", 6.0)?;
    if n.is_nan() || n <= 0.0 {
        bail!(op = init, BadArgument: "n > 0 expected for ReluN, got n = {n}");
    }
    Ok(f64::from(n))
}

/// `log(1 + exp(x))` without overflow for large `x`.
fn softplus(x: f64) -> f64 {
    if x > 30.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// The tanh approximation of Gelu (`fast_gelu=1`).
fn gelu_tanh(x: f64) -> f64 {
    let u = GELU_TANH_SCALE * (x + GELU_CUBIC * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

/// The derivative of [`gelu_tanh`].
fn gelu_tanh_slope(x: f64) -> f64 {
    let u = GELU_TANH_SCALE * (x + GELU_CUBIC * x * x * x);
    let t = u.tanh();
    let du = GELU_TANH_SCALE * (1.0 + 3.0 * GELU_CUBIC * x * x);
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
}

/// The standard normal density.
fn normal_pdf(x: f64) -> f64 {
    // 1 / sqrt(2 pi)
    0.398_942_280_401_432_7 * (-0.5 * x * x).exp()
}

/// The standard normal distribution function, `(1 + erf(x / sqrt 2)) / 2`.
fn normal_cdf(x: f64) -> f64 {
    0.5 * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// The error function to about f64 precision: `2/sqrt(pi) * exp(-a^2) * sum_n 2^n a^(2n+1) /
/// (2n+1)!!` for `|a| < 6` (every term positive, so no cancellation), and +-1 beyond (where
/// erf differs from +-1 by less than 1e-17).
pub(crate) fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() {
        return f64::NAN;
    }
    if a >= 6.0 {
        return 1f64.copysign(x);
    }
    let a2 = a * a;
    let (mut term, mut sum) = (a, a);
    let mut k = 1.0;
    while term > sum * 1e-17 && k < 400.0 {
        term *= 2.0 * a2 / (2.0 * k + 1.0);
        sum += term;
        k += 1.0;
    }
    let r = std::f64::consts::FRAC_2_SQRT_PI * (-a2).exp() * sum;
    r.min(1.0).copysign(x)
}

/// `y = f(x)` over a float input (in place allowed), computed in f64.
// `T` is f32 or f64: the cast to f64 is a no-op for the latter.
#[allow(clippy::unnecessary_cast)]
fn float_map(f: impl Fn(f64) -> f64 + Send + Sync + Copy + 'static) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dt = input_dtype(ctx, 0)?;
        dispatch!(dt, [Float => f32, Double => f64], |T| unary::<T, T>(ctx, |x: T| {
            f(x as f64) as T
        }))
    })))
}

/// Which of a two-input gradient's inputs is dY.
#[derive(Clone, Copy)]
enum Pair {
    /// `(Y or X, dY)`
    ValueGrad,
    /// `(dY, X)`
    GradValue,
}

/// `dX = f(value, dY)` from two float inputs of one shape, in the given order.
fn pair_grad(
    order: Pair,
    f: impl Fn(f64, f64) -> f64 + Send + Copy + 'static,
) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
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
            Pair::ValueGrad => binary::<f32, f32, f32>(ctx, &a, &a, &a, &a, |v, g| {
                f(f64::from(v), f64::from(g)) as f32
            }),
            Pair::GradValue => binary::<f32, f32, f32>(ctx, &a, &a, &a, &a, |g, v| {
                f(f64::from(v), f64::from(g)) as f32
            }),
        }
    })))
}

/// `dX = f(X, Y, dY)` from three float inputs of one shape (any of them may be the output).
fn triple_grad(
    f: impl Fn(f64, f64, f64) -> f64 + Send + Copy + 'static,
) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dims = ctx.input(0)?.dims().to_vec();
        for i in 0..3 {
            let t = ctx.input(i)?;
            ensure!(
                t.dims() == dims.as_slice(),
                op = ctx,
                ShapeMismatch: "input '{}' {:?} must have the shape of X {dims:?}",
                ctx.input_name(i),
                t.dims()
            );
            t.as_slice::<f32>()?;
        }
        let copies = [
            copy_if_inplace(ctx, 0)?,
            copy_if_inplace(ctx, 1)?,
            copy_if_inplace(ctx, 2)?,
        ];
        let (ins, mut outs) = ctx.split();
        let mut vals: [&[f32]; 3] = [&[], &[], &[]];
        for (i, c) in copies.iter().enumerate() {
            vals[i] = match c {
                Some(v) => v.as_slice(),
                None => ins.tensor(i)?.as_slice::<f32>()?,
            };
        }
        let out = outs.tensor(0)?.ensure::<f32>(&dims);
        for (k, o) in out.iter_mut().enumerate() {
            let (x, y, g) = (vals[0][k], vals[1][k], vals[2][k]);
            *o = f(f64::from(x), f64::from(y), f64::from(g)) as f32;
        }
        Ok(())
    })))
}

#[derive(Clone, Copy)]
enum Bitwise {
    And,
    Or,
    Xor,
}

fn create_bitwise(init: &OpInit<'_>, kind: Bitwise) -> Result<Box<dyn Operator>> {
    let bc = BroadcastArgs::new(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (la, lb, lc, c) = bc.shapes(ctx)?;
        let dt = input_dtype(ctx, 0)?;
        dispatch!(dt, [Bool => bool, Int32 => i32, Int64 => i64], |T| {
            binary::<T, T, T>(ctx, &la, &lb, &lc, &c, move |a: T, b: T| match kind {
                Bitwise::And => a & b,
                Bitwise::Or => a | b,
                Bitwise::Xor => a ^ b,
            })
        })
    })))
}

#[cfg(test)]
mod tests {
    use super::erf;
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn erf_matches_known_values() {
        // erf(0.5), erf(1), erf(2), erf(3) to 12 digits.
        for (x, want) in [
            (0.5, 0.520_499_877_813),
            (1.0, 0.842_700_792_950),
            (2.0, 0.995_322_265_019),
            (3.0, 0.999_977_909_503),
        ] {
            assert!((erf(x) - want).abs() < 1e-11, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-11);
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(7.0), 1.0);
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn relu_n_rejects_non_positive_n() {
        let ws = Workspace::new();
        ws.feed("X", Tensor::from_vec(&[2], vec![1.0f32, 7.0]).unwrap());
        let mut op = OperatorDef::new("ReluN", ["X"], ["Y"]);
        op.arg.push(crate::proto::Argument::float("n", 0.0));
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("n > 0"), "{e}");
        ws.run_operator_once(&OperatorDef::new("ReluN", ["X"], ["Y"]))
            .unwrap();
        assert_eq!(
            ws.fetch("Y").unwrap().as_slice::<f32>().unwrap(),
            &[1.0, 6.0]
        );
    }

    #[test]
    fn swish_gradient_runs_in_place_on_dy() {
        let ws = Workspace::new();
        let x = [0.5f32, -1.0];
        let y: Vec<f32> = x.iter().map(|v| v / (1.0 + (-v).exp())).collect();
        ws.feed("X", Tensor::from_vec(&[2], x.to_vec()).unwrap());
        ws.feed("Y", Tensor::from_vec(&[2], y.clone()).unwrap());
        ws.feed("G", Tensor::from_vec(&[2], vec![2.0f32, 3.0]).unwrap());
        ws.run_operator_once(&OperatorDef::new("SwishGradient", ["X", "Y", "G"], ["G"]))
            .unwrap();
        let got = ws.fetch("G").unwrap().as_slice::<f32>().unwrap().to_vec();
        for (((&xv, &yv), &gv), g0) in x.iter().zip(&y).zip(&got).zip([2.0f32, 3.0]) {
            let s = 1.0 / (1.0 + (-xv).exp());
            let want = g0 * (yv + s * (1.0 - yv));
            assert!((gv - want).abs() < 1e-6, "{got:?}");
        }
    }

    #[test]
    fn bitwise_ops_broadcast_integers() {
        let ws = Workspace::new();
        ws.feed(
            "A",
            Tensor::from_vec(&[2, 2], vec![12i64, 10, 7, 1]).unwrap(),
        );
        ws.feed("B", Tensor::from_vec(&[2], vec![10i64, 3]).unwrap());
        for (op, want) in [
            ("BitwiseAnd", [8i64, 2, 2, 1]),
            ("BitwiseOr", [14, 11, 15, 3]),
            ("BitwiseXor", [6, 9, 13, 2]),
        ] {
            ws.run_operator_once(&OperatorDef::new(op, ["A", "B"], ["C"]))
                .unwrap();
            assert_eq!(ws.fetch("C").unwrap().as_slice::<i64>().unwrap(), &want);
        }
        ws.feed("F", Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap());
        let e = ws
            .run_operator_once(&OperatorDef::new("BitwiseAnd", ["F", "F"], ["C"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Unsupported input type"), "{e}");
    }
}
