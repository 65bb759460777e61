//! Fill ops: the shape comes from `shape` (or input 0's shape, unless `input_as_shape` makes
//! it runtime data) followed by `extra_shape`; the type from `dtype` or the op's fixed type.

use super::{dtype, BlobShape, Ctx, Out, Rule};

pub(super) fn lookup(t: &str) -> Option<Rule> {
    Some(match t {
        "ConstantFill" | "GivenTensorFill" | "XavierFill" | "MSRAFill" | "GaussianFill"
        | "UniformFill" | "RangeFill" => {
            |c: &Ctx<'_>| filler(c, c.int("dtype", dtype::FLOAT as i64)?)
        }
        "GivenTensorDoubleFill" => |c: &Ctx<'_>| filler(c, dtype::DOUBLE as i64),
        "GivenTensorIntFill" | "UniformIntFill" => |c: &Ctx<'_>| filler(c, dtype::INT32 as i64),
        "GivenTensorInt64Fill" => |c: &Ctx<'_>| filler(c, dtype::INT64 as i64),
        "GivenTensorInt16Fill" => |c: &Ctx<'_>| filler(c, dtype::INT16 as i64),
        "GivenTensorBoolFill" => |c: &Ctx<'_>| filler(c, dtype::BOOL as i64),
        "GivenTensorStringFill" => |c: &Ctx<'_>| filler(c, dtype::STRING as i64),
        "GivenTensorByteStringToUInt8Fill" => |c: &Ctx<'_>| filler(c, dtype::UINT8 as i64),
        _ => return None,
    })
}

fn filler(c: &Ctx<'_>, t: i64) -> Out {
    let t = i32::try_from(t).map_err(|_| c.fail(format!("bad dtype {t}")))?;
    let mut dims = if c.n_in() > 0 {
        if c.flag("input_as_shape")? {
            let mut u = BlobShape::unknown();
            u.dtype = t;
            return Ok(vec![u]);
        }
        c.input(0)?.dims.clone()
    } else {
        c.ints("shape")
    };
    dims.extend(c.ints("extra_shape"));
    if dims.iter().any(|&d| d < 0) {
        return Err(c.fail(format!("negative dim in {dims:?}")));
    }
    Ok(vec![BlobShape::new(dims, t)])
}
