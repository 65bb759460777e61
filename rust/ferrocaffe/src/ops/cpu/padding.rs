//! Padding of sequences packed along dimension 0, and `OneHot`.
//!
//! A packed tensor holds segments one after another along its first dimension; `lengths`
//! (int32, input 1, optional: one segment spanning everything without it) gives each segment's
//! number of rows. A row is everything after dimension 0 (`block` values).
//! - `AddPadding` writes `padding_width` rows before and `end_padding_width` rows (default:
//!   `padding_width`) after each segment: zeros, or copies of `start_padding` (input 2) and
//!   `end_padding` (input 3, default `start_padding`). Output 1: the padded lengths.
//! - `RemovePadding` drops those rows again (output 1: the lengths without them).
//! - `GatherPadding` sums, over all segments, the start padding rows (output 0) and the end
//!   padding rows (output 1; without it both go to output 0): the gradient of the paddings.
//! - `OneHot`: int64 indices `[N]` and a scalar int64 size `D` -> float `[N, D]`.

use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, ensure, err, Result};

pub fn register(r: &mut Registry) {
    r.cpu("AddPadding", |i| create(i, Kind::Add));
    r.cpu("RemovePadding", |i| create(i, Kind::Remove));
    r.cpu("GatherPadding", |i| create(i, Kind::Gather));
    r.cpu("OneHot", |_| Ok(Box::new(FnOp(one_hot))));
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Add,
    Remove,
    Gather,
}

#[derive(Clone, Copy)]
struct Widths {
    start: usize,
    end: usize,
}

fn create(init: &OpInit<'_>, kind: Kind) -> Result<Box<dyn Operator>> {
    let start = init.args.int("padding_width", 1)?;
    let end = init.args.int("end_padding_width", -1)?;
    let Ok(start) = usize::try_from(start) else {
        bail!(op = init, BadArgument: "padding_width must be >= 0, got {start}");
    };
    let end = if end < 0 {
        start
    } else {
        usize::try_from(end).unwrap_or(start)
    };
    let w = Widths { start, end };
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| match kind {
        Kind::Add => add_padding(ctx, w),
        Kind::Remove => remove_padding(ctx, w),
        Kind::Gather => gather_padding(ctx, w),
    })))
}

fn padded_types(dt: DataType) -> Result<()> {
    match dt {
        DataType::Float | DataType::Double | DataType::Int32 | DataType::Int64 | DataType::Bool => {
            Ok(())
        }
        other => Err(err!(
            DtypeMismatch: "Unsupported input type {other}; this op supports: float, double, int, \
             int64, bool"
        )),
    }
}

/// The data's rows, row size in bytes and segment lengths (one segment of all rows when there
/// is no lengths input).
fn layout(ctx: &OpContext<'_>) -> Result<(usize, usize, Vec<usize>)> {
    let x = ctx.input(0)?;
    ensure!(!x.dims().is_empty(), ShapeMismatch: "the data must have at least 1 dimension");
    padded_types(x.dtype())?;
    let rows = x.dims()[0];
    let block = x.dims()[1..]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| err!(ShapeMismatch: "tensor size overflows"))?;
    let row_bytes = block
        .checked_mul(x.dtype().item_size())
        .ok_or_else(|| err!(ShapeMismatch: "tensor size overflows"))?;
    let lengths = if ctx.num_inputs() > 1 {
        let l = ctx.input(1)?;
        let mut out = Vec::with_capacity(l.numel());
        for &v in l.as_slice::<i32>()? {
            let Ok(v) = usize::try_from(v) else {
                bail!(BadArgument: "segment lengths must be >= 0, got {v}");
            };
            out.push(v);
        }
        out
    } else {
        vec![rows]
    };
    let total = lengths.iter().try_fold(0usize, |a, &l| a.checked_add(l));
    match total {
        Some(t) if t <= rows => {}
        _ => bail!(
            ShapeMismatch: "the lengths add up to more than the {rows} rows of the data ({} \
             segments)",
            lengths.len()
        ),
    }
    Ok((block, row_bytes, lengths))
}

fn lengths_output(ctx: &mut OpContext<'_>, lengths: &[usize], add: bool, pad: usize) -> Result<()> {
    if ctx.num_outputs() < 2 {
        return Ok(());
    }
    let mut v = Vec::with_capacity(lengths.len());
    for &l in lengths {
        let n = if add {
            l.checked_add(pad)
        } else {
            l.checked_sub(pad)
        };
        let n = n.and_then(|n| i32::try_from(n).ok()).ok_or_else(|| {
            err!(ShapeMismatch: "segment of length {l} cannot lose or gain {pad} rows of padding")
        })?;
        v.push(n);
    }
    let n = v.len();
    *ctx.output(1)? = Tensor::from_vec(&[n], v)?;
    Ok(())
}

fn add_padding(ctx: &mut OpContext<'_>, w: Widths) -> Result<()> {
    let (block, row_bytes, lengths) = layout(ctx)?;
    let pad = w.start + w.end;
    let x = ctx.input(0)?;
    let (dt, mut dims) = (x.dtype(), x.dims().to_vec());
    let start_pad: Option<Vec<u8>> = if ctx.num_inputs() > 2 {
        let p = ctx.input(2)?;
        ensure!(p.dtype() == dt, DtypeMismatch: "start_padding must have the data's type {dt}");
        ensure!(
            p.numel() == block,
            ShapeMismatch: "start_padding has {} values, a row of the data {block}",
            p.numel()
        );
        Some(p.bytes().to_vec())
    } else {
        None
    };
    let end_pad: Option<Vec<u8>> = if ctx.num_inputs() > 3 {
        let p = ctx.input(3)?;
        ensure!(p.dtype() == dt, DtypeMismatch: "end_padding must have the data's type {dt}");
        ensure!(
            p.numel() == block,
            ShapeMismatch: "end_padding has {} values, a row of the data {block}",
            p.numel()
        );
        Some(p.bytes().to_vec())
    } else {
        start_pad.clone()
    };
    let extra = pad
        .checked_mul(lengths.len())
        .ok_or_else(|| err!(ShapeMismatch: "padded size overflows"))?;
    dims[0] = dims[0]
        .checked_add(extra)
        .ok_or_else(|| err!(ShapeMismatch: "padded size overflows"))?;
    let src = x.bytes().to_vec();
    let mut out = vec![0u8; 0];
    let total_bytes = dims[0]
        .checked_mul(row_bytes)
        .ok_or_else(|| err!(ShapeMismatch: "padded size overflows"))?;
    out.try_reserve_exact(total_bytes).map_err(
        |_| err!(OutOfMemory: "cannot allocate {total_bytes} bytes for the padded data"),
    )?;
    let write_pad = |out: &mut Vec<u8>, p: &Option<Vec<u8>>, n: usize| {
        for _ in 0..n {
            match p {
                Some(row) => out.extend_from_slice(row),
                None => out.resize(out.len() + row_bytes, 0),
            }
        }
    };
    let mut at = 0usize;
    for &l in &lengths {
        write_pad(&mut out, &start_pad, w.start);
        out.extend_from_slice(&src[at * row_bytes..(at + l) * row_bytes]);
        at += l;
        write_pad(&mut out, &end_pad, w.end);
    }
    // Rows past the last segment are not part of any segment: Caffe2 leaves them out too.
    out.resize(total_bytes, 0);
    let t = ctx.output(0)?;
    t.try_reset(dt, &dims)?;
    t.bytes_mut().copy_from_slice(&out);
    lengths_output(ctx, &lengths, true, pad)
}

fn remove_padding(ctx: &mut OpContext<'_>, w: Widths) -> Result<()> {
    let (_, row_bytes, lengths) = layout(ctx)?;
    let pad = w.start + w.end;
    let x = ctx.input(0)?;
    let (dt, mut dims) = (x.dtype(), x.dims().to_vec());
    for &l in &lengths {
        ensure!(
            l >= pad,
            ShapeMismatch: "a segment of {l} rows is shorter than its padding ({pad} rows)"
        );
    }
    let removed = pad.saturating_mul(lengths.len());
    dims[0] = dims[0]
        .checked_sub(removed)
        .ok_or_else(|| err!(ShapeMismatch: "the data has fewer rows than the padding to remove"))?;
    let src = x.bytes();
    let mut out = Vec::new();
    out.try_reserve_exact(dims[0].saturating_mul(row_bytes))
        .map_err(|_| err!(OutOfMemory: "cannot allocate the unpadded data"))?;
    let mut at = 0usize;
    for &l in &lengths {
        out.extend_from_slice(&src[(at + w.start) * row_bytes..(at + l - w.end) * row_bytes]);
        at += l;
    }
    out.resize(dims[0] * row_bytes, 0);
    let t = ctx.output(0)?;
    t.try_reset(dt, &dims)?;
    t.bytes_mut().copy_from_slice(&out);
    lengths_output(ctx, &lengths, false, pad)
}

fn gather_padding(ctx: &mut OpContext<'_>, w: Widths) -> Result<()> {
    let (block, _, lengths) = layout(ctx)?;
    let pad = w.start + w.end;
    let x = ctx.input(0)?;
    let dt = x.dtype();
    let row_dims = x.dims()[1..].to_vec();
    for &l in &lengths {
        ensure!(
            l >= pad,
            ShapeMismatch: "a segment of {l} rows is shorter than its padding ({pad} rows)"
        );
    }
    let sums = |vals: &dyn Fn(usize) -> f64| -> (Vec<f64>, Vec<f64>) {
        let (mut s, mut e) = (vec![0f64; block], vec![0f64; block]);
        let mut at = 0usize;
        for &l in &lengths {
            for r in 0..w.start {
                for (k, v) in s.iter_mut().enumerate() {
                    *v += vals((at + r) * block + k);
                }
            }
            for r in l - w.end..l {
                for (k, v) in e.iter_mut().enumerate() {
                    *v += vals((at + r) * block + k);
                }
            }
            at += l;
        }
        (s, e)
    };
    let (s, e) = match dt {
        DataType::Float => {
            let v = x.as_slice::<f32>()?;
            sums(&|i| f64::from(v[i]))
        }
        DataType::Double => {
            let v = x.as_slice::<f64>()?;
            sums(&|i| v[i])
        }
        DataType::Int32 => {
            let v = x.as_slice::<i32>()?;
            sums(&|i| f64::from(v[i]))
        }
        other => bail!(
            DtypeMismatch: "Unsupported input type {other}; GatherPadding supports: float, \
             double, int"
        ),
    };
    let two = ctx.num_outputs() > 1;
    let (first, second) = if two {
        (s, Some(e))
    } else {
        (s.iter().zip(&e).map(|(a, b)| a + b).collect(), None)
    };
    let write = |t: &mut Tensor, vals: &[f64]| -> Result<()> {
        match dt {
            DataType::Float => {
                *t = Tensor::from_vec(&row_dims, vals.iter().map(|&v| v as f32).collect())?
            }
            DataType::Double => *t = Tensor::from_vec(&row_dims, vals.to_vec())?,
            _ => *t = Tensor::from_vec(&row_dims, vals.iter().map(|&v| v as i32).collect())?,
        }
        Ok(())
    };
    write(ctx.output(0)?, &first)?;
    if let Some(e) = second {
        write(ctx.output(1)?, &e)?;
    }
    Ok(())
}

fn one_hot(ctx: &mut OpContext<'_>) -> Result<()> {
    let idx = ctx.input(0)?;
    ensure!(
        idx.dims().len() == 1,
        ShapeMismatch: "indices input must be 1D tensor of data type int64_t"
    );
    let indices = idx.as_slice::<i64>()?.to_vec();
    let size_t = ctx.input(1)?;
    ensure!(
        size_t.numel() == 1,
        ShapeMismatch: "index_size_tensor input must be scalar of data type int64_t"
    );
    let size = size_t.as_slice::<i64>()?[0];
    let Ok(size) = usize::try_from(size) else {
        bail!(BadArgument: "index size must be >= 0, got {size}");
    };
    let n = indices.len();
    let total = n
        .checked_mul(size)
        .ok_or_else(|| err!(ShapeMismatch: "one-hot size {n} x {size} overflows"))?;
    let mut out = Vec::new();
    out.try_reserve_exact(total)
        .map_err(|_| err!(OutOfMemory: "cannot allocate a {n} x {size} one-hot matrix"))?;
    out.resize(total, 0f32);
    for (row, &i) in indices.iter().enumerate() {
        let Some(col) = usize::try_from(i).ok().filter(|&c| c < size) else {
            bail!(BadArgument: "Index {i} is out of bounds for OneHot of size {size}");
        };
        out[row * size + col] = 1.0;
    }
    *ctx.output(0)? = Tensor::from_vec(&[n, size], out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;
    use crate::Result;

    fn op(t: &str, ins: &[&str], outs: &[&str], args: Vec<Argument>) -> OperatorDef {
        let mut o = OperatorDef::new(t, ins.iter().copied(), outs.iter().copied());
        o.arg = args;
        o
    }

    #[test]
    fn add_then_remove_padding_round_trips() -> Result<()> {
        let ws = Workspace::new();
        ws.feed(
            "x",
            Tensor::from_vec(&[3, 2], vec![1f32, 2., 3., 4., 5., 6.])?,
        );
        ws.feed("l", Tensor::from_vec(&[2], vec![1i32, 2])?);
        ws.feed("p", Tensor::from_vec(&[2], vec![9f32, 9.])?);
        ws.run_operator_once(&op("AddPadding", &["x", "l", "p"], &["y", "yl"], vec![]))?;
        let y = ws.fetch("y")?;
        assert_eq!(y.dims(), &[7, 2]);
        assert_eq!(
            y.as_slice::<f32>()?,
            &[9., 9., 1., 2., 9., 9., 9., 9., 3., 4., 5., 6., 9., 9.]
        );
        assert_eq!(ws.fetch("yl")?.as_slice::<i32>()?, &[3, 4]);
        ws.run_operator_once(&op("RemovePadding", &["y", "yl"], &["z", "zl"], vec![]))?;
        assert_eq!(ws.fetch("z")?.as_slice::<f32>()?, &[1., 2., 3., 4., 5., 6.]);
        assert_eq!(ws.fetch("zl")?.as_slice::<i32>()?, &[1, 2]);
        ws.run_operator_once(&op("GatherPadding", &["y", "yl"], &["s", "e"], vec![]))?;
        assert_eq!(ws.fetch("s")?.as_slice::<f32>()?, &[18., 18.]);
        assert_eq!(ws.fetch("e")?.as_slice::<f32>()?, &[18., 18.]);
        Ok(())
    }

    #[test]
    fn zero_padding_without_lengths_and_errors() -> Result<()> {
        let ws = Workspace::new();
        ws.feed("x", Tensor::from_vec(&[2], vec![1i64, 2])?);
        let args = vec![
            Argument::int("padding_width", 2),
            Argument::int("end_padding_width", 0),
        ];
        ws.run_operator_once(&op("AddPadding", &["x"], &["y"], args))?;
        assert_eq!(ws.fetch("y")?.as_slice::<i64>()?, &[0, 0, 1, 2]);
        ws.feed("l", Tensor::from_vec(&[1], vec![1i32])?);
        assert!(ws
            .run_operator_once(&op("RemovePadding", &["x", "l"], &["z"], vec![]))
            .is_err());
        ws.feed("l", Tensor::from_vec(&[2], vec![2i32, 2])?);
        assert!(ws
            .run_operator_once(&op("AddPadding", &["x", "l"], &["z"], vec![]))
            .is_err());
        Ok(())
    }

    #[test]
    fn one_hot_rows_and_bounds() -> Result<()> {
        let ws = Workspace::new();
        ws.feed("i", Tensor::from_vec(&[3], vec![2i64, 0, 1])?);
        ws.feed("n", Tensor::from_vec(&[1], vec![3i64])?);
        ws.run_operator_once(&op("OneHot", &["i", "n"], &["y"], vec![]))?;
        let y = ws.fetch("y")?;
        assert_eq!(y.dims(), &[3, 3]);
        assert_eq!(y.as_slice::<f32>()?, &[0., 0., 1., 1., 0., 0., 0., 1., 0.]);
        ws.feed("i", Tensor::from_vec(&[1], vec![3i64])?);
        assert!(ws
            .run_operator_once(&op("OneHot", &["i", "n"], &["y"], vec![]))
            .is_err());
        Ok(())
    }
}
