//! Element-wise ops: unary ops keep their input's shape and type, binary ops broadcast
//! (numpy rules, or Caffe2's legacy `broadcast=1`: the first input's shape), comparisons and
//! logical ops give bools, casts change only the type.

use super::{dtype, BlobShape, Ctx, Out, Rule, Stop};

/// Ops whose output 0 is input 0's shape and type (Caffe2's `IdenticalTypeAndShape`).
const IDENTICAL: &[&str] = &[
    "Abs",
    "Acos",
    "Alias",
    "Asin",
    "Atan",
    "BatchNormalization",
    "Cbrt",
    "Ceil",
    "Clip",
    "Copy",
    "CopyCPUToGPU",
    "CopyFromCPUInput",
    "CopyGPUToCPU",
    "Cos",
    "Cosh",
    "Cube",
    "Elu",
    "EnsureCPUOutput",
    "EnsureDense",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "HardSigmoid",
    "LeakyRelu",
    "Log",
    "Log1p",
    "Logit",
    "LpNorm",
    "Mish",
    "Negative",
    "Normalize",
    "NormalizeL1",
    "PRelu",
    "Reciprocal",
    "Relu",
    "ReluN",
    "Round",
    "Rsqrt",
    "Scale",
    "Selu",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Softmax",
    "Softplus",
    "Softsign",
    "Sqr",
    "Sqrt",
    "StopGradient",
    "Sum",
    "Swish",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "WeightedSum",
    "Not",
    "BitwiseNot",
    "Print",
    "LayerNormGradient",
    "Mean",
    "Max",
    "Min",
    "SoftmaxGradient",
    "ClipTensorByScaling",
];

/// Ops whose output 0 is input 1's shape and type (Caffe2's `IdenticalTypeAndShapeOfInput(1)`).
const IDENTICAL_OF_1: &[&str] = &[
    "ReluGradient",
    "SigmoidGradient",
    "TanhGradient",
    "EluGradient",
    "SeluGradient",
    "LeakyReluGradient",
    "SoftsignGradient",
    "ReluNGradient",
    "SwishGradient",
];

/// Binary ops with broadcast whose output keeps input 0's type.
const ARITHMETIC: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
];

/// Binary ops with broadcast whose output is bool.
const COMPARISON: &[&str] = &["EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Xor"];

pub(super) fn lookup(t: &str) -> Option<Rule> {
    if IDENTICAL.contains(&t) {
        return Some(identical);
    }
    if IDENTICAL_OF_1.contains(&t) {
        return Some(identical_of_1);
    }
    if ARITHMETIC.contains(&t) {
        return Some(arithmetic);
    }
    if COMPARISON.contains(&t) {
        return Some(comparison);
    }
    Some(match t {
        "Cast" => cast,
        "FloatToHalf" => |c: &Ctx<'_>| with_type(c, dtype::FLOAT16),
        "HalfToFloat" => |c: &Ctx<'_>| with_type(c, dtype::FLOAT),
        "IsNaN" => |c: &Ctx<'_>| with_type(c, dtype::BOOL),
        "Where" => where_op,
        "MomentumSGDUpdate" => momentum_sgd_update,
        "MomentumSGD" | "Adagrad" | "Adam" | "SparseAdagrad" => per_input,
        _ => return None,
    })
}

pub(super) fn identical(c: &Ctx<'_>) -> Out {
    Ok(vec![c.input(0)?.clone()])
}

fn identical_of_1(c: &Ctx<'_>) -> Out {
    Ok(vec![c.input(1)?.clone()])
}

fn with_type(c: &Ctx<'_>, t: i32) -> Out {
    Ok(vec![BlobShape::new(c.input(0)?.dims.clone(), t)])
}

/// Output i is input i (in-place optimizer steps).
fn per_input(c: &Ctx<'_>) -> Out {
    (0..c.n_out()).map(|i| Ok(c.input(i)?.clone())).collect()
}

fn momentum_sgd_update(c: &Ctx<'_>) -> Out {
    Ok(vec![
        c.input(0)?.clone(),
        c.input(1)?.clone(),
        c.input(3)?.clone(),
    ])
}

/// Numpy broadcasting of two shapes.
pub(super) fn broadcast(c: &Ctx<'_>, a: &[i64], b: &[i64]) -> Result<Vec<i64>, Stop> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = (i + a.len()).checked_sub(n).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(n).map_or(1, |j| b[j]);
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(c.fail(format!("shapes {a:?} and {b:?} do not broadcast")));
        };
    }
    Ok(out)
}

fn binary_dims(c: &Ctx<'_>) -> Result<(Vec<i64>, i32), Stop> {
    let a = c.input(0)?;
    if c.n_in() < 2 {
        return Ok((a.dims.clone(), a.dtype));
    }
    if c.flag("broadcast")? {
        return Ok((a.dims.clone(), a.dtype));
    }
    let b = c.input(1)?;
    Ok((broadcast(c, &a.dims, &b.dims)?, a.dtype))
}

fn arithmetic(c: &Ctx<'_>) -> Out {
    let (dims, t) = binary_dims(c)?;
    Ok(vec![BlobShape::new(dims, t)])
}

fn comparison(c: &Ctx<'_>) -> Out {
    let (dims, _) = binary_dims(c)?;
    Ok(vec![BlobShape::new(dims, dtype::BOOL)])
}

fn where_op(c: &Ctx<'_>) -> Out {
    let cond = c.input(0)?;
    let x = c.input(1)?;
    let y = c.input(2)?;
    let dims = broadcast(c, &broadcast(c, &cond.dims, &x.dims)?, &y.dims)?;
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

/// The `to` argument of Cast: a `TensorProto.DataType` number or its name.
fn cast_target(c: &Ctx<'_>) -> Result<i32, Stop> {
    let Some(a) = c.args.get("to") else {
        return Ok(dtype::FLOAT);
    };
    if let Some(i) = a.i {
        return i32::try_from(i).map_err(|_| c.fail(format!("bad cast target {i}")));
    }
    let s = c.string("to", "FLOAT")?;
    Ok(match s.to_ascii_uppercase().as_str() {
        "FLOAT" => dtype::FLOAT,
        "INT32" => dtype::INT32,
        "BYTE" => dtype::BYTE,
        "STRING" => dtype::STRING,
        "BOOL" => dtype::BOOL,
        "UINT8" => dtype::UINT8,
        "INT8" => dtype::INT8,
        "UINT16" => dtype::UINT16,
        "INT16" => dtype::INT16,
        "INT64" => dtype::INT64,
        "FLOAT16" => dtype::FLOAT16,
        "DOUBLE" => dtype::DOUBLE,
        other => return Err(c.fail(format!("unknown cast target {other}"))),
    })
}

fn cast(c: &Ctx<'_>) -> Out {
    let t = cast_target(c)?;
    with_type(c, t)
}
