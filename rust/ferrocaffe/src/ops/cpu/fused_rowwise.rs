//! 8-bit row-wise quantized embedding tables:
//!
//! * fused storage (`FloatToFused8BitRowwiseQuantized`, `Fused8BitRowwiseQuantizedToFloat`,
//!   `GatherFused8BitRowwise`): each uint8 row holds its quantized values followed by its
//!   scale and bias as two little-endian float32 (8 bytes). The `HalfFloat` variants take or
//!   give float16 values, the `HalfScaleBias` ones store scale and bias as two float16
//!   (4 bytes): `{Float,HalfFloat}ToFused8BitRowwiseQuantized[HalfScaleBias]` and
//!   `Fused8BitRowwiseQuantized[HalfScaleBias]To{Float,HalfFloat}`;
//! * separate storage (`SparseLengths{Sum,Mean}8BitsRowwise`,
//!   `SparseLengthsWeighted{Sum,Mean}8BitsRowwise`): a uint8 table and a `[rows, 2]` float
//!   SCALE_BIAS input.
//!
//! A value is `q * scale + bias`; quantizing a row uses `scale = (max - min) / 255` and
//! `bias = min` (with float16 scale and bias, `bias` is `min` rounded to float16 and the
//! quantization divides by the float16 scale, as fbgemm's `SBHalf` routines do).

use std::borrow::Cow;

use crate::error::{try_vec, Result};
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::{Factory, Registry};
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};
use half::f16;

/// Registers the family.
pub fn register(r: &mut Registry) {
    // (type, half-precision values, half-precision scale and bias)
    let conversions: [(&str, Factory); 8] = [
        (
            "FloatToFused8BitRowwiseQuantized",
            create_quantize::<false, false>,
        ),
        (
            "HalfFloatToFused8BitRowwiseQuantized",
            create_quantize::<true, false>,
        ),
        (
            "FloatToFused8BitRowwiseQuantizedHalfScaleBias",
            create_quantize::<false, true>,
        ),
        (
            "HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias",
            create_quantize::<true, true>,
        ),
        (
            "Fused8BitRowwiseQuantizedToFloat",
            create_dequantize::<false, false>,
        ),
        (
            "Fused8BitRowwiseQuantizedToHalfFloat",
            create_dequantize::<true, false>,
        ),
        (
            "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat",
            create_dequantize::<false, true>,
        ),
        (
            "Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat",
            create_dequantize::<true, true>,
        ),
    ];
    for (name, f) in conversions {
        r.cpu(name, f);
    }
    r.cpu("GatherFused8BitRowwise", |_| Ok(Box::new(FnOp(gather))));
    let ops: [(&str, Factory); 4] = [
        ("SparseLengthsSum8BitsRowwise", |_| {
            Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                lengths_8bit(c, false, false)
            })))
        }),
        ("SparseLengthsMean8BitsRowwise", |_| {
            Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                lengths_8bit(c, false, true)
            })))
        }),
        ("SparseLengthsWeightedSum8BitsRowwise", |_| {
            Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                lengths_8bit(c, true, false)
            })))
        }),
        ("SparseLengthsWeightedMean8BitsRowwise", |_| {
            Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                lengths_8bit(c, true, true)
            })))
        }),
    ];
    for (name, f) in ops {
        r.cpu(name, f);
    }
}

/// Bytes of a fused row's scale and bias.
const SCALE_BIAS_BYTES: usize = 8;

/// `(rows, cols)` of a tensor seen as a matrix over its last dimension.
fn matrix(t: &Tensor, what: &str) -> Result<(usize, usize)> {
    let cols = *t
        .dims()
        .last()
        .ok_or_else(|| err!(ShapeMismatch: "{what} must be at least 1-D"))?;
    Ok((t.numel().checked_div(cols).unwrap_or(0), cols))
}

fn create_quantize<const HALF: bool, const HALF_SB: bool>(
    _: &OpInit<'_>,
) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
        quantize(c, HALF, HALF_SB)
    })))
}

fn create_dequantize<const HALF: bool, const HALF_SB: bool>(
    _: &OpInit<'_>,
) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
        dequantize(c, HALF, HALF_SB)
    })))
}

/// Bytes of a fused row's scale and bias: two float32, or two float16.
fn sb_bytes(half_sb: bool) -> usize {
    if half_sb {
        4
    } else {
        SCALE_BIAS_BYTES
    }
}

/// The values of a float (or, with `half`, float16) tensor as float32.
fn values_f32(x: &Tensor, half: bool) -> Result<Cow<'_, [f32]>> {
    let want = if half {
        DataType::Float16
    } else {
        DataType::Float
    };
    if x.dtype() != want {
        bail!(
            DtypeMismatch: "input must be {}, got {}",
            want.name(),
            x.dtype().name()
        );
    }
    if half {
        let h = x.as_slice::<f16>()?;
        let mut v = try_vec(h.len(), 0f32, "the float16 values as float")?;
        for (o, i) in v.iter_mut().zip(h) {
            *o = i.to_f32();
        }
        Ok(Cow::Owned(v))
    } else {
        Ok(Cow::Borrowed(x.as_slice::<f32>()?))
    }
}

/// `(scale, bias, 1 / scale)` of a row with float16 scale and bias: the bias is the minimum
/// rounded to float16 and the scale the float16 step (1 when the row is constant).
fn half_scale_bias(lo: f32, hi: f32) -> (f16, f16, f32) {
    let bias = f16::from_f32(lo);
    let range = hi - bias.to_f32();
    let mut scale = if range == 0.0 { 1.0 } else { range / 255.0 };
    scale = f16::from_f32(scale).to_f32();
    if scale == 0.0 {
        scale = 1.0;
    }
    let mut inv = 1.0 / scale;
    if inv.is_infinite() {
        scale = 1.0;
        inv = 1.0;
    }
    (f16::from_f32(scale), bias, inv)
}

/// `*ToFused8BitRowwiseQuantized*`: each row of the input (float or float16) becomes its
/// quantized bytes followed by its scale and bias (float32, or float16 with `half_sb`).
fn quantize(ctx: &mut OpContext<'_>, half: bool, half_sb: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let xs = values_f32(x, half)?;
    let (rows, cols) = matrix(x, "input")?;
    let mut od = x.dims().to_vec();
    let width = cols
        .checked_add(sb_bytes(half_sb))
        .ok_or_else(|| err!(BadArgument: "rows of {cols} values are too long"))?;
    if let Some(last) = od.last_mut() {
        *last = width;
    }
    let y = outs.tensor(0)?.try_ensure::<u8>(&od)?;
    for r in 0..rows {
        let row = &xs[r * cols..(r + 1) * cols];
        let out = &mut y[r * width..(r + 1) * width];
        let lo = row.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (lo, hi) = if cols == 0 { (0.0, 0.0) } else { (lo, hi) };
        let (q, sb) = out.split_at_mut(cols);
        let (bias, inv) = if half_sb {
            let (scale, bias, inv) = half_scale_bias(lo, hi);
            sb[..2].copy_from_slice(&scale.to_le_bytes());
            sb[2..].copy_from_slice(&bias.to_le_bytes());
            (bias.to_f32(), inv)
        } else {
            let range = hi - lo;
            sb[..4].copy_from_slice(&(range / 255.0).to_le_bytes());
            sb[4..].copy_from_slice(&lo.to_le_bytes());
            (lo, 255.0 / (range + 1e-8))
        };
        for (q, &v) in q.iter_mut().zip(row) {
            *q = ((v - bias) * inv).round_ties_even().clamp(0.0, 255.0) as u8;
        }
    }
    Ok(())
}

/// Scale and bias stored at the end of a fused row (two float32).
fn scale_bias(row: &[u8]) -> (f32, f32) {
    let n = row.len() - SCALE_BIAS_BYTES;
    let f = |at: usize| f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
    (f(n), f(n + 4))
}

/// Scale and bias stored at the end of a fused row as two float16.
fn half_scale_bias_of(row: &[u8]) -> (f32, f32) {
    let n = row.len() - 4;
    let h = |at: usize| f16::from_le_bytes([row[at], row[at + 1]]).to_f32();
    (h(n), h(n + 2))
}

/// Rows and row width of a fused uint8 table, whose rows must hold `sb` bytes of scale and
/// bias.
fn fused_rows(t: &Tensor, sb: usize) -> Result<(usize, usize)> {
    if t.dtype() != DataType::Uint8 {
        bail!(DtypeMismatch: "fused 8-bit data must be uint8, got {}", t.dtype().name());
    }
    let (rows, width) = matrix(t, "DATA")?;
    if width < sb {
        bail!(
            ShapeMismatch: "fused rows must hold at least {sb} bytes of scale and bias, got \
             {width}"
        );
    }
    Ok((rows, width))
}

/// [`fused_rows`] with float32 scale and bias.
fn fused_cols(t: &Tensor) -> Result<(usize, usize)> {
    fused_rows(t, SCALE_BIAS_BYTES)
}

/// `Fused8BitRowwiseQuantized*To*`: each fused row back to its values (float, or float16
/// with `half`).
fn dequantize(ctx: &mut OpContext<'_>, half: bool, half_sb: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let sb = sb_bytes(half_sb);
    let (rows, width) = fused_rows(x, sb)?;
    let cols = width - sb;
    let xs = x.as_slice::<u8>()?;
    let mut od = x.dims().to_vec();
    if let Some(last) = od.last_mut() {
        *last = cols;
    }
    let rows_of = (0..rows).map(|r| {
        let row = &xs[r * width..(r + 1) * width];
        let (scale, bias) = if half_sb {
            half_scale_bias_of(row)
        } else {
            scale_bias(row)
        };
        (row[..cols].iter(), scale, bias)
    });
    if half {
        let y = outs.tensor(0)?.try_ensure::<f16>(&od)?;
        for ((q, scale, bias), out) in rows_of.zip(y.chunks_mut(cols.max(1))) {
            for (o, &q) in out.iter_mut().zip(q) {
                *o = f16::from_f32(f32::from(q) * scale + bias);
            }
        }
    } else {
        let y = outs.tensor(0)?.try_ensure::<f32>(&od)?;
        for ((q, scale, bias), out) in rows_of.zip(y.chunks_mut(cols.max(1))) {
            for (o, &q) in out.iter_mut().zip(q) {
                *o = f32::from(q) * scale + bias;
            }
        }
    }
    Ok(())
}

/// Row indices of an int32/int64 input, each below `bound`.
fn row_indices(t: &Tensor, bound: usize) -> Result<Vec<usize>> {
    if !matches!(t.dtype(), DataType::Int32 | DataType::Int64) {
        bail!(DtypeMismatch: "INDICES must be int32 or int64, got {}", t.dtype().name());
    }
    t.to_i64_vec()?
        .into_iter()
        .map(|i| {
            usize::try_from(i).ok().filter(|&u| u < bound).ok_or_else(
                || err!(BadArgument: "Index {i} is out of bounds: expected 0 <= index < {bound}"),
            )
        })
        .collect()
}

/// `GatherFused8BitRowwise`: (DATA [N, D + 8] uint8, INDICES) -> dequantized rows
/// `[len(INDICES), D]` float.
fn gather(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let data = ins.tensor(0)?;
    if data.ndim() != 2 {
        bail!(ShapeMismatch: "DATA must be 2-D, got shape {:?}", data.dims());
    }
    let (rows, width) = fused_cols(data)?;
    let cols = width - SCALE_BIAS_BYTES;
    let idx_t = ins.tensor(1)?;
    if idx_t.ndim() != 1 {
        bail!(ShapeMismatch: "INDICES must be 1-D, got shape {:?}", idx_t.dims());
    }
    let idx = row_indices(idx_t, rows)?;
    let xs = data.as_slice::<u8>()?;
    let y = outs.tensor(0)?.try_ensure::<f32>(&[idx.len(), cols])?;
    for (k, &r) in idx.iter().enumerate() {
        let row = &xs[r * width..(r + 1) * width];
        let (scale, bias) = scale_bias(row);
        for (o, &q) in y[k * cols..(k + 1) * cols].iter_mut().zip(row) {
            *o = f32::from(q) * scale + bias;
        }
    }
    Ok(())
}

/// `SparseLengths[Weighted]{Sum,Mean}8BitsRowwise`: (DATA uint8 [N, D], [WEIGHTS], INDICES,
/// LENGTHS, SCALE_BIAS [N, 2]) -> `[len(LENGTHS), D]` float.
fn lengths_8bit(ctx: &mut OpContext<'_>, weighted: bool, mean: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let data = ins.tensor(0)?;
    if data.dtype() != DataType::Uint8 || data.ndim() != 2 {
        bail!(
            DtypeMismatch: "DATA must be a 2-D uint8 table, got {} of shape {:?}",
            data.dtype().name(),
            data.dims()
        );
    }
    let (rows, cols) = (data.dims()[0], data.dims()[1]);
    let at = usize::from(weighted);
    let weights = if weighted {
        let w = ins.tensor(1)?;
        if w.dtype() != DataType::Float {
            bail!(DtypeMismatch: "WEIGHTS must be float, got {}", w.dtype().name());
        }
        Some(w.as_slice::<f32>()?)
    } else {
        None
    };
    let idx = row_indices(ins.tensor(at + 1)?, rows)?;
    let lens_t = ins.tensor(at + 2)?;
    if !matches!(lens_t.dtype(), DataType::Int32 | DataType::Int64) {
        bail!(DtypeMismatch: "LENGTHS must be int32 or int64, got {}", lens_t.dtype().name());
    }
    let lens = lens_t.to_i64_vec()?;
    let sb_t = ins.tensor(at + 3)?;
    if sb_t.dtype() != DataType::Float || sb_t.dims() != [rows, 2] {
        bail!(
            ShapeMismatch: "SCALE_BIAS must be float of shape [{rows}, 2], got {} {:?}",
            sb_t.dtype().name(),
            sb_t.dims()
        );
    }
    let sb = sb_t.as_slice::<f32>()?;
    if let Some(w) = weights {
        if w.len() != idx.len() {
            bail!(ShapeMismatch: "WEIGHTS has {} values, INDICES {}", w.len(), idx.len());
        }
    }
    let xs = data.as_slice::<u8>()?;
    let n_out = lens.len();
    let total = n_out
        .checked_mul(cols)
        .ok_or_else(|| err!(BadArgument: "output too large"))?;
    let mut y = try_vec(total, 0f32, "the output")?;
    let mut item = 0usize;
    for (s, &l) in lens.iter().enumerate() {
        let l = usize::try_from(l).map_err(|_| err!(BadArgument: "negative length {l}"))?;
        let end = item
            .checked_add(l)
            .filter(|&e| e <= idx.len())
            .ok_or_else(|| {
                err!(
                    ShapeMismatch: "the sum of LENGTHS exceeds the {} INDICES",
                    idx.len()
                )
            })?;
        let out = &mut y[s * cols..(s + 1) * cols];
        for k in item..end {
            let r = idx[k];
            let w = weights.map_or(1.0, |w| w[k]);
            let (scale, bias) = (sb[2 * r] * w, sb[2 * r + 1] * w);
            for (o, &q) in out.iter_mut().zip(&xs[r * cols..(r + 1) * cols]) {
                *o += f32::from(q) * scale + bias;
            }
        }
        if mean && l > 0 {
            let inv = 1.0 / l as f32;
            out.iter_mut().for_each(|v| *v *= inv);
        }
        item = end;
    }
    if item != idx.len() {
        bail!(
            ShapeMismatch: "Your input seems to be incorrect: the sum of lengths values should be \
             the size of the indices tensor, but it appears not. ({item} vs {})",
            idx.len()
        );
    }
    let out = outs.tensor(0)?;
    out.try_reset(DataType::Float, &[n_out, cols])?;
    out.as_mut_slice::<f32>()?.copy_from_slice(&y);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn quantize_round_trip_and_gather() {
        let ws = Workspace::new();
        let x = vec![0.0f32, 1.0, 0.5, -2.0, 2.0, 0.0];
        ws.feed("x", Tensor::from_vec(&[2, 3], x.clone()).unwrap());
        let q = OperatorDef::new("FloatToFused8BitRowwiseQuantized", ["x"], ["q"]);
        ws.run_operator_once(&q).unwrap();
        assert_eq!(ws.fetch("q").unwrap().dims(), &[2, 11]);
        let d = OperatorDef::new("Fused8BitRowwiseQuantizedToFloat", ["q"], ["d"]);
        ws.run_operator_once(&d).unwrap();
        let back = ws.fetch("d").unwrap();
        for (a, b) in back.as_slice::<f32>().unwrap().iter().zip(&x) {
            assert!((a - b).abs() < 0.02, "{a} vs {b}");
        }
        ws.feed("i", Tensor::from_vec(&[1], vec![1i32]).unwrap());
        let g = OperatorDef::new("GatherFused8BitRowwise", ["q", "i"], ["g"]);
        ws.run_operator_once(&g).unwrap();
        let g = ws.fetch("g").unwrap();
        assert_eq!(
            g.as_slice::<f32>().unwrap(),
            &back.as_slice::<f32>().unwrap()[3..]
        );
    }

    #[test]
    fn half_variants_round_trip_and_empty_rows() {
        use half::f16;
        let ws = Workspace::new();
        let x: Vec<f16> = [0.0f32, 1.0, 0.5, -2.0, 2.0, 0.25]
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        ws.feed("x", Tensor::from_vec(&[2, 3], x.clone()).unwrap());
        for (q, d, width) in [
            (
                "HalfFloatToFused8BitRowwiseQuantized",
                "Fused8BitRowwiseQuantizedToHalfFloat",
                11,
            ),
            (
                "HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias",
                "Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat",
                7,
            ),
        ] {
            ws.run_operator_once(&OperatorDef::new(q, ["x"], ["q"]))
                .unwrap();
            assert_eq!(ws.fetch("q").unwrap().dims(), &[2, width]);
            ws.run_operator_once(&OperatorDef::new(d, ["q"], ["d"]))
                .unwrap();
            let back = ws.fetch("d").unwrap();
            for (a, b) in back.as_slice::<f16>().unwrap().iter().zip(&x) {
                assert!((a.to_f32() - b.to_f32()).abs() < 0.02, "{q}: {a} vs {b}");
            }
        }
        // Rows of no values: only scale and bias.
        ws.feed("e", Tensor::from_vec(&[2, 0], Vec::<f32>::new()).unwrap());
        let q = "FloatToFused8BitRowwiseQuantizedHalfScaleBias";
        ws.run_operator_once(&OperatorDef::new(q, ["e"], ["q"]))
            .unwrap();
        assert_eq!(ws.fetch("q").unwrap().dims(), &[2, 4]);
        let d = "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat";
        ws.run_operator_once(&OperatorDef::new(d, ["q"], ["d"]))
            .unwrap();
        assert_eq!(ws.fetch("d").unwrap().dims(), &[2, 0]);
    }
}
