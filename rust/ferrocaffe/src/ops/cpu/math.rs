//! Arithmetic: Add/Sub/Mul/Div (numpy broadcasting, or Caffe2's legacy `broadcast=1` with
//! `axis`/`axis_str`), Sum, unary math (Relu, Sigmoid, Tanh, Exp, Log, Sqr, Sqrt, Negative, Abs,
//! ...), Scale, SumElements, and the simple gradients of these.

use super::broadcast::binary_shapes;
use super::elementwise::{binary, input_dtype, input_meta, nary_same_shape, unary, unary_slices};
use crate::dispatch;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::Element;
use crate::{bail, err};

/// Registers the math family.
pub fn register(r: &mut Registry) {
    r.cpu("Add", |i| create_binary(i, Arith::Add));
    r.cpu("Sub", |i| create_binary(i, Arith::Sub));
    r.cpu("Mul", |i| create_binary(i, Arith::Mul));
    r.cpu("Div", |i| create_binary(i, Arith::Div));
    r.cpu("Sum", |_| Ok(Box::new(FnOp(sum_kernel))));
    r.cpu("Scale", create_scale);
    r.cpu("SumElements", |i| create_sum_elements(i, false));
    r.cpu("SumElementsGradient", |i| create_sum_elements(i, true));
    macro_rules! float_unary {
        ($($name:literal => $f:expr),* $(,)?) => {$(
            r.cpu($name, |_| Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
                let dt = input_dtype(ctx, 0)?;
                dispatch!(dt, [Float => f32, Double => f64], |T| unary::<T, T>(ctx, |x: T| {
                    let f: fn(f64) -> f64 = $f;
                    f(x as f64) as T
                }))
            }))));
        )*};
    }
    float_unary!(
        "Exp" => f64::exp,
        "Log" => f64::ln,
        "Sqrt" => f64::sqrt,
        "Rsqrt" => |x| 1.0 / x.sqrt(),
        "Reciprocal" => |x| 1.0 / x,
        "Cos" => f64::cos,
        "Sin" => f64::sin,
        "Tan" => f64::tan,
        "Acos" => f64::acos,
        "Asin" => f64::asin,
        "Atan" => f64::atan,
        "Softsign" => |x| x / (1.0 + x.abs()),
        "Log1p" => f64::ln_1p,
        "Cbrt" => f64::cbrt,
    );
    r.cpu("Tanh", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let dt = input_dtype(ctx, 0)?;
            if dt == crate::tensor::DataType::Double {
                return unary::<f64, f64>(ctx, f64::tanh);
            }
            unary_slices::<f32, f32>(ctx, tanh_slice)
        })))
    });
    r.cpu("Sigmoid", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let dt = input_dtype(ctx, 0)?;
            dispatch!(dt, [Float => f32, Double => f64], |T| {
                if dt == crate::tensor::DataType::Float {
                    unary_slices::<f32, f32>(ctx, sigmoid_slice)
                } else {
                    unary::<T, T>(ctx, |x: T| 1.0 / (1.0 + (-x).exp()))
                }
            })
        })))
    });
    r.cpu("Relu", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let dt = input_dtype(ctx, 0)?;
            dispatch!(dt, [Float => f32, Double => f64], |T| unary::<T, T>(ctx, |x: T| {
                if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }))
        })))
    });
    macro_rules! signed_unary {
        ($($name:literal => $f:ident),* $(,)?) => {$(
            r.cpu($name, |_| Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
                let dt = input_dtype(ctx, 0)?;
                dispatch!(dt, [Float => f32, Double => f64, Int32 => i32, Int64 => i64], |T| {
                    unary::<T, T>(ctx, |x: T| Signed::$f(x))
                })
            }))));
        )*};
    }
    signed_unary!("Negative" => neg, "Abs" => abs, "Sqr" => sqr, "Sign" => sign, "Cube" => cube);
    r.cpu("ReluGradient", |_| Ok(Box::new(FnOp(relu_grad))));
    r.cpu("SigmoidGradient", |_| Ok(Box::new(FnOp(sigmoid_grad))));
    r.cpu("TanhGradient", |_| Ok(Box::new(FnOp(tanh_grad))));
}

/// `tanh` of f32 values without a libm call, so the loop vectorizes: below `|x| = 0.3` the odd
/// Taylor polynomial to `x^11` (truncation below 1e-8 relative), above it
/// `sign(x) (1 - 2 / (e^{2|x|} + 1))` with [`super::rnn_units::exp`] (a few ulp; saturates to
/// 1 for large `|x|`; NaN stays NaN). Fused multiply-adds, so every SIMD level gives the
/// same bits.
#[inline(always)]
fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let p = x2.mul_add(-1382.0 / 155_925.0, 62.0 / 2835.0);
    let p = x2.mul_add(p, -17.0 / 315.0);
    let p = x2.mul_add(p, 2.0 / 15.0);
    let p = x2.mul_add(p, -1.0 / 3.0);
    let small = (a * x2).mul_add(p, a);
    let e = super::rnn_units::exp(2.0 * a);
    let big = 1.0 - 2.0 / (e + 1.0);
    // Odd: computed for |x|, given the sign of x (so tanh(-0) = -0).
    (if a < 0.3 { small } else { big }).copysign(x)
}

/// [`tanh_f32`] over a slice (compiled per SIMD level, chosen at run time).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn tanh_slice(x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = tanh_f32(v);
    }
}

/// `1 / (1 + e^-x)` over a slice of f32, with [`super::rnn_units::exp`] (a few ulp; 0 and 1
/// at the ends of its clamped range; NaN stays NaN), compiled per SIMD level so the loop
/// vectorizes: through `f64::exp`, a library call per value, a 64-value batch of
/// probabilities took half a microsecond.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn sigmoid_slice(x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = 1.0 / (1.0 + super::rnn_units::exp(-v));
    }
}

/// Relu as the Relu op computes it on f32: `v > 0 ? v : 0` (a NaN gives 0). The ops that apply
/// an in-place Relu folded into them ([`crate::ops::operator::Operator::fuse_relu`]) use this,
/// so a net gives the bits of the two ops run one after the other.
#[inline(always)]
pub(crate) fn relu(v: f32) -> f32 {
    if v > 0.0 {
        v
    } else {
        0.0
    }
}

/// [`relu`] over `y`, in place.
pub(crate) fn relu_in_place(y: &mut [f32]) {
    for v in y {
        *v = relu(*v);
    }
}

/// Per-type arithmetic (integers wrap and divide by zero to 0 instead of trapping).
pub trait Arithmetic: Element + PartialOrd {
    /// a + b
    fn add(a: Self, b: Self) -> Self;
    /// a - b
    fn sub(a: Self, b: Self) -> Self;
    /// a * b
    fn mul(a: Self, b: Self) -> Self;
    /// a / b
    fn div(a: Self, b: Self) -> Self;
}

macro_rules! float_arith {
    ($($t:ty),*) => {$(impl Arithmetic for $t {
        fn add(a: Self, b: Self) -> Self { a + b }
        fn sub(a: Self, b: Self) -> Self { a - b }
        fn mul(a: Self, b: Self) -> Self { a * b }
        fn div(a: Self, b: Self) -> Self { a / b }
    })*};
}
macro_rules! int_arith {
    ($($t:ty),*) => {$(impl Arithmetic for $t {
        fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
        fn sub(a: Self, b: Self) -> Self { a.wrapping_sub(b) }
        fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
        fn div(a: Self, b: Self) -> Self { a.checked_div(b).unwrap_or(0) }
    })*};
}
float_arith!(f32, f64);
int_arith!(i32, i64);

/// Sign-aware helpers for the unary ops shared by floats and integers.
pub trait Signed: Arithmetic {
    /// -x
    fn neg(x: Self) -> Self;
    /// |x|
    fn abs(x: Self) -> Self;
    /// x * x
    fn sqr(x: Self) -> Self {
        Self::mul(x, x)
    }
    /// x * x * x
    fn cube(x: Self) -> Self {
        Self::mul(Self::mul(x, x), x)
    }
    /// -1, 0 or 1
    fn sign(x: Self) -> Self;
}

macro_rules! signed {
    ($($t:ty: $zero:expr, $one:expr),*) => {$(impl Signed for $t {
        fn neg(x: Self) -> Self { Self::sub($zero, x) }
        fn abs(x: Self) -> Self { if x < $zero { Self::neg(x) } else { x } }
        fn sign(x: Self) -> Self { if x > $zero { $one } else if x < $zero { Self::neg($one) } else { $zero } }
    })*};
}
signed!(f32: 0.0, 1.0, f64: 0.0, 1.0, i32: 0, 1, i64: 0, 1);

#[derive(Clone, Copy, Debug)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

/// The `broadcast` / `axis` / `axis_str` / `order` arguments of binary elementwise ops.
#[derive(Clone, Copy, Debug)]
pub struct BroadcastArgs {
    /// Caffe2's legacy broadcast.
    pub legacy: bool,
    /// Legacy broadcast axis (-1: align to the end).
    pub axis: i64,
}

impl BroadcastArgs {
    /// Reads and checks the arguments.
    pub fn new(init: &OpInit<'_>) -> Result<Self> {
        let a = &init.args;
        let legacy = a.bool("broadcast", false)?;
        let mut axis = a.int("axis", -1)?;
        let axis_str = a.string("axis_str", "")?;
        let order = a.string("order", "NCHW")?;
        if legacy {
            if axis != -1 {
                if !axis_str.is_empty() {
                    bail!(
                        op = init,
                        BadArgument: "Args axis and axis_str cannot be used simultaneously."
                    );
                }
            } else if !axis_str.is_empty() {
                if axis_str.len() != 1 {
                    bail!(op = init, BadArgument: "Unsupported axis string {axis_str}");
                }
                axis = order.find(&axis_str).ok_or_else(|| {
                    err!(
                        op = init,
                        BadArgument: "Unrecognizable axis string {axis_str} from order string \
                         {order}"
                    )
                })? as i64;
            }
        } else if axis != -1 || !axis_str.is_empty() {
            bail!(
                op = init,
                BadArgument: "Do not specify axis or axis_str if broadcast is not enabled."
            );
        }
        Ok(BroadcastArgs { legacy, axis })
    }

    /// `(a_loop, b_loop, c_loop, c_dims)` for operands of shapes `a` and `b` (no in-place checks).
    #[allow(clippy::type_complexity)]
    pub fn shapes_of(
        &self,
        a: &[usize],
        b: &[usize],
    ) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>)> {
        let (la, lb, c) = binary_shapes(a, b, self.legacy, self.axis)?;
        if self.legacy {
            let nc: usize = c.iter().product();
            let lc = if lb.len() == 1 { vec![nc] } else { la.clone() };
            return Ok((la, lb, lc, c));
        }
        Ok((la, lb, c.clone(), c))
    }

    /// `(a_loop, b_loop, c_loop, c_dims)` for inputs 0 and 1 of `ctx`.
    #[allow(clippy::type_complexity)]
    pub fn shapes(
        &self,
        ctx: &OpContext<'_>,
    ) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>)> {
        let a = ctx.input(0)?.dims().to_vec();
        let b = ctx.input(1)?.dims().to_vec();
        if self.legacy && ctx.num_outputs() > 0 && ctx.is_inplace(1, 0) {
            bail!(
                op = ctx,
                Schema: "In-place is allowed only with the first tensor when legacy-broadcasting"
            );
        }
        let (la, lb, c) = binary_shapes(&a, &b, self.legacy, self.axis)?;
        if self.legacy {
            let nc: usize = c.iter().product();
            let lc = if lb.len() == 1 { vec![nc] } else { la.clone() };
            return Ok((la, lb, lc, c));
        }
        if ctx.is_inplace(0, 0) && c != a {
            bail!(op = ctx, ShapeMismatch: "C_dims {c:?} must equal A_dims {a:?} to run in place");
        }
        if ctx.is_inplace(1, 0) && c != b {
            bail!(op = ctx, ShapeMismatch: "C_dims {c:?} must equal B_dims {b:?} to run in place");
        }
        Ok((la, lb, c.clone(), c))
    }
}

fn create_binary(init: &OpInit<'_>, op: Arith) -> Result<Box<dyn Operator>> {
    let bc = BroadcastArgs::new(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (la, lb, lc, c) = bc.shapes(ctx)?;
        let dt = input_dtype(ctx, 0)?;
        dispatch!(dt, [Float => f32, Double => f64, Int32 => i32, Int64 => i64], |T| {
            // One instantiation per operation (a function pointer would not be inlined
            // into the element loop, which then would not vectorize).
            match op {
                Arith::Add => binary::<T, T, T>(ctx, &la, &lb, &lc, &c, T::add),
                Arith::Sub => binary::<T, T, T>(ctx, &la, &lb, &lc, &c, T::sub),
                Arith::Mul => binary::<T, T, T>(ctx, &la, &lb, &lc, &c, T::mul),
                Arith::Div => binary::<T, T, T>(ctx, &la, &lb, &lc, &c, T::div),
            }
        })
    })))
}

fn sum_kernel(ctx: &mut OpContext<'_>) -> Result<()> {
    let dt = input_dtype(ctx, 0)?;
    dispatch!(dt, [Float => f32, Double => f64, Int32 => i32, Int64 => i64], |T| {
        nary_same_shape::<T>(ctx, T::add)
    })
}

fn create_scale(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let s = init.args.float("scale", 1.0)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dt = input_dtype(ctx, 0)?;
        dispatch!(dt, [Float => f32, Double => f64], |T| unary::<T, T>(ctx, |x: T| x * s as T))
    })))
}

fn create_sum_elements(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let average = init.args.bool("average", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (dims, dt) = input_meta(ctx, 0)?;
        let n = dims.iter().product::<usize>();
        if gradient {
            let g = ctx.input(1)?;
            if g.numel() != 1 {
                bail!(
                    op = ctx,
                    ShapeMismatch: "SumElementsGradient expects a scalar output gradient"
                );
            }
            let mut v = g.get_f64(0)? as f32;
            if average && n > 0 {
                v /= n as f32;
            }
            if dt != crate::tensor::DataType::Float {
                bail!(op = ctx, DtypeMismatch: "SumElementsGradient supports float, got {dt}");
            }
            ctx.output(0)?.ensure::<f32>(&dims).fill(v);
            return Ok(());
        }
        if dt == crate::tensor::DataType::Float {
            // Vectorized and shared out (see `total_f64`); the other types add one by one.
            let mut acc = super::sums::total_f64(ctx.input(0)?.as_slice::<f32>()?)?;
            if average && n > 0 {
                acc /= n as f64;
            }
            ctx.output(0)?.ensure::<f32>(&[])[0] = acc as f32;
            return Ok(());
        }
        dispatch!(dt, [Float => f32, Double => f64, Int32 => i32, Int64 => i64], |T| {
            let x = ctx.input(0)?.as_slice::<T>()?;
            #[allow(clippy::unnecessary_cast)]
            let mut acc = x.iter().fold(0.0f64, |a, &v| a + v as f64);
            if average && n > 0 {
                acc /= n as f64;
            }
            ctx.output(0)?.ensure::<T>(&[])[0] = acc as T;
            Ok(())
        })
    })))
}

fn grad_same_shape(ctx: &mut OpContext<'_>, f: impl Fn(f32, f32) -> f32) -> Result<()> {
    let (yd, _) = input_meta(ctx, 0)?;
    let (gd, _) = input_meta(ctx, 1)?;
    if yd != gd {
        bail!(op = ctx, ShapeMismatch: "Y ({yd:?}) and dY ({gd:?}) must have the same shape");
    }
    binary::<f32, f32, f32>(ctx, &yd, &gd, &yd, &yd, f)
}

fn relu_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    grad_same_shape(ctx, |y, dy| if y > 0.0 { dy } else { 0.0 })
}

fn sigmoid_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    grad_same_shape(ctx, |y, dy| dy * y * (1.0 - y))
}

fn tanh_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    grad_same_shape(ctx, |y, dy| dy * (1.0 - y * y))
}
