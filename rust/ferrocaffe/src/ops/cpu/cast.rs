//! Cast: converts a tensor's elements to the type `to` (a `TensorProto.DataType` number or its
//! name, e.g. `"INT32"`), with C++ conversion rules (floats truncate toward zero, non-zero is
//! true).

use half::f16;

use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers Cast.
pub fn register(r: &mut Registry) {
    r.cpu("Cast", create);
}

/// The `to` argument of Cast (a `TensorProto.DataType` number or its name); the CUDA Cast
/// reads it through this too.
pub(crate) fn parse_to(init: &OpInit<'_>) -> Result<DataType> {
    let arg = init
        .args
        .get("to")
        .ok_or_else(|| err!(op = init, BadArgument: "Cast needs a 'to' argument"))?;
    if let Some(i) = arg.i {
        return DataType::from_proto(i).map_err(|e| err!(op = init, BadArgument: e));
    }
    let s = init.args.string("to", "")?.to_uppercase();
    let num = match s.as_str() {
        "FLOAT" => 1,
        "INT32" => 2,
        "BYTE" => 3,
        "STRING" => 4,
        "BOOL" => 5,
        "UINT8" => 6,
        "INT8" => 7,
        "UINT16" => 8,
        "INT16" => 9,
        "INT64" => 10,
        "FLOAT16" => 12,
        "DOUBLE" => 13,
        _ => bail!(op = init, BadArgument: "Unknown 'to' argument: {s}"),
    };
    DataType::from_proto(num).map_err(|e| err!(op = init, BadArgument: e))
}

/// Reads every element as f64 (exact for all integer types used here except huge int64,
/// handled separately).
fn convert(src: &Tensor, to: DataType, out: &mut Tensor) -> Result<()> {
    let dims = src.dims().to_vec();
    if src.dtype() == DataType::Int64 && to == DataType::Int64 {
        out.copy_from(src);
        return Ok(());
    }
    if to == DataType::String {
        *out = to_strings(src)?;
        return Ok(());
    }
    if src.dtype() == DataType::String {
        bail!(NotImplemented: "Cast from {} to {to} is not supported", src.dtype());
    }
    let n = src.numel();
    let vals: Vec<f64> = if src.dtype() == DataType::Int64 {
        src.as_slice::<i64>()?.iter().map(|&v| v as f64).collect()
    } else {
        (0..n).map(|i| src.get_f64(i)).collect::<Result<_>>()?
    };
    macro_rules! put {
        ($t:ty, $f:expr) => {{
            let o = out.ensure::<$t>(&dims);
            for (d, &v) in o.iter_mut().zip(&vals) {
                *d = $f(v);
            }
        }};
    }
    match to {
        DataType::Float => put!(f32, |v: f64| v as f32),
        DataType::Double => put!(f64, |v: f64| v),
        DataType::Int32 => put!(i32, |v: f64| v as i32),
        DataType::Int64 => {
            if src.dtype() == DataType::Int32 {
                let s = src.as_slice::<i32>()?.to_vec();
                let o = out.ensure::<i64>(&dims);
                for (d, v) in o.iter_mut().zip(s) {
                    *d = v as i64;
                }
            } else {
                put!(i64, |v: f64| v as i64)
            }
        }
        DataType::Int16 => put!(i16, |v: f64| v as i16),
        DataType::Int8 => put!(i8, |v: f64| v as i8),
        DataType::Uint8 => put!(u8, |v: f64| v as u8),
        DataType::Uint16 => put!(u16, |v: f64| v as u16),
        DataType::Bool => put!(bool, |v: f64| v != 0.0),
        DataType::Float16 => put!(f16, f16::from_f64),
        DataType::String => unreachable!("rejected above"),
    }
    Ok(())
}

/// Numbers as C++'s `std::to_string` writes them (Caffe2's cast to string): integers and bools
/// in decimal, floating-point values with six decimals (`%f`).
fn to_strings(src: &Tensor) -> Result<Tensor> {
    let dims = src.dims().to_vec();
    let text: Vec<Vec<u8>> = match src.dtype() {
        DataType::String => src.as_strings()?.to_vec(),
        DataType::Int64 => src
            .as_slice::<i64>()?
            .iter()
            .map(|v| v.to_string().into_bytes())
            .collect(),
        DataType::Float | DataType::Double | DataType::Float16 => (0..src.numel())
            .map(|i| {
                let v = src.get_f64(i)?;
                Ok(if v.is_nan() {
                    (if v.is_sign_negative() { "-nan" } else { "nan" }).to_string()
                } else if v.is_infinite() {
                    (if v < 0.0 { "-inf" } else { "inf" }).to_string()
                } else {
                    format!("{v:.6}")
                }
                .into_bytes())
            })
            .collect::<Result<_>>()?,
        // Every other type is an integer or bool that an f64 holds exactly.
        _ => (0..src.numel())
            .map(|i| Ok((src.get_f64(i)? as i64).to_string().into_bytes()))
            .collect::<Result<_>>()?,
    };
    Tensor::from_strings(&dims, text)
}

fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let to = parse_to(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        if ctx.is_inplace(0, 0) {
            let t = ctx.output(0)?;
            if t.dtype() == to {
                return Ok(());
            }
            let src = t.clone();
            return convert(&src, to, t);
        }
        let (ins, mut outs) = ctx.split();
        let src = ins.tensor(0)?;
        convert(src, to, outs.tensor(0)?)
    })))
}
