//! Segment reductions keyed by SEGMENT_IDS (one id per row of DATA, or per entry of INDICES
//! for the `Sparse*` forms) and their gradients:
//!
//! * `SortedSegment{Sum,Mean}`, `SparseSortedSegment{Sum,Mean}`: ids must be non-decreasing;
//!   the output has `last id + 1` rows.
//! * `SparseUnsortedSegment{Sum,Mean}`: any non-negative ids; `max id + 1` rows (or the
//!   `num_segments` argument). (`UnsortedSegment{Sum,Mean}` live in `sparse.rs`.)
//! * `SortedSegmentRange{Sum,LogSumExp,LogMeanExp,Mean,Max}`: reducers that see each
//!   segment's rows at once.
//! * `LengthsMax` (segments given by LENGTHS) and its gradient.
//!
//! Empty segments give zero rows. Ids and indices may be int32 or int64; data is float.

use crate::error::{try_vec, Result};
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::{Factory, Registry};
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    let plain: [(&str, Factory); 8] = [
        ("SortedSegmentSum", |i| create(i, Kind::Sum, false, true)),
        ("SortedSegmentMean", |i| create(i, Kind::Mean, false, true)),
        ("SparseSortedSegmentSum", |i| {
            create(i, Kind::Sum, true, true)
        }),
        ("SparseSortedSegmentMean", |i| {
            create(i, Kind::Mean, true, true)
        }),
        ("SparseUnsortedSegmentSum", |i| {
            create(i, Kind::Sum, true, false)
        }),
        ("SparseUnsortedSegmentMean", |i| {
            create(i, Kind::Mean, true, false)
        }),
        ("SortedSegmentRangeSum", |i| {
            create(i, Kind::RangeSum, false, true)
        }),
        ("SortedSegmentRangeMean", |i| {
            create(i, Kind::RangeMean, false, true)
        }),
    ];
    for (name, f) in plain {
        r.cpu(name, f);
    }
    r.cpu("SortedSegmentRangeLogSumExp", |i| {
        create(i, Kind::LogSumExp, false, true)
    });
    r.cpu("SortedSegmentRangeLogMeanExp", |i| {
        create(i, Kind::LogMeanExp, false, true)
    });
    r.cpu("SortedSegmentRangeMax", |i| {
        create(i, Kind::RangeMax, false, true)
    });
    // (dY, SEGMENT_IDS) -> one gradient row per id.
    r.cpu("SortedSegmentSumGradient", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| {
            per_id_grad(c, false)
        })))
    });
    r.cpu_many(
        &["SortedSegmentMeanGradient", "UnsortedSegmentMeanGradient"],
        |_| Ok(Box::new(FnOp(|c: &mut OpContext<'_>| per_id_grad(c, true)))),
    );
    // (dY, DATA, Y, SEGMENT_IDS) -> dDATA.
    for (name, kind) in [
        ("SortedSegmentRangeSumGradient", Kind::RangeSum),
        ("SortedSegmentRangeMeanGradient", Kind::RangeMean),
        ("SortedSegmentRangeLogSumExpGradient", Kind::LogSumExp),
        ("SortedSegmentRangeLogMeanExpGradient", Kind::LogMeanExp),
        ("SortedSegmentRangeMaxGradient", Kind::RangeMax),
    ] {
        let f: Factory = match kind {
            Kind::RangeSum => |_| Ok(range_grad_op(Kind::RangeSum)),
            Kind::RangeMean => |_| Ok(range_grad_op(Kind::RangeMean)),
            Kind::LogSumExp => |_| Ok(range_grad_op(Kind::LogSumExp)),
            Kind::LogMeanExp => |_| Ok(range_grad_op(Kind::LogMeanExp)),
            _ => |_| Ok(range_grad_op(Kind::RangeMax)),
        };
        r.cpu(name, f);
    }
    r.cpu("LengthsMax", |_| Ok(Box::new(FnOp(lengths_max))));
    r.cpu("LengthsMaxWithMainInputAndForwardOutputGradient", |_| {
        Ok(Box::new(FnOp(lengths_max_grad)))
    });
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Sum,
    Mean,
    RangeSum,
    RangeMean,
    LogSumExp,
    LogMeanExp,
    RangeMax,
}

struct Segment {
    kind: Kind,
    sparse: bool,
    sorted: bool,
    num_segments: Option<usize>,
}

fn create(init: &OpInit<'_>, kind: Kind, sparse: bool, sorted: bool) -> Result<Box<dyn Operator>> {
    let n = init.args.int("num_segments", -1)?;
    let num_segments = if sorted || n < 0 {
        None
    } else {
        Some(usize::try_from(n).map_err(|_| err!(BadArgument: "num_segments {n} is too large"))?)
    };
    Ok(Box::new(Segment {
        kind,
        sparse,
        sorted,
        num_segments,
    }))
}

/// `(rows, block)` of DATA: its first dimension and the size of one row.
fn rows(t: &Tensor) -> Result<(usize, usize)> {
    let n = *t
        .dims()
        .first()
        .ok_or_else(|| err!(ShapeMismatch: "DATA must be at least 1-D"))?;
    Ok((n, t.numel().checked_div(n).unwrap_or(0)))
}

fn float_data(t: &Tensor) -> Result<&[f32]> {
    if t.dtype() != DataType::Float {
        bail!(DtypeMismatch: "DATA must be float, got {}", t.dtype().name());
    }
    t.as_slice::<f32>()
}

/// Integer ids of a 1-D index-like input, as non-negative `usize` each below `bound`.
fn ids(t: &Tensor, what: &str, bound: Option<usize>) -> Result<Vec<usize>> {
    if !matches!(t.dtype(), DataType::Int32 | DataType::Int64) {
        bail!(DtypeMismatch: "{what} must be int32 or int64, got {}", t.dtype().name());
    }
    if t.ndim() != 1 {
        bail!(ShapeMismatch: "{what} must be a vector, got shape {:?}", t.dims());
    }
    t.to_i64_vec()?
        .into_iter()
        .map(|v| match usize::try_from(v) {
            Ok(u) if bound.is_none_or(|b| u < b) => Ok(u),
            _ => match bound {
                Some(b) => Err(err!(
                    BadArgument: "{what} element is out of range: {v} (expected 0 <= id < {b})"
                )),
                None => Err(err!(BadArgument: "{what} must be non-negative, got {v}")),
            },
        })
        .collect()
}

/// The segment count of sorted or unsorted ids (checking the order of sorted ones).
fn segment_count(seg: &[usize], sorted: bool, fixed: Option<usize>) -> Result<usize> {
    if sorted {
        if seg.windows(2).any(|w| w[0] > w[1]) {
            bail!(BadArgument: "SEGMENT_IDS must be sorted (non-decreasing)");
        }
        return Ok(seg.last().map_or(0, |&s| s + 1));
    }
    if let Some(k) = fixed {
        if let Some(&s) = seg.iter().find(|&&s| s >= k) {
            bail!(BadArgument: "segment id {s} out of range for num_segments {k}");
        }
        return Ok(k);
    }
    Ok(seg.iter().max().map_or(0, |&s| s + 1))
}

fn out_dims(k: usize, data_dims: &[usize]) -> Vec<usize> {
    let mut d = Vec::with_capacity(data_dims.len().max(1));
    d.push(k);
    d.extend_from_slice(data_dims.get(1..).unwrap_or(&[]));
    d
}

impl Operator for Segment {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (ins, mut outs) = ctx.split();
        let data = ins.tensor(0)?;
        let (n_rows, block) = rows(data)?;
        let xs = float_data(data)?;
        let idx = if self.sparse {
            Some(ids(ins.tensor(1)?, "INDICES", Some(n_rows))?)
        } else {
            None
        };
        let seg_t = ins.tensor(if self.sparse { 2 } else { 1 })?;
        let seg = ids(seg_t, "SEGMENT_IDS", None)?;
        let n_items = idx.as_ref().map_or(n_rows, Vec::len);
        if seg.len() != n_items {
            bail!(
                ShapeMismatch: "SEGMENT_IDS must have the same length as the first dimension \
                 of {} ({} vs {n_items})",
                if self.sparse { "INDICES" } else { "DATA" },
                seg.len()
            );
        }
        let k = segment_count(&seg, self.sorted, self.num_segments)?;
        let od = out_dims(k, data.dims());
        let total = k
            .checked_mul(block)
            .ok_or_else(|| err!(BadArgument: "output of {k} segments is too large"))?;
        let mut y = try_vec(total, 0f32, "the output")?;
        let row_of = |i: usize| idx.as_ref().map_or(i, |v| v[i]);
        match self.kind {
            Kind::Sum | Kind::Mean => {
                let mut counts = try_vec(k, 0usize, "segment counts")?;
                for (i, &s) in seg.iter().enumerate() {
                    let r = row_of(i);
                    counts[s] += 1;
                    let src = &xs[r * block..(r + 1) * block];
                    for (o, v) in y[s * block..(s + 1) * block].iter_mut().zip(src) {
                        *o += v;
                    }
                }
                if self.kind == Kind::Mean {
                    for (s, &c) in counts.iter().enumerate() {
                        if c > 1 {
                            let inv = c as f32;
                            y[s * block..(s + 1) * block]
                                .iter_mut()
                                .for_each(|v| *v /= inv);
                        }
                    }
                }
            }
            kind => {
                for (s, (a, b)) in ranges(&seg, k).into_iter().enumerate() {
                    let out = &mut y[s * block..(s + 1) * block];
                    reduce_range(kind, &xs[a * block..b * block], b - a, out);
                }
            }
        }
        let out = outs.tensor(0)?;
        out.try_reset(DataType::Float, &od)?;
        out.as_mut_slice::<f32>()?.copy_from_slice(&y);
        Ok(())
    }
}

/// `[start, end)` rows of each of the `k` segments of sorted ids (empty ranges included).
fn ranges(seg: &[usize], k: usize) -> Vec<(usize, usize)> {
    let mut out = vec![(0, 0); k];
    let mut i = 0;
    for (s, slot) in out.iter_mut().enumerate() {
        let a = i;
        while i < seg.len() && seg[i] == s {
            i += 1;
        }
        *slot = (a, i);
    }
    out
}

/// Reduces `n` rows (`x`, row-major, `out.len()` columns) into `out` with a range reducer.
fn reduce_range(kind: Kind, x: &[f32], n: usize, out: &mut [f32]) {
    if n == 0 {
        out.fill(0.0);
        return;
    }
    let block = out.len();
    for (j, o) in out.iter_mut().enumerate() {
        let col = (0..n).map(|r| x[r * block + j]);
        *o = match kind {
            Kind::RangeMax => col.fold(f32::NEG_INFINITY, f32::max),
            Kind::RangeSum => col.sum(),
            Kind::RangeMean => col.sum::<f32>() / n as f32,
            Kind::LogSumExp | Kind::LogMeanExp => {
                let m = (0..n)
                    .map(|r| x[r * block + j])
                    .fold(f32::NEG_INFINITY, f32::max);
                let s: f32 = col.map(|v| (v - m).exp()).sum();
                let s = if kind == Kind::LogMeanExp {
                    s / n as f32
                } else {
                    s
                };
                m + s.ln()
            }
            Kind::Sum | Kind::Mean => col.sum(),
        };
    }
}

/// `Sorted/UnsortedSegment{Sum,Mean}Gradient`: (dY, SEGMENT_IDS) -> dX with one row per id,
/// `dY[id]` (divided by the id's count for the mean).
fn per_id_grad(ctx: &mut OpContext<'_>, mean: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let dy_t = ins.tensor(0)?;
    let (k, block) = rows(dy_t)?;
    let dy = float_data(dy_t)?;
    let seg = ids(ins.tensor(1)?, "SEGMENT_IDS", Some(k))?;
    let mut counts = try_vec(k, 0usize, "segment counts")?;
    for &s in &seg {
        counts[s] += 1;
    }
    let od = out_dims(seg.len(), dy_t.dims());
    let dx = outs.tensor(0)?.try_ensure::<f32>(&od)?;
    for (i, &s) in seg.iter().enumerate() {
        let scale = if mean { 1.0 / counts[s] as f32 } else { 1.0 };
        for (o, &g) in dx[i * block..(i + 1) * block]
            .iter_mut()
            .zip(&dy[s * block..(s + 1) * block])
        {
            *o = g * scale;
        }
    }
    Ok(())
}

fn range_grad_op(kind: Kind) -> Box<dyn Operator> {
    Box::new(FnOp(move |c: &mut OpContext<'_>| range_grad(c, kind)))
}

/// `SortedSegmentRange*Gradient`: (dY, DATA, Y, SEGMENT_IDS) -> dDATA.
fn range_grad(ctx: &mut OpContext<'_>, kind: Kind) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let dy_t = ins.tensor(0)?;
    let data = ins.tensor(1)?;
    let (n_rows, block) = rows(data)?;
    let xs = float_data(data)?;
    let dy = float_data(dy_t)?;
    let y = float_data(ins.tensor(2)?)?;
    let seg = ids(ins.tensor(3)?, "SEGMENT_IDS", None)?;
    if seg.len() != n_rows {
        bail!(
            ShapeMismatch: "SEGMENT_IDS has {} ids, DATA has {n_rows} rows",
            seg.len()
        );
    }
    let k = segment_count(&seg, true, None)?;
    let want = k.saturating_mul(block);
    if dy.len() != want || y.len() != want {
        bail!(
            ShapeMismatch: "dY and Y must have {k} rows of {block} values (got {} and {} values)",
            dy.len(),
            y.len()
        );
    }
    let dims = data.dims().to_vec();
    let dx = outs.tensor(0)?.try_ensure::<f32>(&dims)?;
    for (s, (a, b)) in ranges(&seg, k).into_iter().enumerate() {
        let n = (b - a) as f32;
        for r in a..b {
            for j in 0..block {
                let (x, g, yv) = (xs[r * block + j], dy[s * block + j], y[s * block + j]);
                dx[r * block + j] = match kind {
                    Kind::RangeSum | Kind::Sum => g,
                    Kind::RangeMean | Kind::Mean => g / n,
                    Kind::LogSumExp => g * (x - yv).exp(),
                    Kind::LogMeanExp => g * (x - yv).exp() / n,
                    Kind::RangeMax => {
                        if x == yv {
                            g
                        } else {
                            0.0
                        }
                    }
                };
            }
        }
    }
    Ok(())
}

/// Segment ranges of LENGTHS over `n_rows` rows; an error when they do not add up.
fn length_ranges(t: &Tensor, n_rows: usize) -> Result<Vec<(usize, usize)>> {
    let lens = ids(t, "LENGTHS", None)?;
    let mut out = Vec::with_capacity(lens.len());
    let mut at = 0usize;
    for l in lens {
        let end = at.checked_add(l).filter(|&e| e <= n_rows).ok_or_else(
            || err!(BadArgument: "the sum of LENGTHS exceeds the {n_rows} rows of DATA"),
        )?;
        out.push((at, end));
        at = end;
    }
    if at != n_rows {
        bail!(
            ShapeMismatch: "Your input seems to be incorrect: the sum of lengths values should be \
             the size of the indices tensor, but it appears not. ({at} vs {n_rows})"
        );
    }
    Ok(out)
}

/// `LengthsMax`: (DATA, LENGTHS) -> the max of each segment's rows (0 for an empty one).
fn lengths_max(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let data = ins.tensor(0)?;
    let (n_rows, block) = rows(data)?;
    let xs = float_data(data)?;
    let rs = length_ranges(ins.tensor(1)?, n_rows)?;
    let od = out_dims(rs.len(), data.dims());
    let y = outs.tensor(0)?.try_ensure::<f32>(&od)?;
    for (s, &(a, b)) in rs.iter().enumerate() {
        reduce_range(
            Kind::RangeMax,
            &xs[a * block..b * block],
            b - a,
            &mut y[s * block..(s + 1) * block],
        );
    }
    Ok(())
}

/// Gradient of `LengthsMax`: (Y, dY, LENGTHS, DATA) -> dDATA, dY at each segment's maxima.
fn lengths_max_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let y = float_data(ins.tensor(0)?)?;
    let dy = float_data(ins.tensor(1)?)?;
    let data = ins.tensor(3)?;
    let (n_rows, block) = rows(data)?;
    let xs = float_data(data)?;
    let rs = length_ranges(ins.tensor(2)?, n_rows)?;
    let want = rs.len().saturating_mul(block);
    if dy.len() != want || y.len() != want {
        bail!(ShapeMismatch: "Y and dY must have one row of {block} values per length");
    }
    let dims = data.dims().to_vec();
    let dx = outs.tensor(0)?.try_ensure::<f32>(&dims)?;
    for (s, &(a, b)) in rs.iter().enumerate() {
        for r in a..b {
            for j in 0..block {
                let o = s * block + j;
                dx[r * block + j] = if xs[r * block + j] == y[o] {
                    dy[o]
                } else {
                    0.0
                };
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn sorted_and_sparse_segments() {
        let ws = Workspace::new();
        ws.feed(
            "x",
            Tensor::from_vec(&[3, 1], vec![1.0f32, 2.0, 4.0]).unwrap(),
        );
        ws.feed("s", Tensor::from_vec(&[3], vec![0i32, 0, 2]).unwrap());
        ws.run_operator_once(&OperatorDef::new("SortedSegmentMean", ["x", "s"], ["y"]))
            .unwrap();
        assert_eq!(
            ws.fetch("y").unwrap().as_slice::<f32>().unwrap(),
            &[1.5, 0.0, 4.0]
        );
        ws.feed("i", Tensor::from_vec(&[2], vec![2i64, 2]).unwrap());
        ws.feed("u", Tensor::from_vec(&[2], vec![1i32, 0]).unwrap());
        let op = OperatorDef::new("SparseUnsortedSegmentSum", ["x", "i", "u"], ["z"]);
        ws.run_operator_once(&op).unwrap();
        assert_eq!(
            ws.fetch("z").unwrap().as_slice::<f32>().unwrap(),
            &[4.0, 4.0]
        );
        ws.feed("bad", Tensor::from_vec(&[3], vec![1i32, 0, 0]).unwrap());
        let e = ws
            .run_operator_once(&OperatorDef::new("SortedSegmentSum", ["x", "bad"], ["y"]))
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::BadArgument);
    }
}
