//! Utility ops around lengths and ranges: `NanCheck`, `LengthsGather`, `LengthsToRanges`,
//! `LengthsRangeFill`, `Range` and `SparseLengthsPositionalWeightedSum`.

use crate::dispatch;
use crate::error::{try_vec, Result};
use crate::ops::operator::{FnOp, OpContext};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("NanCheck", |_| Ok(Box::new(FnOp(nan_check))));
    r.cpu("LengthsGather", |_| Ok(Box::new(FnOp(lengths_gather))));
    r.cpu("LengthsToRanges", |_| Ok(Box::new(FnOp(lengths_to_ranges))));
    r.cpu("LengthsRangeFill", |_| {
        Ok(Box::new(FnOp(lengths_range_fill)))
    });
    r.cpu("Range", |_| Ok(Box::new(FnOp(range))));
    r.cpu("SparseLengthsPositionalWeightedSum", |_| {
        Ok(Box::new(FnOp(positional_weighted_sum)))
    });
}

/// A 1-D int32/int64 LENGTHS input as non-negative counts.
fn lengths(t: &Tensor) -> Result<Vec<usize>> {
    if !matches!(t.dtype(), DataType::Int32 | DataType::Int64) {
        bail!(DtypeMismatch: "LENGTHS must be int32 or int64, got {}", t.dtype().name());
    }
    t.to_i64_vec()?
        .into_iter()
        .map(|l| usize::try_from(l).map_err(|_| err!(BadArgument: "negative length {l}")))
        .collect()
}

/// `NanCheck`: Y = X, failing when any input holds a NaN or an infinity.
fn nan_check(ctx: &mut OpContext<'_>) -> Result<()> {
    for i in 0..ctx.num_inputs() {
        let t = ctx.input(i)?;
        let bad = match t.dtype() {
            DataType::Float => t.as_slice::<f32>()?.iter().any(|v| !v.is_finite()),
            DataType::Double => t.as_slice::<f64>()?.iter().any(|v| !v.is_finite()),
            _ => false,
        };
        if bad {
            bail!(
                BadArgument: "Tensor contained NaN or inf: input {i} ('{}')",
                ctx.input_name(i)
            );
        }
    }
    if ctx.is_inplace(0, 0) {
        return Ok(());
    }
    let x = ctx.input(0)?.clone();
    ctx.output(0)?.copy_from(&x);
    Ok(())
}

/// `LengthsGather`: (ITEMS, LENGTHS, INDICES) -> the segments of ITEMS picked by INDICES,
/// concatenated.
fn lengths_gather(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let items = ins.tensor(0)?;
    let lens = lengths(ins.tensor(1)?)?;
    let idx_t = ins.tensor(2)?;
    let n_rows = *items
        .dims()
        .first()
        .ok_or_else(|| err!(ShapeMismatch: "ITEMS must be at least 1-D"))?;
    let block = items.numel().checked_div(n_rows).unwrap_or(0);
    let mut offsets = Vec::with_capacity(lens.len());
    let mut at = 0usize;
    for &l in &lens {
        offsets.push(at);
        at = at
            .checked_add(l)
            .ok_or_else(|| err!(BadArgument: "the sum of LENGTHS overflows"))?;
    }
    if at != n_rows {
        bail!(ShapeMismatch: "the sum of LENGTHS ({at}) must equal the rows of ITEMS ({n_rows})");
    }
    let picks: Vec<usize> = idx_t
        .to_i64_vec()?
        .into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .filter(|&u| u < lens.len())
                .ok_or_else(
                    || err!(BadArgument: "index {i} out of range of {} lengths", lens.len()),
                )
        })
        .collect::<Result<_>>()?;
    let total: usize = picks.iter().map(|&p| lens[p]).sum();
    let mut od = items.dims().to_vec();
    od[0] = total;
    dispatch!(items.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64,
        Bool => bool, Uint8 => u8, Float16 => half::f16], |T| {
        let src = items.as_slice::<T>()?;
        let y = outs.tensor(0)?.try_ensure::<T>(&od)?;
        let mut k = 0;
        for &p in &picks {
            let n = lens[p] * block;
            let s = offsets[p] * block;
            y[k..k + n].copy_from_slice(&src[s..s + n]);
            k += n;
        }
        Ok(())
    })
}

/// `LengthsToRanges`: LENGTHS -> int32 `[len, 2]` of (offset, length).
fn lengths_to_ranges(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let lens = lengths(ins.tensor(0)?)?;
    let y = outs.tensor(0)?.try_ensure::<i32>(&[lens.len(), 2])?;
    let mut at = 0usize;
    for (k, &l) in lens.iter().enumerate() {
        let off =
            i32::try_from(at).map_err(|_| err!(BadArgument: "offset {at} overflows int32"))?;
        y[2 * k] = off;
        y[2 * k + 1] = i32::try_from(l).map_err(|_| err!(BadArgument: "length {l} overflows"))?;
        at += l;
    }
    Ok(())
}

/// `LengthsRangeFill`: LENGTHS -> int32 `0..l` for each length, concatenated.
fn lengths_range_fill(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let lens = lengths(ins.tensor(0)?)?;
    let total = lens
        .iter()
        .try_fold(0usize, |a, &l| a.checked_add(l))
        .ok_or_else(|| err!(BadArgument: "the sum of LENGTHS overflows"))?;
    let y = outs.tensor(0)?.try_ensure::<i32>(&[total])?;
    let mut k = 0;
    for &l in &lens {
        for (j, o) in y[k..k + l].iter_mut().enumerate() {
            *o = j as i32;
        }
        k += l;
    }
    Ok(())
}

/// `Range`: ([start,] stop[, step]) scalars of one type -> `start, start + step, ...` below
/// `stop` (above it for a negative step).
fn range(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let n = ins.len();
    if !(1..=3).contains(&n) {
        bail!(Schema: "Range takes 1 to 3 inputs, got {n}");
    }
    let dtype = ins.tensor(0)?.dtype();
    for i in 0..n {
        let t = ins.tensor(i)?;
        if t.numel() != 1 {
            bail!(ShapeMismatch: "Input {i} of Range must be a scalar, got shape {:?}", t.dims());
        }
        if t.dtype() != dtype {
            bail!(
                DtypeMismatch: "All inputs of Range must have the same type: input {i} is {}, \
                 input 0 is {}",
                t.dtype().name(),
                dtype.name()
            );
        }
    }
    macro_rules! body {
        ($t:ty, $len:expr) => {{
            let v = |i: usize| -> Result<$t> { Ok(ins.tensor(i)?.as_slice::<$t>()?[0]) };
            let (start, stop, step) = match n {
                1 => (<$t>::default(), v(0)?, 1 as $t),
                2 => (v(0)?, v(1)?, 1 as $t),
                _ => (v(0)?, v(1)?, v(2)?),
            };
            if step == <$t>::default() {
                bail!(BadArgument: "Step size cannot be 0.");
            }
            let len: usize = $len(start, stop, step)?;
            let y = outs.tensor(0)?.try_ensure::<$t>(&[len])?;
            let mut cur = start;
            for (k, o) in y.iter_mut().enumerate() {
                *o = cur;
                // The count keeps every value within [start, stop]: no step past the last.
                if k + 1 < len {
                    cur += step;
                }
            }
            Ok(())
        }};
    }
    fn int_len(start: i64, stop: i64, step: i64) -> Result<usize> {
        let span = i128::from(stop) - i128::from(start);
        let step = i128::from(step);
        if (span > 0) != (step > 0) || span == 0 {
            return Ok(0);
        }
        let n = (span.abs() + step.abs() - 1) / step.abs();
        usize::try_from(n).map_err(|_| err!(BadArgument: "Range of {n} values is too large"))
    }
    fn float_len(start: f64, stop: f64, step: f64) -> Result<usize> {
        let n = ((stop - start) / step).ceil();
        if !n.is_finite() {
            bail!(BadArgument: "Range with start {start}, stop {stop}, step {step} is unbounded");
        }
        Ok(if n > 0.0 { n as usize } else { 0 })
    }
    match dtype {
        DataType::Int32 => body!(i32, |a: i32, b: i32, c: i32| int_len(
            i64::from(a),
            i64::from(b),
            i64::from(c)
        )),
        DataType::Int64 => body!(i64, int_len),
        DataType::Float => body!(f32, |a: f32, b: f32, c: f32| float_len(
            f64::from(a),
            f64::from(b),
            f64::from(c)
        )),
        DataType::Double => body!(f64, float_len),
        other => bail!(
            DtypeMismatch: "Range supports int32, int64, float and double, got {}",
            other.name()
        ),
    }
}

/// `SparseLengthsPositionalWeightedSum`: (DATA, WEIGHTS, INDICES, LENGTHS) -> per segment,
/// the sum of `WEIGHTS[j] * DATA[INDICES[k]]` where `j` is the entry's position in its segment.
fn positional_weighted_sum(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let data = ins.tensor(0)?;
    if data.dtype() != DataType::Float {
        bail!(DtypeMismatch: "DATA must be float, got {}", data.dtype().name());
    }
    let n_rows = *data
        .dims()
        .first()
        .ok_or_else(|| err!(ShapeMismatch: "DATA must be at least 1-D"))?;
    let block = data.numel().checked_div(n_rows).unwrap_or(0);
    let w = ins.tensor(1)?.as_slice::<f32>()?;
    let idx: Vec<usize> = ins
        .tensor(2)?
        .to_i64_vec()?
        .into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .filter(|&u| u < n_rows)
                .ok_or_else(|| err!(BadArgument: "Index {i} is out of bounds of {n_rows} rows"))
        })
        .collect::<Result<_>>()?;
    let lens = lengths(ins.tensor(3)?)?;
    let xs = data.as_slice::<f32>()?;
    let total = lens.len().saturating_mul(block);
    let mut y = try_vec(total, 0f32, "the output")?;
    let mut k = 0usize;
    for (s, &l) in lens.iter().enumerate() {
        if l > w.len() {
            bail!(BadArgument: "length {l} exceeds the {} positional WEIGHTS", w.len());
        }
        for &wv in w.iter().take(l) {
            let r = *idx.get(k).ok_or_else(
                || err!(ShapeMismatch: "the sum of LENGTHS exceeds the {} INDICES", idx.len()),
            )?;
            for (o, v) in y[s * block..(s + 1) * block]
                .iter_mut()
                .zip(&xs[r * block..(r + 1) * block])
            {
                *o += wv * v;
            }
            k += 1;
        }
    }
    if k != idx.len() {
        bail!(ShapeMismatch: "the sum of LENGTHS ({k}) must equal the {} INDICES", idx.len());
    }
    let mut od = data.dims().to_vec();
    od[0] = lens.len();
    let out = outs.tensor(0)?;
    out.try_reset(DataType::Float, &od)?;
    out.as_mut_slice::<f32>()?.copy_from_slice(&y);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn ranges_and_lengths() {
        let ws = Workspace::new();
        ws.feed("a", Tensor::scalar(2i64));
        ws.feed("b", Tensor::scalar(9i64));
        ws.feed("c", Tensor::scalar(3i64));
        ws.run_operator_once(&OperatorDef::new("Range", ["a", "b", "c"], ["y"]))
            .unwrap();
        assert_eq!(
            ws.fetch("y").unwrap().as_slice::<i64>().unwrap(),
            &[2, 5, 8]
        );
        ws.feed("z", Tensor::scalar(0i64));
        let e = ws
            .run_operator_once(&OperatorDef::new("Range", ["a", "b", "z"], ["y"]))
            .unwrap_err();
        assert!(e.to_string().contains("Step size cannot be 0"), "{e}");
        ws.feed("l", Tensor::from_vec(&[3], vec![2i32, 0, 1]).unwrap());
        ws.run_operator_once(&OperatorDef::new("LengthsToRanges", ["l"], ["r"]))
            .unwrap();
        assert_eq!(
            ws.fetch("r").unwrap().as_slice::<i32>().unwrap(),
            &[0, 2, 2, 0, 2, 1]
        );
        ws.run_operator_once(&OperatorDef::new("LengthsRangeFill", ["l"], ["f"]))
            .unwrap();
        assert_eq!(
            ws.fetch("f").unwrap().as_slice::<i32>().unwrap(),
            &[0, 1, 0]
        );
    }
}
