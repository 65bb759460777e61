//! Sparse and segment ops: Gather (and BatchGatherGradient), SparseLengths{Sum,Mean,
//! WeightedSum}, Lengths{Sum,Mean,WeightedSum}, UnsortedSegment{Sum,Mean}, Unique,
//! ScatterAssign, ScatterWeightedSum, SparseToDense, and the gradient ops the segment reductions emit (with the weights' gradient for `grad_on_weights`).
//!
//! Rows are the slices along the first dimension of DATA; indices may be int32 or int64.

use crate::dispatch;
use crate::error::{try_vec, Result};
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Gather", create_gather);
    r.cpu("BatchGather", |i| gather_with_default_axis(i, 1));
    r.cpu("BatchGatherGradient", create_batch_gather_gradient);
    for (name, kind) in [
        ("SparseLengthsSum", Red::Sum),
        ("SparseLengthsMean", Red::Mean),
        ("SparseLengthsWeightedSum", Red::Weighted),
    ] {
        let f: crate::ops::registry::Factory = match kind {
            Red::Sum => |_| {
                Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                    lengths_reduce(c, Red::Sum, true)
                })))
            },
            Red::Mean => |_| {
                Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                    lengths_reduce(c, Red::Mean, true)
                })))
            },
            Red::Weighted => |_| {
                Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                    lengths_reduce(c, Red::Weighted, true)
                })))
            },
        };
        r.cpu(name, f);
    }
    r.cpu("LengthsSum", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
            lengths_reduce(c, Red::Sum, false)
        })))
    });
    r.cpu("LengthsMean", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
            lengths_reduce(c, Red::Mean, false)
        })))
    });
    r.cpu("LengthsWeightedSum", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
            lengths_reduce(c, Red::Weighted, false)
        })))
    });
    // Gradients: (dY, LENGTHS[, ...]) -> one row per index / data row.
    r.cpu_many(
        &[
            "SparseLengthsIndicesInGradientSumGradient",
            "LengthsIndicesInGradientSumGradient",
            "SparseLengthsSumGradient",
            "LengthsSumGradient",
        ],
        |_| {
            Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                lengths_grad(c, Red::Sum)
            })))
        },
    );
    r.cpu_many(
        &[
            "SparseLengthsIndicesInGradientMeanGradient",
            "LengthsIndicesInGradientMeanGradient",
            "SparseLengthsMeanGradient",
            "LengthsMeanGradient",
        ],
        |_| {
            Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                lengths_grad(c, Red::Mean)
            })))
        },
    );
    r.cpu_many(
        &[
            "SparseLengthsIndicesInGradientWeightedSumGradient",
            "LengthsIndicesInGradientWeightedSumGradient",
            "SparseLengthsWeightedSumGradient",
            "LengthsWeightedSumGradient",
        ],
        |_| {
            Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
                lengths_grad(c, Red::Weighted)
            })))
        },
    );
    // grad_on_weights: (WEIGHTS, dY, LENGTHS, DATA, INDICES) -> (DATA_grad_values, WEIGHTS_grad).
    r.cpu(
        "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
        |_| Ok(Box::new(FnOp(weighted_grad_with_main_input))),
    );
    r.cpu("UnsortedSegmentSum", |i| {
        let num = i.args.int("num_segments", -1)?;
        Ok(Box::new(FnOp(move |c: &mut OpContext<'_>| {
            unsorted_segment(c, num, false)
        })))
    });
    r.cpu("UnsortedSegmentMean", |i| {
        let num = i.args.int("num_segments", -1)?;
        Ok(Box::new(FnOp(move |c: &mut OpContext<'_>| {
            unsorted_segment(c, num, true)
        })))
    });
    r.cpu("Unique", |_| Ok(Box::new(FnOp(unique))));
    r.cpu("UnsortedSegmentSumGradient", |_| {
        Ok(Box::new(FnOp(unsorted_segment_sum_grad)))
    });
    r.cpu("ScatterAssign", |_| Ok(Box::new(FnOp(scatter_assign))));
    r.cpu("ScatterWeightedSum", |_| {
        Ok(Box::new(FnOp(scatter_weighted_sum)))
    });
    r.cpu("SparseToDense", |_| Ok(Box::new(FnOp(sparse_to_dense))));
}

/// Row count and row size (elements) of DATA.
fn rows(t: &Tensor) -> Result<(usize, usize)> {
    let n = *t
        .dims()
        .first()
        .ok_or_else(|| err!(ShapeMismatch: "DATA must have at least one dimension"))?;
    Ok((n, t.numel().checked_div(n).unwrap_or(0)))
}

fn indices(t: &Tensor, bound: usize) -> Result<Vec<usize>> {
    t.to_i64_vec()?
        .into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .filter(|&u| u < bound)
                .ok_or_else(|| {
                    err!(
                        BadArgument: "INDICES element is out of DATA bounds, id={i} \
                         axis_dim={bound}"
                    )
                })
        })
        .collect()
}

fn create_gather(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    gather_with_default_axis(init, 0)
}

/// The gathered layout: `(axis, outer, indices per outer slice, inner, output dims)`. With
/// `match_outer`, INDICES' leading `axis` dims must equal DATA's and each outer slice of DATA
/// takes its own block of indices.
fn gather_layout(
    d: &[usize],
    idx_dims: &[usize],
    axis: i64,
    match_outer: bool,
) -> Result<(usize, usize, usize, usize, Vec<usize>)> {
    let nd = d.len() as i64;
    let ax = if axis < 0 { axis + nd } else { axis };
    if ax < 0 || ax >= nd {
        bail!(BadArgument: "axis {axis} out of range for DATA of shape {d:?}");
    }
    let ax = ax as usize;
    let outer: usize = d[..ax].iter().product();
    let inner: usize = d[ax + 1..].iter().product();
    if d[ax] == 0 {
        // Gathering from an empty axis (e.g. an empty batch) gives DATA's own (empty) shape,
        // whatever the indices, as Caffe2 does.
        return Ok((ax, outer, 0, inner, d.to_vec()));
    }
    let mut od = d[..ax].to_vec();
    let per = if match_outer {
        if idx_dims.len() < ax || idx_dims[..ax] != d[..ax] {
            bail!(
                ShapeMismatch: "INDICES {idx_dims:?} must match the outer dims {:?} of DATA \
                 {d:?} (match_outer)",
                &d[..ax]
            );
        }
        od.extend_from_slice(&idx_dims[ax..]);
        idx_dims[ax..].iter().product()
    } else {
        od.extend_from_slice(idx_dims);
        idx_dims.iter().product()
    };
    od.extend_from_slice(&d[ax + 1..]);
    Ok((ax, outer, per, inner, od))
}

/// Gather / BatchGather (`axis` defaults to 0 and 1), with `match_outer`.
fn gather_with_default_axis(init: &OpInit<'_>, default_axis: i64) -> Result<Box<dyn Operator>> {
    let axis = init.args.int("axis", default_axis)?;
    let match_outer = init.args.bool("match_outer", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (ins, mut outs) = ctx.split();
        let data = ins.tensor(0)?;
        let idx_t = ins.tensor(1)?;
        let d = data.dims().to_vec();
        let (ax, outer, per, inner, od) = gather_layout(&d, idx_t.dims(), axis, match_outer)?;
        dispatch!(data.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64,
            Bool => bool, Uint8 => u8, Int8 => i8, Int16 => i16, Uint16 => u16, Float16 => half::f16], |T| {
            let src = data.as_slice::<T>()?;
            let y = outs.tensor(0)?.try_ensure::<T>(&od)?;
            if y.is_empty() {
                // Nothing to copy (an empty batch, no indices or empty rows): as in Caffe2 the
                // indices are not checked then.
                return Ok(());
            }
            let idx = indices(idx_t, d[ax])?;
            let mut k = 0;
            for o in 0..outer {
                let block = if match_outer { &idx[o * per..(o + 1) * per] } else { &idx[..] };
                for &i in block {
                    let s = (o * d[ax] + i) * inner;
                    y[k..k + inner].copy_from_slice(&src[s..s + inner]);
                    k += inner;
                }
            }
            Ok(())
        })
    })))
}

/// BatchGatherGradient (the gradient of Gather along `axis` > 0): inputs DATA, INDICES and
/// GRAD (the gradient of Gather's output); output dDATA, DATA's shape, holding the sum of the
/// GRAD blocks gathered from each position. `axis` defaults to 1, as in Caffe2.
fn create_batch_gather_gradient(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axis = init.args.int("axis", 1)?;
    let match_outer = init.args.bool("match_outer", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (ins, mut outs) = ctx.split();
        let data = ins.tensor(0)?;
        let idx_t = ins.tensor(1)?;
        let grad = ins.tensor(2)?;
        let d = data.dims().to_vec();
        if d.len() < 2 {
            bail!(ShapeMismatch: "DATA should be at least 2-D, got shape {d:?}");
        }
        let (ax, outer, per, inner, gd) = gather_layout(&d, idx_t.dims(), axis, match_outer)?;
        if grad.dims() != gd.as_slice() {
            bail!(
                ShapeMismatch: "GRAD has shape {:?}, expected {gd:?} (DATA {d:?} gathered along \
                 axis {ax} by INDICES {:?})",
                grad.dims(),
                idx_t.dims()
            );
        }
        if data.dtype() != DataType::Float || grad.dtype() != DataType::Float {
            bail!(
                DtypeMismatch: "BatchGatherGradient takes float DATA and GRAD, got {:?} and {:?}",
                data.dtype(),
                grad.dtype()
            );
        }
        let g = grad.as_slice::<f32>()?;
        let out = outs.tensor(0)?.try_ensure::<f32>(&d)?;
        if out.is_empty() {
            // Empty DATA (an empty batch): nothing to scatter into, the indices go unchecked
            // as in Caffe2.
            return Ok(());
        }
        let idx = indices(idx_t, d[ax])?;
        out.fill(0.0);
        let mut k = 0;
        for o in 0..outer {
            let block = if match_outer {
                &idx[o * per..(o + 1) * per]
            } else {
                &idx[..]
            };
            for &i in block {
                let dst = (o * d[ax] + i) * inner;
                out[dst..dst + inner]
                    .iter_mut()
                    .zip(&g[k..k + inner])
                    .for_each(|(a, b)| *a += b);
                k += inner;
            }
        }
        Ok(())
    })))
}

#[derive(Clone, Copy, PartialEq)]
enum Red {
    Sum,
    Mean,
    Weighted,
}

fn lengths(t: &Tensor) -> Result<Vec<usize>> {
    t.to_i64_vec()?
        .into_iter()
        .map(|l| usize::try_from(l).map_err(|_| err!(BadArgument: "negative length {l}")))
        .collect()
}

/// The sum of `lens`, an error when it overflows (a wrapped sum could match the data and let
/// a segment loop run for ever).
fn total_length(lens: &[usize]) -> Result<usize> {
    lens.iter()
        .try_fold(0usize, |a, &l| a.checked_add(l))
        .ok_or_else(|| err!(BadArgument: "the sum of the lengths overflows"))
}

/// (Sparse)Lengths{Sum,Mean,WeightedSum}. Inputs: DATA, [WEIGHTS], [INDICES], LENGTHS.
fn lengths_reduce(ctx: &mut OpContext<'_>, red: Red, sparse: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let data = ins.tensor(0)?;
    let (n_rows, block) = rows(data)?;
    let mut k = 1;
    let weights = if red == Red::Weighted {
        k += 1;
        Some(ins.tensor(1)?.as_slice::<f32>()?)
    } else {
        None
    };
    let idx = if sparse {
        k += 1;
        Some(indices(ins.tensor(k - 1)?, n_rows)?)
    } else {
        None
    };
    let lens = lengths(ins.tensor(k)?)?;
    let total = total_length(&lens)?;
    let n_items = idx.as_ref().map_or(n_rows, Vec::len);
    if total != n_items {
        bail!(
            ShapeMismatch: "Your input seems to be incorrect: the sum of lengths values should be \
             the size of the indices tensor, but it appears not. ({total} vs {n_items})"
        );
    }
    if let Some(w) = weights {
        if w.len() != n_items {
            bail!(ShapeMismatch: "WEIGHTS has {} values, expected {n_items}", w.len());
        }
    }
    // A float16 table is read as float (the output is float, as in Caffe2).
    let widened: Vec<f32>;
    let src = if data.dtype() == DataType::Float16 {
        widened = data
            .as_slice::<half::f16>()?
            .iter()
            .map(|v| v.to_f32())
            .collect();
        &widened[..]
    } else {
        data.as_slice::<f32>()?
    };
    let mut od = data.dims().to_vec();
    od[0] = lens.len();
    let y = outs.tensor(0)?.ensure::<f32>(&od);
    y.fill(0.0);
    let mut item = 0;
    for (seg, &len) in lens.iter().enumerate() {
        let out = &mut y[seg * block..(seg + 1) * block];
        for _ in 0..len {
            let row = idx.as_ref().map_or(item, |v| v[item]);
            let w = weights.map_or(1.0, |w| w[item]);
            for (o, v) in out.iter_mut().zip(&src[row * block..(row + 1) * block]) {
                *o += w * v;
            }
            item += 1;
        }
        if red == Red::Mean && len > 0 {
            for o in out.iter_mut() {
                *o /= len as f32;
            }
        }
    }
    Ok(())
}

/// Gradient of the length reductions: one row per item, the segment's dY (scaled).
/// Inputs: (dY, LENGTHS, ...) or, weighted, (WEIGHTS, dY, LENGTHS, ...).
fn lengths_grad(ctx: &mut OpContext<'_>, red: Red) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let off = (red == Red::Weighted) as usize;
    let dy = ins.tensor(off)?;
    let lens = lengths(ins.tensor(off + 1)?)?;
    let (n_seg, block) = rows(dy)?;
    if n_seg != lens.len() {
        bail!(ShapeMismatch: "dY has {n_seg} rows for {} lengths", lens.len());
    }
    let total = total_length(&lens)?;
    let weights = if red == Red::Weighted {
        let w = ins.tensor(0)?.as_slice::<f32>()?;
        if w.len() != total {
            bail!(ShapeMismatch: "WEIGHTS has {} values, expected {total}", w.len());
        }
        Some(w)
    } else {
        None
    };
    let g = dy.as_slice::<f32>()?;
    let mut od = dy.dims().to_vec();
    od[0] = total;
    let out = outs.tensor(0)?.ensure::<f32>(&od);
    let mut item = 0;
    for (seg, &len) in lens.iter().enumerate() {
        let scale = if red == Red::Mean && len > 0 {
            1.0 / len as f32
        } else {
            1.0
        };
        for _ in 0..len {
            let w = weights.map_or(scale, |w| w[item]);
            for (o, v) in out[item * block..(item + 1) * block]
                .iter_mut()
                .zip(&g[seg * block..(seg + 1) * block])
            {
                *o = w * v;
            }
            item += 1;
        }
    }
    Ok(())
}

/// Gradient of SparseLengthsWeightedSum with `grad_on_weights`: item k of segment s gets the
/// row `WEIGHTS[k] * dY[s]` and the weight gradient `<dY[s], DATA[INDICES[k]]>`.
fn weighted_grad_with_main_input(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let w = ins.tensor(0)?.as_slice::<f32>()?;
    let dy = ins.tensor(1)?;
    let len_t = ins.tensor(2)?;
    if len_t.ndim() != 1 {
        bail!(ShapeMismatch: "LENGTHS must be a vector, got shape {:?}", len_t.dims());
    }
    let lens = lengths(len_t)?;
    let data = ins.tensor(3)?;
    let (n_rows, block) = rows(data)?;
    let idx_t = ins.tensor(4)?;
    let idx = indices(idx_t, n_rows)?;
    if dy.ndim() == 0 {
        bail!(ShapeMismatch: "dY must have at least one dimension");
    }
    let (n_seg, dy_block) = rows(dy)?;
    if n_seg != lens.len() {
        bail!(ShapeMismatch: "dY has {n_seg} rows for {} lengths", lens.len());
    }
    if dy_block != block {
        bail!(ShapeMismatch: "dY rows have {dy_block} values, DATA rows {block}");
    }
    let total = total_length(&lens)?;
    if total != idx.len() {
        bail!(
            ShapeMismatch: "Your input seems to be incorrect: the sum of lengths values should be \
             the size of the indices tensor, but it appears not. ({total} vs {})",
            idx.len()
        );
    }
    if w.len() != total {
        bail!(ShapeMismatch: "WEIGHTS has {} values, expected {total}", w.len());
    }
    let g = dy.as_slice::<f32>()?;
    let src = data.as_slice::<f32>()?;
    let mut od = vec![total];
    od.extend_from_slice(&dy.dims()[1..]);
    let w_dims = ins.tensor(0)?.dims().to_vec();
    let mut w_grad = vec![0f32; total];
    {
        let out = outs.tensor(0)?.ensure::<f32>(&od);
        let mut item = 0;
        for (seg, &len) in lens.iter().enumerate() {
            let gs = &g[seg * block..(seg + 1) * block];
            for _ in 0..len {
                let row = &src[idx[item] * block..(idx[item] + 1) * block];
                for (o, v) in out[item * block..(item + 1) * block].iter_mut().zip(gs) {
                    *o = w[item] * v;
                }
                w_grad[item] = gs.iter().zip(row).map(|(a, b)| a * b).sum();
                item += 1;
            }
        }
    }
    outs.tensor(1)?
        .ensure::<f32>(&w_dims)
        .copy_from_slice(&w_grad);
    Ok(())
}

/// UnsortedSegmentSum / UnsortedSegmentMean: row r of DATA goes to segment SEGMENT_IDS[r];
/// `num_segments` segments (default: the largest id + 1). A mean divides each segment by its
/// row count; segments without rows are zero.
fn unsorted_segment(ctx: &mut OpContext<'_>, num: i64, mean: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let data = ins.tensor(0)?;
    let (n_rows, block) = rows(data)?;
    let ids = ins.tensor(1)?.to_i64_vec()?;
    if ids.len() != n_rows {
        bail!(ShapeMismatch: "SEGMENT_IDS has {} values for {n_rows} rows", ids.len());
    }
    let n_seg = if num >= 0 {
        num as usize
    } else {
        ids.iter()
            .copied()
            .max()
            .map_or(0, |m| usize::try_from(m.saturating_add(1)).unwrap_or(0))
    };
    let src = data.as_slice::<f32>()?;
    let mut od = data.dims().to_vec();
    od[0] = n_seg;
    let mut counts = try_vec(if mean { n_seg } else { 0 }, 0u64, "segment counts")?;
    // The segment count comes from an argument or the ids: allocated fallibly.
    let y = outs.tensor(0)?.try_ensure::<f32>(&od)?;
    y.fill(0.0);
    for (r, &s) in ids.iter().enumerate() {
        let s = usize::try_from(s)
            .ok()
            .filter(|&s| s < n_seg)
            .ok_or_else(|| err!(BadArgument: "segment id {s} out of range [0, {n_seg})"))?;
        for (o, v) in y[s * block..(s + 1) * block]
            .iter_mut()
            .zip(&src[r * block..(r + 1) * block])
        {
            *o += v;
        }
        if let Some(c) = counts.get_mut(s) {
            *c += 1;
        }
    }
    for (s, &c) in counts.iter().enumerate() {
        if c > 0 {
            let inv = 1.0 / c as f32;
            y[s * block..(s + 1) * block]
                .iter_mut()
                .for_each(|v| *v *= inv);
        }
    }
    Ok(())
}

/// Unique: the distinct values of a 1-d int32/int64 tensor, ascending, and optionally (second
/// output) the int32 position of each input value among them.
fn unique(ctx: &mut OpContext<'_>) -> Result<()> {
    let want_map = ctx.num_outputs() > 1;
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    if x.dims().len() != 1 {
        bail!(ShapeMismatch: "Input should be a vector, got shape {:?}", x.dims());
    }
    let dtype = x.dtype();
    if dtype != DataType::Int32 && dtype != DataType::Int64 {
        bail!(DtypeMismatch: "Unique takes int32 or int64 input, got {dtype:?}");
    }
    let vals = x.to_i64_vec()?;
    let n = vals.len();
    if i32::try_from(n).is_err() {
        bail!(BadArgument: "Unique input of {n} values is too long for int32 remapping");
    }
    let mut order = try_vec(n, 0usize, "Unique order")?;
    order.iter_mut().enumerate().for_each(|(i, o)| *o = i);
    order.sort_by_key(|&i| vals[i]);
    let mut uniq = try_vec(n, 0i64, "Unique values")?;
    let mut k = 0usize;
    let mut map = try_vec(if want_map { n } else { 0 }, 0i32, "Unique remapping")?;
    for &i in &order {
        if k == 0 || uniq[k - 1] != vals[i] {
            uniq[k] = vals[i];
            k += 1;
        }
        if let Some(m) = map.get_mut(i) {
            // 1 <= k <= n <= i32::MAX.
            *m = (k - 1) as i32;
        }
    }
    uniq.truncate(k);
    if dtype == DataType::Int32 {
        let out = outs.tensor(0)?.ensure::<i32>(&[k]);
        for (o, &v) in out.iter_mut().zip(&uniq) {
            // Every value came from the int32 input.
            *o = v as i32;
        }
    } else {
        outs.tensor(0)?.ensure::<i64>(&[k]).copy_from_slice(&uniq);
    }
    if want_map {
        outs.tensor(1)?.ensure::<i32>(&[n]).copy_from_slice(&map);
    }
    Ok(())
}

fn unsorted_segment_sum_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let dy = ins.tensor(0)?;
    let (n_seg, block) = rows(dy)?;
    let ids = indices(ins.tensor(1)?, n_seg)?;
    let g = dy.as_slice::<f32>()?;
    let mut od = dy.dims().to_vec();
    od[0] = ids.len();
    let out = outs.tensor(0)?.ensure::<f32>(&od);
    for (r, &s) in ids.iter().enumerate() {
        out[r * block..(r + 1) * block].copy_from_slice(&g[s * block..(s + 1) * block]);
    }
    Ok(())
}

/// DATA[INDICES[k]] = SLICES[k], DATA updated in place (enforced by the schema).
fn scatter_assign(ctx: &mut OpContext<'_>) -> Result<()> {
    if !ctx.is_inplace(0, 0) {
        let (ins, mut outs) = ctx.split();
        let d = ins.tensor(0)?;
        outs.tensor(0)?.copy_from(d);
    }
    let idx = ctx.input(1)?.to_i64_vec()?;
    let slices = ctx.input(2)?.clone();
    let out = ctx.output(0)?;
    let (n_rows, block) = rows(out)?;
    if slices.numel() != idx.len() * block || slices.dtype() != out.dtype() {
        bail!(ShapeMismatch: "SLICES must hold {} x {block} values of {}", idx.len(), out.dtype());
    }
    dispatch!(out.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64, Float16 => half::f16], |T| {
        let s = slices.as_slice::<T>()?;
        let y = out.as_mut_slice::<T>()?;
        for (k, &i) in idx.iter().enumerate() {
            let i = usize::try_from(i)
                .ok()
                .filter(|&i| i < n_rows)
                .ok_or_else(|| err!(BadArgument: "Index out of bounds: {i}, range 0 to {n_rows}"))?;
            y[i * block..(i + 1) * block].copy_from_slice(&s[k * block..(k + 1) * block]);
        }
        Ok(())
    })
}

/// X0[idx] = X0[idx] * W0 + sum_i X_i * W_i, inputs (X0, W0, INDICES, X1, W1, ...).
fn scatter_weighted_sum(ctx: &mut OpContext<'_>) -> Result<()> {
    let n = ctx.num_inputs();
    if n < 5 || !(n - 3).is_multiple_of(2) {
        bail!(Schema: "ScatterWeightedSum needs (X0, W0, INDICES, X1, W1, ...)");
    }
    if !ctx.is_inplace(0, 0) {
        let (ins, mut outs) = ctx.split();
        let d = ins.tensor(0)?;
        outs.tensor(0)?.copy_from(d);
    }
    let w0 = ctx.input(1)?.get_f64(0)?;
    let idx = ctx.input(2)?.to_i64_vec()?;
    let mut terms = Vec::new();
    for k in (3..n).step_by(2) {
        terms.push((ctx.input(k)?.clone(), ctx.input(k + 1)?.get_f64(0)?));
    }
    let out = ctx.output(0)?;
    let (n_rows, block) = rows(out)?;
    let rows_at: Vec<usize> =
        idx.iter()
            .map(|&i| {
                usize::try_from(i).ok().filter(|&i| i < n_rows).ok_or_else(
                    || err!(BadArgument: "Index out of bounds: {i}, range 0 to {n_rows}"),
                )
            })
            .collect::<Result<_>>()?;
    for (x, _) in &terms {
        if x.numel() != idx.len() * block || x.dtype() != out.dtype() {
            bail!(
                ShapeMismatch: "each X must hold {} x {block} values of {}, got {:?} of {}",
                idx.len(),
                out.dtype().name(),
                x.dims(),
                x.dtype().name()
            );
        }
    }
    // As Caffe2: scale every indexed row by W0 first (a repeated index is scaled again), then
    // add each weighted X.
    dispatch!(out.dtype(), [Float => f32, Double => f64], |T| {
        let y = out.as_mut_slice::<T>()?;
        for &i in &rows_at {
            y[i * block..(i + 1) * block].iter_mut().for_each(|v| *v *= w0 as T);
        }
        for (x, w) in &terms {
            let xs = x.as_slice::<T>()?;
            for (k, &i) in rows_at.iter().enumerate() {
                for (o, &v) in y[i * block..(i + 1) * block]
                    .iter_mut()
                    .zip(&xs[k * block..(k + 1) * block])
                {
                    *o += *w as T * v;
                }
            }
        }
        Ok(())
    })
}

/// Y[indices[k]] += values[k]; first dim from `like` (input 2) or max index + 1.
fn sparse_to_dense(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let idx = ins.tensor(0)?.to_i64_vec()?;
    let values = ins.tensor(1)?;
    let first = if ins.len() > 2 {
        *ins.tensor(2)?
            .dims()
            .first()
            .ok_or_else(|| err!(ShapeMismatch: "the shape reference must not be 0-d"))?
    } else {
        idx.iter()
            .copied()
            .max()
            .map_or(0, |m| usize::try_from(m.saturating_add(1)).unwrap_or(0))
    };
    let mut od = values.dims().to_vec();
    if od.is_empty() {
        bail!(ShapeMismatch: "values must have at least one dimension");
    }
    // As Caffe2: one row of values per index (found by fuzzing: a scalar index with two rows
    // of values indexed past the output).
    if od[0] != idx.len() {
        bail!(
            ShapeMismatch: "{} indices for {} rows of values (shape {:?})",
            idx.len(),
            od[0],
            values.dims()
        );
    }
    let block = values.size_from_dim(1);
    od[0] = first;
    let src = values.as_slice::<f32>()?;
    // The first dim comes from index values: a size no memory holds is an error.
    let y = outs.tensor(0)?.try_ensure::<f32>(&od)?;
    y.fill(0.0);
    for (k, &i) in idx.iter().enumerate() {
        let i = usize::try_from(i)
            .ok()
            .filter(|&i| i < first)
            .ok_or_else(|| err!(BadArgument: "index {i} out of range [0, {first})"))?;
        for j in 0..block {
            y[i * block + j] += src[k * block + j];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn f32s(ws: &Workspace, name: &str) -> Vec<f32> {
        ws.fetch(name).unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    #[test]
    fn unique_sorts_and_remaps() {
        let ws = Workspace::new();
        ws.feed(
            "X",
            Tensor::from_vec(&[6], vec![5i64, -2, 5, 7, -2, 0]).unwrap(),
        );
        ws.run_operator_once(&OperatorDef::new("Unique", ["X"], ["U", "R"]))
            .unwrap();
        let u = ws.fetch("U").unwrap();
        assert_eq!(u.as_slice::<i64>().unwrap(), &[-2, 0, 5, 7]);
        let r = ws.fetch("R").unwrap();
        assert_eq!(r.as_slice::<i32>().unwrap(), &[2, 0, 2, 3, 0, 1]);
        ws.feed("Y", Tensor::from_vec(&[2, 1], vec![1i32, 1]).unwrap());
        let err = ws
            .run_operator_once(&OperatorDef::new("Unique", ["Y"], ["V"]))
            .unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::ShapeMismatch);
    }

    #[test]
    fn unsorted_segment_mean_divides_by_counts() {
        let ws = Workspace::new();
        ws.feed(
            "D",
            Tensor::from_vec(&[3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
        );
        ws.feed("S", Tensor::from_vec(&[3], vec![2i32, 0, 2]).unwrap());
        let op = OperatorDef::new("UnsortedSegmentMean", ["D", "S"], ["Y"]);
        ws.run_operator_once(&op).unwrap();
        // Segment 1 has no rows: zero.
        assert_eq!(f32s(&ws, "Y"), vec![3.0, 4.0, 0.0, 0.0, 3.0, 4.0]);
    }

    #[test]
    fn batch_gather_gradient_adds_repeated_indices() {
        let ws = Workspace::new();
        ws.feed("D", Tensor::from_vec(&[2, 3], vec![0f32; 6]).unwrap());
        ws.feed("I", Tensor::from_vec(&[3], vec![2i32, 0, 2]).unwrap());
        let g = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        ws.feed("G", Tensor::from_vec(&[2, 3], g).unwrap());
        let op = OperatorDef::new("BatchGatherGradient", ["D", "I", "G"], ["dD"]);
        ws.run_operator_once(&op).unwrap();
        assert_eq!(f32s(&ws, "dD"), vec![2.0, 0.0, 4.0, 5.0, 0.0, 10.0]);
        ws.feed("G", Tensor::from_vec(&[2, 2], vec![0f32; 4]).unwrap());
        let err = ws.run_operator_once(&op).unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::ShapeMismatch);
    }

    fn op() -> OperatorDef {
        OperatorDef::new(
            "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
            ["W", "dY", "L", "D", "I"],
            ["D_grad_values", "W_grad"],
        )
    }

    fn feed(ws: &Workspace) {
        // DATA rows [1, 2], [3, 4], [5, 6]; segments {I[0], I[1]} and {I[2]}.
        ws.feed(
            "D",
            Tensor::from_vec(&[3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
        );
        ws.feed(
            "W",
            Tensor::from_vec(&[3], vec![2.0f32, -1.0, 0.5]).unwrap(),
        );
        ws.feed("I", Tensor::from_vec(&[3], vec![2i32, 0, 2]).unwrap());
        ws.feed("L", Tensor::from_vec(&[2], vec![2i32, 1]).unwrap());
        ws.feed(
            "dY",
            Tensor::from_vec(&[2, 2], vec![1.0f32, 10.0, -1.0, 1.0]).unwrap(),
        );
    }

    #[test]
    fn weighted_sum_gradient_with_main_input() {
        let ws = Workspace::new();
        feed(&ws);
        ws.run_operator_once(&op()).unwrap();
        // Item k of segment s: W[k] * dY[s]; weight gradient <dY[s], D[I[k]]>.
        assert_eq!(
            f32s(&ws, "D_grad_values"),
            vec![2.0, 20.0, -1.0, -10.0, -0.5, 0.5]
        );
        assert_eq!(ws.fetch("D_grad_values").unwrap().dims(), &[3, 2]);
        assert_eq!(
            f32s(&ws, "W_grad"),
            vec![5.0 + 60.0, 1.0 + 20.0, -5.0 + 6.0]
        );
        assert_eq!(ws.fetch("W_grad").unwrap().dims(), &[3]);
    }

    #[test]
    fn weighted_sum_gradient_with_main_input_errors() {
        let ws = Workspace::new();
        feed(&ws);
        ws.feed("L", Tensor::from_vec(&[2], vec![1i32, 1]).unwrap());
        let e = ws.run_operator_once(&op()).unwrap_err().to_string();
        assert!(e.contains("sum of lengths values"), "{e}");
        feed(&ws);
        ws.feed("I", Tensor::from_vec(&[3], vec![2i32, 0, 3]).unwrap());
        let e = ws.run_operator_once(&op()).unwrap_err().to_string();
        assert!(e.contains("id=3 axis_dim=3"), "{e}");
    }
}
