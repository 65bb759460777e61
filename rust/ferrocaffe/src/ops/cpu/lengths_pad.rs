//! `LengthsPad`: DATA holds segments one after the other along its first dimension, LENGTHS
//! their sizes; each segment is copied into a slot of `target_length` rows of the output, the
//! rest of the slot filled with `padding_value`. Output `[len(LENGTHS) * target_length, ...]`.
//! No gradient (Caffe2 registered none).

use crate::dispatch;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers `LengthsPad`.
pub fn register(r: &mut Registry) {
    r.cpu("LengthsPad", create);
}

fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let padding = init.args.number("padding_value", -1.0)?;
    let target = init.args.int("target_length", -1)?;
    if target < 1 {
        bail!(op = init, BadArgument: "target_length argument must be >= 1");
    }
    let target = usize::try_from(target)
        .map_err(|_| err!(op = init, BadArgument: "target_length {target} is too large"))?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        run(ctx, target, padding)
    })))
}

/// A value of the padding in the element type (a float cast the way C++ casts it).
trait Pad: Copy {
    fn from_f64(v: f64) -> Self;
}
impl Pad for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl Pad for f64 {
    fn from_f64(v: f64) -> Self {
        v
    }
}
impl Pad for i32 {
    fn from_f64(v: f64) -> Self {
        v as i32
    }
}
impl Pad for i64 {
    fn from_f64(v: f64) -> Self {
        v as i64
    }
}

fn run(ctx: &mut OpContext<'_>, target: usize, padding: f64) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let data = ins.tensor(0)?;
    let lengths = ins.tensor(1)?;
    if lengths.ndim() != 1 {
        bail!(ShapeMismatch: "LENGTHS must be 1-D, got shape {:?}", lengths.dims());
    }
    if !matches!(lengths.dtype(), DataType::Int32 | DataType::Int64) {
        bail!(DtypeMismatch: "LENGTHS must be int32 or int64, got {}", lengths.dtype().name());
    }
    if data.ndim() < 1 {
        bail!(ShapeMismatch: "DATA should be at least 1-D");
    }
    let lens = lengths.to_i64_vec()?;
    let mut total: i64 = 0;
    for (i, &l) in lens.iter().enumerate() {
        if l < 0 {
            bail!(BadArgument: "Length at index = {i} is negative: {l}");
        }
        if l as u64 > target as u64 {
            bail!(BadArgument: "Length at index = {i} is larger than target length");
        }
        total = total.saturating_add(l);
    }
    let rows = data.dims()[0];
    if total != rows as i64 {
        bail!(
            ShapeMismatch: "the lengths sum to {total}, but DATA has {rows} rows (its first \
             dimension)"
        );
    }
    let mut od = data.dims().to_vec();
    od[0] = lens.len().checked_mul(target).ok_or_else(
        || err!(BadArgument: "output of {} x {target} rows is too large", lens.len()),
    )?;
    let block = data.size_from_dim(1);
    dispatch!(
        data.dtype(),
        [Float => f32, Double => f64, Int32 => i32, Int64 => i64],
        |T| pad::<T>(data, &lens, target, block, &od, padding, outs.tensor(0)?)
    )
}

fn pad<T: Pad + crate::tensor::Element>(
    data: &Tensor,
    lens: &[i64],
    target: usize,
    block: usize,
    dims: &[usize],
    padding: f64,
    out: &mut Tensor,
) -> Result<()> {
    let src = data.as_slice::<T>()?;
    let y = out.try_ensure::<T>(dims)?;
    y.fill(T::from_f64(padding));
    let mut at = 0usize;
    // Lengths are non-negative, at most `target` and sum to DATA's rows (checked above).
    for (slot, &l) in y.chunks_mut((target * block).max(1)).zip(lens) {
        let n = l as usize * block;
        slot[..n].copy_from_slice(&src[at..at + n]);
        at += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn empty_lengths_and_negative_lengths() {
        let ws = Workspace::new();
        ws.feed("d", Tensor::from_vec(&[0, 2], Vec::<f32>::new()).unwrap());
        ws.feed("l", Tensor::from_vec(&[0], Vec::<i32>::new()).unwrap());
        let mut op = OperatorDef::new("LengthsPad", ["d", "l"], ["y"]);
        op.arg.push(Argument::int("target_length", 3));
        ws.run_operator_once(&op).unwrap();
        assert_eq!(ws.fetch("y").unwrap().dims(), &[0, 2]);
        ws.feed("d", Tensor::from_vec(&[1, 2], vec![1.0f32, 2.0]).unwrap());
        ws.feed("l", Tensor::from_vec(&[2], vec![2i32, -1]).unwrap());
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("negative"), "{e}");
    }
}
