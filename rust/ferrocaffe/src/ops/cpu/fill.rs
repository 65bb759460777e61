//! Fill ops: ConstantFill, GivenTensor*Fill, UniformFill, UniformIntFill, GaussianFill,
//! XavierFill, MSRAFill, RangeFill, Float16UniformFill, DiagonalFill.
//!
//! Shape rules (Caffe2's `FillerOp`): without inputs the output has shape `shape` (a scalar when
//! absent); with an input, its shape (or, with `input_as_shape`, its int64 values) followed by
//! `extra_shape`. Random fills draw from the op's generator ([`super::rng`]).

use half::f16;

use super::rng::Rng;
use crate::error::{checked_numel, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers the fill ops.
pub fn register(r: &mut Registry) {
    r.cpu("ConstantFill", create_constant);
    r.cpu("GivenTensorFill", |i| create_given(i, GivenKind::Float));
    r.cpu("GivenTensorDoubleFill", |i| {
        create_given(i, GivenKind::Double)
    });
    r.cpu("GivenTensorIntFill", |i| create_given(i, GivenKind::Int32));
    r.cpu("GivenTensorInt64Fill", |i| {
        create_given(i, GivenKind::Int64)
    });
    r.cpu("GivenTensorInt16Fill", |i| {
        create_given(i, GivenKind::Int16)
    });
    r.cpu("GivenTensorBoolFill", |i| create_given(i, GivenKind::Bool));
    r.cpu("GivenTensorByteStringToUInt8Fill", |i| {
        create_given(i, GivenKind::Bytes)
    });
    r.cpu("GivenTensorStringFill", |i| {
        create_given(i, GivenKind::String)
    });
    r.cpu("UniformFill", |i| create_random(i, RandomKind::Uniform));
    r.cpu("UniformIntFill", |i| {
        create_random(i, RandomKind::UniformInt)
    });
    r.cpu("GaussianFill", |i| create_random(i, RandomKind::Gaussian));
    r.cpu("XavierFill", |i| create_random(i, RandomKind::Xavier));
    r.cpu("MSRAFill", |i| create_random(i, RandomKind::Msra));
    r.cpu("RangeFill", |i| create_random(i, RandomKind::Range));
    r.cpu("Float16UniformFill", |i| {
        let mut op = create_random_fill(i, RandomKind::Uniform)?;
        op.dtype = DataType::Float16;
        Ok(Box::new(op))
    });
    r.cpu("DiagonalFill", create_diagonal);
}

/// The shape part of every filler.
#[derive(Clone, Debug)]
pub struct FillShape {
    shape: Vec<usize>,
    extra: Vec<usize>,
    input_as_shape: bool,
}

impl FillShape {
    /// Reads and checks `shape`, `extra_shape`, `input_as_shape`.
    pub fn new(init: &OpInit<'_>) -> Result<Self> {
        let a = &init.args;
        let s = FillShape {
            shape: a.sizes("shape")?,
            extra: a.sizes("extra_shape")?,
            input_as_shape: a.bool("input_as_shape", false)?,
        };
        if init.num_inputs() > 0 {
            if !s.shape.is_empty() {
                bail!(
                    op = init,
                    BadArgument: "Cannot set the shape argument and pass in an input at the same \
                     time"
                );
            }
        } else {
            if !s.extra.is_empty() {
                bail!(op = init, BadArgument: "Cannot set extra_shape when there is no input");
            }
            if s.input_as_shape {
                bail!(op = init, BadArgument: "An input must be given if input_as_shape is true");
            }
            if a.get("shape").is_some_and(|x| x.i.is_some()) {
                bail!(op = init, BadArgument: "Fill 'shape' argument was a scalar, list expected");
            }
        }
        Ok(s)
    }

    /// The output shape for this run (an [`Error::OutOfMemory`](crate::error::Error) when no
    /// tensor could hold it).
    pub fn resolve(&self, ctx: &OpContext<'_>) -> Result<Vec<usize>> {
        let dims = if ctx.num_inputs() == 0 {
            self.shape.clone()
        } else {
            self.read_input(ctx)?
        };
        // The shape is the user's; one that no tensor could hold is refused here rather than
        // where the tensor is allocated.
        checked_numel(&dims, 8, "the output")?;
        Ok(dims)
    }

    /// The shape given by input 0 (its values, or its dims), then `extra_shape`.
    fn read_input(&self, ctx: &OpContext<'_>) -> Result<Vec<usize>> {
        let input = ctx.input(0)?;
        let mut dims = if self.input_as_shape {
            if input.ndim() != 1 {
                bail!(
                    op = ctx,
                    ShapeMismatch: "When input_as_shape is true, the input must be a 1D tensor of \
                     data type int64_t"
                );
            }
            if input.numel() == 0 {
                bail!(op = ctx, ShapeMismatch: "input.numel() > 0: the shape input is empty");
            }
            let v = input.to_i64_vec().map_err(|_| {
                err!(
                    op = ctx,
                    DtypeMismatch: "When input_as_shape is true, the input must be a 1D tensor of \
                     data type int64_t"
                )
            })?;
            v.into_iter()
                .map(|d| {
                    usize::try_from(d).map_err(|_| {
                        err!(
                            op = ctx,
                            BadArgument: "negative dimension {d} in the shape input"
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            input.dims().to_vec()
        };
        dims.extend_from_slice(&self.extra);
        Ok(dims)
    }
}

#[derive(Clone, Debug)]
enum Constant {
    F32(f32),
    F64(f64),
    I32(i32),
    I64(i64),
    I16(i16),
    I8(i8),
    U8(u8),
    U16(u16),
    Bool(bool),
    Str(Vec<u8>),
}

struct ConstantFill {
    shape: FillShape,
    value: Constant,
}

fn fill_constant(t: &mut Tensor, dims: &[usize], v: &Constant) -> Result<()> {
    match v {
        Constant::F32(x) => t.try_ensure::<f32>(dims)?.fill(*x),
        Constant::F64(x) => t.try_ensure::<f64>(dims)?.fill(*x),
        Constant::I32(x) => t.try_ensure::<i32>(dims)?.fill(*x),
        Constant::I64(x) => t.try_ensure::<i64>(dims)?.fill(*x),
        Constant::I16(x) => t.try_ensure::<i16>(dims)?.fill(*x),
        Constant::I8(x) => t.try_ensure::<i8>(dims)?.fill(*x),
        Constant::U8(x) => t.try_ensure::<u8>(dims)?.fill(*x),
        Constant::U16(x) => t.try_ensure::<u16>(dims)?.fill(*x),
        Constant::Bool(x) => t.try_ensure::<bool>(dims)?.fill(*x),
        Constant::Str(s) => {
            t.try_reset(DataType::String, dims)?;
            if let Ok(v) = t.as_strings_mut() {
                for e in v {
                    e.clone_from(s);
                }
            }
        }
    }
    Ok(())
}

impl Operator for ConstantFill {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = self.shape.resolve(ctx)?;
        fill_constant(ctx.output(0)?, &dims, &self.value)?;
        Ok(())
    }
}

fn create_constant(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let a = &init.args;
    let shape = FillShape::new(init)?;
    let dtype = if !a.has("dtype") && a.has("value") {
        let v = a.get("value");
        if v.is_some_and(|x| x.f.is_some()) {
            1
        } else if v.is_some_and(|x| x.i.is_some()) {
            10
        } else {
            bail!(op = init, BadArgument: "Argument 'value' is of unexpected type");
        }
    } else {
        a.int("dtype", 1)?
    };
    let int = |lo: i64, hi: i64| -> Result<i64> {
        let v = a.int("value", 0)?;
        if v < lo || v > hi {
            bail!(
                op = init,
                BadArgument: "Value{v} of argument value cannot be represented correctly in a \
                 target type"
            );
        }
        Ok(v)
    };
    let value = match dtype {
        1 => Constant::F32(a.float("value", 0.0)?),
        13 => Constant::F64(a.float("value", 0.0)? as f64),
        5 => Constant::Bool(a.int("value", 0)? != 0),
        7 => Constant::I8(int(i8::MIN as i64, i8::MAX as i64)? as i8),
        9 => Constant::I16(int(i16::MIN as i64, i16::MAX as i64)? as i16),
        2 => Constant::I32(int(i32::MIN as i64, i32::MAX as i64)? as i32),
        10 => Constant::I64(a.int("value", 0)?),
        6 => Constant::U8(int(0, u8::MAX as i64)? as u8),
        8 => Constant::U16(int(0, u16::MAX as i64)? as u16),
        4 => Constant::Str(a.get("value").and_then(|x| x.s.clone()).unwrap_or_default()),
        other => {
            bail!(op = init, BadArgument: "Unexpected 'dtype' argument value: {other}");
        }
    };
    Ok(Box::new(ConstantFill { shape, value }))
}

#[derive(Clone, Copy)]
enum GivenKind {
    Float,
    Double,
    Int32,
    Int64,
    Int16,
    Bool,
    Bytes,
    String,
}

struct GivenFill {
    shape: FillShape,
    values: Tensor,
}

impl Operator for GivenFill {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = self.shape.resolve(ctx)?;
        let n: usize = dims.iter().product();
        if n != self.values.numel() {
            bail!(
                op = ctx,
                ShapeMismatch: "output size {n} (shape {dims:?}) does not match the {} given \
                 values",
                self.values.numel()
            );
        }
        let out = ctx.output(0)?;
        out.copy_from(&self.values);
        out.reshape(&dims)?;
        Ok(())
    }
}

fn create_given(init: &OpInit<'_>, kind: GivenKind) -> Result<Box<dyn Operator>> {
    let shape = FillShape::new(init)?;
    let a = &init.args;
    let mut kind = kind;
    if matches!(kind, GivenKind::Float) && a.has("dtype") {
        kind = match a.int("dtype", 1)? {
            1 => GivenKind::Float,
            13 => GivenKind::Double,
            5 => GivenKind::Bool,
            9 => GivenKind::Int16,
            2 => GivenKind::Int32,
            10 => GivenKind::Int64,
            4 => GivenKind::String,
            0 => bail!(op = init, BadArgument: "Cannot have undefined 'dtype' argument"),
            other => bail!(op = init, BadArgument: "Unexpected 'dtype' argument value: {other}"),
        };
    }
    let floats = a.floats("values");
    let ints = a.ints("values");
    let n_f = floats.len();
    let values = match kind {
        GivenKind::Float => Tensor::from_vec(&[n_f], floats)?,
        GivenKind::Double => Tensor::from_vec(&[n_f], floats.iter().map(|&v| v as f64).collect())?,
        GivenKind::Int32 => {
            Tensor::from_vec(&[ints.len()], ints.iter().map(|&v| v as i32).collect())?
        }
        GivenKind::Int64 => Tensor::from_vec(&[ints.len()], ints)?,
        GivenKind::Int16 => {
            Tensor::from_vec(&[ints.len()], ints.iter().map(|&v| v as i16).collect())?
        }
        GivenKind::Bool => Tensor::from_vec(&[ints.len()], ints.iter().map(|&v| v != 0).collect())?,
        GivenKind::String => {
            let s = a.byte_strings("values");
            Tensor::from_strings(&[s.len()], s)?
        }
        GivenKind::Bytes => {
            let s = a.byte_strings("values");
            let bytes: Vec<u8> = s.into_iter().flatten().collect();
            Tensor::from_vec(&[bytes.len()], bytes)?
        }
    };
    Ok(Box::new(GivenFill { shape, values }))
}

#[derive(Clone, Copy, PartialEq)]
enum RandomKind {
    Uniform,
    UniformInt,
    Gaussian,
    Xavier,
    Msra,
    Range,
}

struct RandomFill {
    shape: FillShape,
    kind: RandomKind,
    rng: Rng,
    a: f64,
    b: f64,
    dtype: DataType,
}

impl Operator for RandomFill {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (mut lo, mut hi) = (self.a, self.b);
        let n_in = ctx.num_inputs();
        if n_in == 3 && matches!(self.kind, RandomKind::Uniform | RandomKind::UniformInt) {
            let read = |i: usize| -> Result<f64> {
                let t = ctx.input(i)?;
                if t.numel() != 1 {
                    bail!(op = ctx, ShapeMismatch: "{} must be a single value", ctx.input_name(i));
                }
                t.get_f64(0)
            };
            lo = read(1)?;
            hi = read(2)?;
        }
        let mut dims = self.shape.resolve(ctx)?;
        if n_in == 3 && lo > hi && matches!(self.kind, RandomKind::Uniform | RandomKind::UniformInt)
        {
            // Bounds given as blobs the wrong way round: an empty output (no first-axis rows).
            if let Some(d) = dims.first_mut() {
                *d = 0;
            }
            (lo, hi) = (hi, lo);
        }
        let kind = self.kind;
        let dtype = self.dtype;
        let rng = &mut self.rng;
        let out = ctx.output(0)?;
        if kind != RandomKind::Range && lo > hi && kind != RandomKind::Gaussian {
            bail!(BadArgument: "max {hi} must be at least min {lo}");
        }
        match kind {
            RandomKind::UniformInt => {
                for v in out.try_ensure::<i32>(&dims)? {
                    *v = rng.uniform_int(lo as i64, hi as i64) as i32;
                }
            }
            RandomKind::Range => match dtype {
                DataType::Double => {
                    for (i, v) in out.try_ensure::<f64>(&dims)?.iter_mut().enumerate() {
                        *v = i as f64;
                    }
                }
                DataType::Int32 => {
                    for (i, v) in out.try_ensure::<i32>(&dims)?.iter_mut().enumerate() {
                        *v = i as i32;
                    }
                }
                DataType::Int64 => {
                    for (i, v) in out.try_ensure::<i64>(&dims)?.iter_mut().enumerate() {
                        *v = i as i64;
                    }
                }
                _ => {
                    for (i, v) in out.try_ensure::<f32>(&dims)?.iter_mut().enumerate() {
                        *v = i as f32;
                    }
                }
            },
            RandomKind::Uniform => {
                fill_f(out, &dims, dtype, |_| rng.uniform(lo as f32, hi as f32))?
            }
            RandomKind::Gaussian => {
                fill_f(out, &dims, dtype, |_| rng.gaussian(lo as f32, hi as f32))?
            }
            RandomKind::Xavier => {
                let n: usize = dims.iter().product();
                let fan_in = if dims.is_empty() || dims[0] == 0 {
                    1
                } else {
                    n / dims[0]
                };
                let scale = (3.0f32 / fan_in.max(1) as f32).sqrt();
                fill_f(out, &dims, dtype, |_| rng.uniform(-scale, scale))?
            }
            RandomKind::Msra => {
                let n: usize = dims.iter().product();
                let fan_out = if dims.len() < 2 || dims[1] == 0 {
                    1
                } else {
                    n / dims[1]
                };
                let std = (2.0f32 / fan_out.max(1) as f32).sqrt();
                fill_f(out, &dims, dtype, |_| rng.gaussian(0.0, std))?
            }
        }
        Ok(())
    }
}

fn fill_f(
    out: &mut Tensor,
    dims: &[usize],
    dtype: DataType,
    mut f: impl FnMut(usize) -> f32,
) -> Result<()> {
    match dtype {
        DataType::Double => {
            for (i, v) in out.try_ensure::<f64>(dims)?.iter_mut().enumerate() {
                *v = f(i) as f64;
            }
        }
        DataType::Float16 => {
            for (i, v) in out.try_ensure::<f16>(dims)?.iter_mut().enumerate() {
                *v = f16::from_f32(f(i));
            }
        }
        _ => {
            for (i, v) in out.try_ensure::<f32>(dims)?.iter_mut().enumerate() {
                *v = f(i);
            }
        }
    }
    Ok(())
}

fn create_random(init: &OpInit<'_>, kind: RandomKind) -> Result<Box<dyn Operator>> {
    Ok(Box::new(create_random_fill(init, kind)?))
}

fn create_random_fill(init: &OpInit<'_>, kind: RandomKind) -> Result<RandomFill> {
    let shape = FillShape::new(init)?;
    let a = &init.args;
    let (lo, hi) = match kind {
        RandomKind::Uniform => {
            if init.num_inputs() == 3 && (a.has("min") || a.has("max")) {
                bail!(
                    op = init,
                    BadArgument: "Cannot set both min/max arg and min/max input blobs"
                );
            }
            (a.float("min", 0.0)? as f64, a.float("max", 1.0)? as f64)
        }
        RandomKind::UniformInt => {
            if init.num_inputs() == 3 && (a.has("min") || a.has("max")) {
                bail!(
                    op = init,
                    BadArgument: "Cannot set both min/max arg and min/max input blobs"
                );
            }
            (a.int("min", 0)? as f64, a.int("max", 1)? as f64)
        }
        RandomKind::Gaussian => (a.float("mean", 0.0)? as f64, a.float("std", 1.0)? as f64),
        _ => (0.0, 0.0),
    };
    let dtype = DataType::from_proto(a.int("dtype", 1)?).map_err(|e| {
        err!(
            op = init,
            BadArgument: e
        )
    })?;
    Ok(RandomFill {
        shape,
        kind,
        rng: Rng::from_option(init.random_seed()),
        a: lo,
        b: hi,
        dtype,
    })
}

/// `DiagonalFill`: zeros of `dtype` with `value` on the diagonal: every
/// `1 + d1*..*dk + d2*..*dk + .. + dk`-th element (`cols + 1` in 2-d, where a tall matrix wraps
/// around as in Caffe2); more than 2 dims must all be equal.
fn create_diagonal(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::new(init)?;
    let value = init.args.number("value", 0.0)?;
    let dtype = DataType::from_proto(init.args.int("dtype", 1)?)
        .map_err(|e| err!(op = init, BadArgument: e))?;
    Ok(Box::new(crate::ops::operator::FnOp(
        move |ctx: &mut OpContext<'_>| {
            let dims = shape.resolve(ctx)?;
            if dims.len() < 2 {
                bail!(ShapeMismatch: "Input shape must be >= 2D, got {dims:?}");
            }
            let step = if dims.len() == 2 {
                dims[1].saturating_add(1)
            } else {
                if dims.iter().any(|&d| d != dims[0]) {
                    bail!(ShapeMismatch: "All dimensions of input must be of equal length");
                }
                // 1 + d + d^2 + .. + d^(k-1).
                let mut step = 1usize;
                let mut p = 1usize;
                for &d in &dims[..dims.len() - 1] {
                    p = p.saturating_mul(d);
                    step = step.saturating_add(p);
                }
                step
            };
            let out = ctx.output(0)?;
            macro_rules! diag {
                ($t:ty, $v:expr) => {{
                    let o = out.try_ensure::<$t>(&dims)?;
                    o.fill(<$t>::default());
                    for v in o.iter_mut().step_by(step) {
                        *v = $v;
                    }
                }};
            }
            match dtype {
                DataType::Float => diag!(f32, value as f32),
                DataType::Double => diag!(f64, value),
                DataType::Int32 => diag!(i32, value as i32),
                DataType::Int64 => diag!(i64, value as i64),
                DataType::Int16 => diag!(i16, value as i16),
                DataType::Int8 => diag!(i8, value as i8),
                DataType::Uint8 => diag!(u8, value as u8),
                DataType::Uint16 => diag!(u16, value as u16),
                DataType::Bool => diag!(bool, value != 0.0),
                other => bail!(DtypeMismatch: "DiagonalFill does not fill {other} tensors"),
            }
            Ok(())
        },
    )))
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::workspace::Workspace;

    #[test]
    fn a_shape_no_tensor_can_hold_is_refused_without_allocating() {
        let ws = Workspace::new();
        let mut op = OperatorDef::new("ConstantFill", Vec::<String>::new(), ["y"]);
        let shape = |v: Vec<i64>| Argument {
            name: Some("shape".into()),
            ints: v,
            ..Default::default()
        };
        op.arg.push(shape(vec![1 << 40, 1 << 40]));
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        let want = "the output of shape [1099511627776, 1099511627776] is too large to allocate";
        assert!(e.contains(want), "{e}");
        op.arg[0] = shape(vec![2, 3]);
        ws.run_operator_once(&op).unwrap();
        assert_eq!(ws.fetch("y").unwrap().dims(), &[2, 3]);
    }
}
