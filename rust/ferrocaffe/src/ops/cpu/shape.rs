//! Shape ops: Reshape, Flatten, FlattenToVec, ResizeLike, ExpandDims, Squeeze, Shape,
//! Size, Transpose, NCHW2NHWC, NHWC2NCHW, Concat / DepthConcat, Split / DepthSplit, Slice and
//! SliceGradient, Tile and TileGradient.
//!
//! Ops that only change the shape share the input's buffer copy-on-write (no copy).

use crate::blas::transpose_f32;
use crate::dispatch;
use crate::error::{Error, Result};
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Element};
use crate::workspace::Blob;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Reshape", create_reshape);
    r.cpu("Flatten", |i| {
        let axis = i.args.int("axis", 1)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            let d = ctx.input(0)?.dims().to_vec();
            let a = canonical(axis, d.len(), true)?;
            let shape = vec![d[..a].iter().product(), d[a..].iter().product()];
            reshaped(ctx, &shape)
        })))
    });
    r.cpu("FlattenToVec", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let n = ctx.input(0)?.numel();
            reshaped(ctx, &[n])
        })))
    });
    r.cpu("ResizeLike", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let like = ctx.input(1)?.dims().to_vec();
            if like.iter().product::<usize>() != ctx.input(0)?.numel() {
                bail!(
                    op = ctx,
                    ShapeMismatch: "ResizeLike: X has {} values, the reference shape {like:?} \
                     needs {}",
                    ctx.input(0)?.numel(),
                    like.iter().product::<usize>()
                );
            }
            reshaped(ctx, &like)
        })))
    });
    r.cpu("ExpandDims", |i| {
        let dims = sorted_dims(i)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            let mut d = ctx.input(0)?.dims().to_vec();
            if let Some(&last) = dims.last() {
                if d.len() + dims.len() < last as usize + 1 {
                    bail!(
                        op = ctx,
                        ShapeMismatch: "Input needs at least {} dimensions given `dims`.",
                        last as usize + 1 - dims.len()
                    );
                }
            }
            for &k in &dims {
                d.insert(k as usize, 1);
            }
            reshaped(ctx, &d)
        })))
    });
    r.cpu("Squeeze", |i| {
        let dims = sorted_dims(i)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            let d = ctx.input(0)?.dims().to_vec();
            let mut out = Vec::new();
            for (k, &v) in d.iter().enumerate() {
                if dims.contains(&(k as i64)) {
                    if v != 1 {
                        bail!(
                            op = ctx,
                            ShapeMismatch: "Dimension {k} of input must be 1 instead of {v}."
                        );
                    }
                } else {
                    out.push(v);
                }
            }
            if let Some(&last) = dims.last() {
                if last as usize >= d.len() {
                    bail!(op = ctx, BadArgument: "dims {dims:?} out of range for {d:?}");
                }
            }
            reshaped(ctx, &out)
        })))
    });
    r.cpu("Shape", |i| {
        let axes = i.args.ints("axes");
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            let d = ctx.input(0)?.dims().to_vec();
            let vals: Vec<i64> = if axes.is_empty() {
                d.iter().map(|&v| v as i64).collect()
            } else {
                axes.iter()
                    .map(|&a| canonical(a, d.len(), false).map(|k| d[k] as i64))
                    .collect::<Result<_>>()?
            };
            ctx.output(0)?
                .ensure::<i64>(&[vals.len()])
                .copy_from_slice(&vals);
            Ok(())
        })))
    });
    // Number of elements of X, as an int64 scalar.
    r.cpu("Size", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let n = ctx.input(0)?.numel() as i64;
            ctx.output(0)?.ensure::<i64>(&[])[0] = n;
            Ok(())
        })))
    });
    r.cpu("Transpose", create_transpose);
    r.cpu("SplitByLengths", create_split_by_lengths);
    r.cpu("LengthsToShape", |_| Ok(Box::new(FnOp(lengths_to_shape))));
    r.cpu("NCHW2NHWC", |_| Ok(order_switch(true)));
    r.cpu("NHWC2NCHW", |_| Ok(order_switch(false)));
    r.cpu_many(&["Concat", "DepthConcat"], create_concat);
    r.cpu_many(&["Split", "DepthSplit"], create_split);
    r.cpu("Slice", |i| create_slice(i, false));
    r.cpu("SliceGradient", |i| create_slice(i, true));
    r.cpu("Tile", |i| create_tile(i, false));
    r.cpu("TileGradient", |i| create_tile(i, true));
}

/// `axis` counted from the back when negative; `inclusive` allows `axis == nd`.
fn canonical(axis: i64, nd: usize, inclusive: bool) -> Result<usize> {
    let a = if axis < 0 { axis + nd as i64 } else { axis };
    let hi = if inclusive { nd as i64 } else { nd as i64 - 1 };
    if a < 0 || a > hi {
        bail!(BadArgument: "axis {axis} out of range for {nd} dimensions");
    }
    Ok(a as usize)
}

fn sorted_dims(init: &OpInit<'_>) -> Result<Vec<i64>> {
    let mut d = init.args.ints("dims");
    if d.is_empty() {
        bail!(op = init, BadArgument: "Argument `dims` is missing.");
    }
    d.sort_unstable();
    d.dedup();
    if d[0] < 0 {
        bail!(op = init, BadArgument: "Negative dims are not supported");
    }
    Ok(d)
}

/// Output 0 = input 0 with another shape (shares its data copy-on-write).
fn reshaped(ctx: &mut OpContext<'_>, dims: &[usize]) -> Result<()> {
    if ctx.is_inplace(0, 0) {
        return ctx.output(0)?.reshape(dims);
    }
    let (ins, mut outs) = ctx.split();
    let mut t = ins.tensor(0)?.clone();
    t.reshape(dims)?;
    *outs.blob(0)? = Blob::Tensor(t);
    Ok(())
}

/// Caffe2's Reshape rule: a 0 copies the input's dim at that index (when the input is not
/// empty and has that dim; otherwise it stays 0), one -1 takes what is left (0 for an empty
/// input).
fn new_shape(spec: &[i64], old: &[usize], total: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(spec.len());
    let mut unknown = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            -1 => {
                if unknown.is_some() {
                    bail!(BadArgument: "Argument `shape` has more than one missing dimension.");
                }
                unknown = Some(i);
                out.push(1);
            }
            0 if total != 0 => out.push(old.get(i).copied().unwrap_or(0)),
            s if s >= 0 => out.push(
                usize::try_from(s)
                    .map_err(|_| err!(BadArgument: "Dimension {s} in the new shape is invalid"))?,
            ),
            s => bail!(BadArgument: "Dimension {s} in the new shape is invalid"),
        }
    }
    let known = out
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| err!(ShapeMismatch: "Argument `shape` {spec:?} is too large"))?;
    if known == 0 && total != 0 {
        bail!(
            ShapeMismatch: "Can not reshape a non-zero size ({total}) tensor to zero size."
        );
    }
    match unknown {
        Some(i) if total == 0 => out[i] = 0,
        Some(i) => {
            if !total.is_multiple_of(known) {
                bail!(
                    ShapeMismatch: "Argument `shape` does not agree with the input data. ({total} \
                     vs {known})"
                );
            }
            out[i] = total / known;
        }
        None if known != total => bail!(
            ShapeMismatch: "Argument `shape` does not agree with the input data. ({total} != \
             {known})"
        ),
        None => {}
    }
    Ok(out)
}

fn create_reshape(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let arg = init.args.has("shape").then(|| init.args.ints("shape"));
    if arg.is_some() && init.num_inputs() == 2 {
        bail!(
            op = init,
            BadArgument: "New shape is specified by the input blob, do not pass in the argument \
             `shape`."
        );
    }
    if arg.is_none() && init.num_inputs() < 2 {
        bail!(op = init, BadArgument: "Argument `shape` is missing.");
    }
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let spec = match &arg {
            Some(s) => s.clone(),
            None => ctx.input(1)?.to_i64_vec()?,
        };
        let old = ctx.input(0)?.dims().to_vec();
        let shape = new_shape(&spec, &old, old.iter().product())?;
        reshaped(ctx, &shape)?;
        if ctx.num_outputs() > 1 {
            let o: Vec<i64> = old.iter().map(|&v| v as i64).collect();
            ctx.output(1)?.ensure::<i64>(&[o.len()]).copy_from_slice(&o);
        }
        Ok(())
    })))
}

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * dims[k + 1];
    }
    s
}

fn permute<T: Element>(x: &[T], dims: &[usize], perm: &[usize], out: &mut [T]) {
    let in_strides = strides(dims);
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let src: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let nd = out_dims.len();
    if nd == 0 || out.is_empty() {
        if let (Some(o), Some(v)) = (out.first_mut(), x.first()) {
            *o = *v;
        }
        return;
    }
    let mut idx = vec![0usize; nd];
    let mut off = 0usize;
    let inner = out_dims[nd - 1];
    let step = src[nd - 1];
    let mut k = 0;
    while k < out.len() {
        for j in 0..inner {
            out[k + j] = x[off + j * step];
        }
        k += inner;
        for d in (0..nd - 1).rev() {
            idx[d] += 1;
            off += src[d];
            if idx[d] < out_dims[d] {
                break;
            }
            off -= src[d] * idx[d];
            idx[d] = 0;
        }
    }
}

/// `(a, b, c)` when permuting `dims` by `perm` is the same as taking an `(a, b, c)` array to
/// `(a, c, b)` (NCHW2NHWC: `(N, C, H * W)`): the axes that stay neighbours, in order, merge.
fn as_batched_transpose(dims: &[usize], perm: &[usize]) -> Option<(usize, usize, usize)> {
    // Runs of input axes `start..end` that stay together, in output order.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &p in perm {
        match runs.last_mut() {
            Some(run) if run.1 == p => run.1 += 1,
            _ => runs.push((p, p + 1)),
        }
    }
    let size = |(lo, hi): (usize, usize)| dims[lo..hi].iter().product::<usize>();
    match *runs.as_slice() {
        // (b, c) -> (c, b)
        [r0, r1] if r0.0 > r1.0 => Some((1, size(r1), size(r0))),
        // (a, b, c) -> (a, c, b)
        [r0, r1, r2] if r0.0 < r2.0 && r2.0 < r1.0 => Some((size(r0), size(r2), size(r1))),
        _ => None,
    }
}

fn transpose(ctx: &mut OpContext<'_>, perm: &[usize]) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let dims = x.dims().to_vec();
    if perm.len() != dims.len() {
        bail!(
            BadArgument: "Axes should be a permutation of 0 to ndim: {perm:?} for a tensor of \
             shape {dims:?}"
        );
    }
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let y = outs.tensor(0)?;
    if let (Some((a, b, c)), DataType::Float) = (as_batched_transpose(&dims, perm), x.dtype()) {
        let xs = x.as_slice::<f32>()?;
        let ys = y.ensure::<f32>(&out_dims);
        let m = b.saturating_mul(c);
        if m > 0 {
            for (xb, yb) in xs.chunks_exact(m).zip(ys.chunks_exact_mut(m)).take(a) {
                transpose_f32(xb, b, c, yb);
            }
        }
        return Ok(());
    }
    dispatch!(x.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64,
        Bool => bool, Uint8 => u8, Int8 => i8, Int16 => i16, Uint16 => u16, Float16 => half::f16], |T| {
        let xs = x.as_slice::<T>()?;
        permute(xs, &dims, perm, y.ensure::<T>(&out_dims));
        Ok(())
    })
}

/// `LengthsToShape`: int32 lengths that must all be equal, `[n, length]` out (`[0, 0]` for no
/// lengths).
fn lengths_to_shape(ctx: &mut OpContext<'_>) -> Result<()> {
    let l = ctx.input(0)?;
    if l.ndim() != 1 {
        bail!(ShapeMismatch: "Input must be a vector.");
    }
    let v = l.as_slice::<i32>()?;
    let first = v.first().copied().unwrap_or(0);
    if v.iter().any(|&x| x != first) {
        bail!(BadArgument: "All elements of input must be same ");
    }
    let n = i32::try_from(v.len())
        .map_err(|_| err!(ShapeMismatch: "{} lengths do not fit an int", v.len()))?;
    ctx.output(0)?
        .ensure::<i32>(&[2])
        .copy_from_slice(&[n, first]);
    Ok(())
}

/// `NCHW2NHWC` (`to_nhwc`) or `NHWC2NCHW`: moves the channel axis of an input of 3 or more
/// dims (N, C, any number of spatial axes) last or back to axis 1.
fn order_switch(to_nhwc: bool) -> Box<dyn Operator> {
    Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let nd = ctx.input(0)?.ndim();
        if nd < 3 {
            bail!(
                op = ctx,
                ShapeMismatch: "The input must be at least 3-d (N, C and a spatial axis), got {:?}",
                ctx.input(0)?.dims()
            );
        }
        let perm: Vec<usize> = if to_nhwc {
            std::iter::once(0)
                .chain(2..nd)
                .chain(std::iter::once(1))
                .collect()
        } else {
            [0, nd - 1].into_iter().chain(1..nd - 1).collect()
        };
        transpose(ctx, &perm)
    }))
}

fn create_transpose(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axes = init.args.ints("axes");
    if !axes.is_empty() {
        let mut s = axes.clone();
        s.sort_unstable();
        if s.iter().enumerate().any(|(i, &v)| v != i as i64) {
            bail!(op = init, BadArgument: "Axes should be a permutation of 0 to ndim.");
        }
    }
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let nd = ctx.input(0)?.ndim();
        let perm: Vec<usize> = if axes.is_empty() {
            (0..nd).rev().collect()
        } else {
            axes.iter().map(|&a| a as usize).collect()
        };
        transpose(ctx, &perm)
    })))
}

fn order_axis(init: &OpInit<'_>) -> Result<i64> {
    if init.args.has("axis") {
        return init.args.int("axis", 1);
    }
    let order = init.args.string("order", "NCHW")?;
    Ok(if order == "NHWC" { 3 } else { 1 })
}

fn create_concat(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axis = order_axis(init)?;
    let add_axis = init.args.bool("add_axis", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n = ctx.num_inputs();
        let (ins, mut outs) = ctx.split();
        let first = ins.tensor(0)?;
        let d0 = first.dims().to_vec();
        let nd = d0.len() + add_axis as usize;
        let ax = canonical(axis, nd, false)?;
        let mut sizes = Vec::with_capacity(n);
        for i in 0..n {
            let t = ins.tensor(i)?;
            if t.dtype() != first.dtype() {
                bail!(DtypeMismatch: "input {i} is {}, input 0 is {}", t.dtype(), first.dtype());
            }
            let d = t.dims();
            if d.len() != d0.len() {
                bail!(ShapeMismatch: "input {i} has shape {d:?}, input 0 has {d0:?}");
            }
            for j in 0..d.len() {
                if (add_axis || j != ax) && d[j] != d0[j] {
                    bail!(
                        ShapeMismatch: "Expect dimension = {} got {} at axis = {j} for input: \
                         {i}. The input tensors can only have different dimensions when arg \
                         'add_axis' = 0 and along the axis = {ax} <{d0:?}> vs <{d:?}>.",
                        d0[j],
                        d[j]
                    );
                }
            }
            sizes.push(if add_axis { 1 } else { d[ax] });
        }
        let mut out_dims = d0.clone();
        if add_axis {
            out_dims.insert(ax, n);
        } else {
            out_dims[ax] = sizes
                .iter()
                .try_fold(0usize, |a, &s| a.checked_add(s))
                .ok_or_else(|| err!(BadArgument: "the concatenated dimension overflows"))?;
        }
        let outer: usize = out_dims[..ax].iter().product();
        let inner: usize = out_dims[ax + 1..].iter().product();
        let total_axis: usize = out_dims[ax];
        dispatch!(first.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64,
            Bool => bool, Uint8 => u8, Int8 => i8, Int16 => i16, Uint16 => u16, Float16 => half::f16], |T| {
            let y = outs.tensor(0)?.try_ensure::<T>(&out_dims)?;
            let mut off = 0;
            for (i, &s) in sizes.iter().enumerate() {
                let xs = ins.tensor(i)?.as_slice::<T>()?;
                for o in 0..outer {
                    let dst = (o * total_axis + off) * inner;
                    y[dst..dst + s * inner].copy_from_slice(&xs[o * s * inner..(o + 1) * s * inner]);
                }
                off += s;
            }
            Ok::<(), Error>(())
        })?;
        if outs.len() > 1 {
            let info: Vec<i32> = sizes.iter().map(|&s| s as i32).collect();
            outs.tensor(1)?.ensure::<i32>(&[n]).copy_from_slice(&info);
        }
        Ok(())
    })))
}

fn create_split(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axis = order_axis(init)?;
    let add_axis = init.args.bool("add_axis", false)?;
    let split = init.args.ints("split");
    if !split.is_empty() && init.num_inputs() == 2 {
        bail!(
            op = init,
            BadArgument: "If you set split with an input blob, do not pass in split in the \
             argument."
        );
    }
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n_out = ctx.num_outputs();
        let sizes_in = if ctx.num_inputs() == 2 {
            Some(ctx.input(1)?.to_i64_vec()?)
        } else {
            None
        };
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let d = x.dims().to_vec();
        let ax = canonical(axis, d.len(), false)?;
        let dim = d[ax];
        let sizes: Vec<usize> = match sizes_in
            .or_else(|| (!split.is_empty()).then(|| split.clone()))
        {
            Some(s) => {
                if s.len() != n_out {
                    bail!(BadArgument: "split has {} sizes for {n_out} outputs", s.len());
                }
                s.iter().map(|&v| v.max(0) as usize).collect()
            }
            None if add_axis => vec![1; n_out],
            None => {
                if n_out == 0 || dim % n_out != 0 {
                    bail!(
                        ShapeMismatch: "If you did not specify split explicitly, the number of \
                         input channels ({dim}) should be divisible by the output size ({n_out})."
                    );
                }
                vec![dim / n_out; n_out]
            }
        };
        let total = sizes
            .iter()
            .try_fold(0usize, |a, &s| a.checked_add(s))
            .ok_or_else(|| err!(BadArgument: "the sum of the split sizes overflows"))?;
        if total != dim {
            bail!(
                ShapeMismatch: "Sum of split dimensions do not match: should be {dim}, got {total}"
            );
        }
        write_split(x, ax, &sizes, add_axis, &mut outs)
    })))
}

/// Writes the parts of `x` along axis `ax` of `sizes` (which add up to that dim) into the
/// outputs, without that axis when `add_axis`.
fn write_split(
    x: &crate::tensor::Tensor,
    ax: usize,
    sizes: &[usize],
    add_axis: bool,
    outs: &mut crate::ops::operator::Outputs<'_, '_>,
) -> Result<()> {
    let d = x.dims().to_vec();
    let dim = d[ax];
    let outer: usize = d[..ax].iter().product();
    let inner: usize = d[ax + 1..].iter().product();
    dispatch!(x.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64,
        Bool => bool, Uint8 => u8, Int8 => i8, Int16 => i16, Uint16 => u16, Float16 => half::f16], |T| {
        let xs = x.as_slice::<T>()?;
        let mut off = 0;
        for (j, &s) in sizes.iter().enumerate() {
            let mut od = d.clone();
            if add_axis {
                od.remove(ax);
            } else {
                od[ax] = s;
            }
            let y = outs.tensor(j)?.try_ensure::<T>(&od)?;
            for o in 0..outer {
                let src = (o * dim + off) * inner;
                y[o * s * inner..(o + 1) * s * inner].copy_from_slice(&xs[src..src + s * inner]);
            }
            off += s;
        }
        Ok(())
    })
}

/// `SplitByLengths`: the lengths (input 1) fall into as many equal runs as there are outputs;
/// output `i` takes the sum of run `i` along `axis` (times `input dim / sum of lengths` with
/// `use_scaling_lengths`).
fn create_split_by_lengths(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    // Unlike Split, the axis does not follow `order`: 0 unless given.
    let axis = init.args.int("axis", 0)?;
    let scaling = init.args.bool("use_scaling_lengths", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n_out = ctx.num_outputs();
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let lengths = ins.tensor(1)?.to_i64_vec()?;
        if n_out == 0 || lengths.len() % n_out != 0 {
            bail!(
                BadArgument: "len(Lengths) {} should be divisible by OutputSize() {n_out}.",
                lengths.len()
            );
        }
        if x.ndim() == 0 {
            bail!(ShapeMismatch: "Axis not in input ndim range.");
        }
        let ax = canonical(axis, x.ndim(), false)?;
        let dim = x.dims()[ax];
        let mut sum = 0usize;
        for &l in &lengths {
            let l = usize::try_from(l)
                .map_err(|_| err!(BadArgument: "lengths must not be negative, got {l}"))?;
            sum = sum
                .checked_add(l)
                .ok_or_else(|| err!(BadArgument: "the lengths add up past any size"))?;
        }
        let factor = if scaling {
            if sum == 0 || dim % sum != 0 {
                bail!(ShapeMismatch: "Input channels {dim} should be divisible by {sum}");
            }
            dim / sum
        } else {
            if sum != dim {
                bail!(
                    ShapeMismatch: "Sum of split dimensions do not match: should be {dim}, got \
                     {sum}"
                );
            }
            1
        };
        let per = lengths.len() / n_out;
        // Each run adds up to at most `sum`, and `factor * sum == dim`.
        let sizes: Vec<usize> = lengths
            .chunks(per.max(1))
            .map(|run| run.iter().map(|&l| l as usize).sum::<usize>() * factor)
            .chain(std::iter::repeat(0))
            .take(n_out)
            .collect();
        write_split(x, ax, &sizes, false, &mut outs)
    })))
}

/// Per-dim (start, len) of a slice of `dims`.
fn slice_ranges(dims: &[usize], starts: &[i64], ends: &[i64]) -> Result<Vec<(usize, usize)>> {
    if starts.len() != ends.len() {
        bail!(BadArgument: "starts_.size() == ends_.size(). {} vs {}", starts.len(), ends.len());
    }
    if starts.len() > dims.len() {
        bail!(BadArgument: "starts has {} values for a {}-d input", starts.len(), dims.len());
    }
    let mut r = Vec::with_capacity(dims.len());
    for (k, &dim) in dims.iter().enumerate() {
        if k >= starts.len() {
            r.push((0, dim));
            continue;
        }
        let d = dim as i64;
        let s = if starts[k] < 0 {
            d + 1 + starts[k]
        } else {
            starts[k]
        };
        let e = if ends[k] < 0 {
            d + 1 + ends[k]
        } else {
            ends[k]
        };
        if s < 0 || s > d || e < s || e > d {
            bail!(
                BadArgument: "Slice of dimension {k}: start {} and end {} out of range for size \
                 {d}",
                starts[k],
                ends[k]
            );
        }
        r.push((s as usize, (e - s) as usize));
    }
    Ok(r)
}

/// Calls `f(offset_in_full, offset_in_slice, run_len)` for each contiguous run of the slice.
fn for_each_run(dims: &[usize], ranges: &[(usize, usize)], mut f: impl FnMut(usize, usize, usize)) {
    let nd = dims.len();
    if nd == 0 {
        f(0, 0, 1);
        return;
    }
    let st = strides(dims);
    let out_dims: Vec<usize> = ranges.iter().map(|r| r.1).collect();
    let n: usize = out_dims.iter().product();
    if n == 0 {
        return;
    }
    let run = out_dims[nd - 1];
    let mut idx = vec![0usize; nd];
    let mut k = 0;
    while k < n {
        let full: usize = (0..nd).map(|d| (ranges[d].0 + idx[d]) * st[d]).sum();
        f(full, k, run);
        k += run;
        for d in (0..nd - 1).rev() {
            idx[d] += 1;
            if idx[d] < out_dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn create_slice(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let arg_starts = init.args.has("starts").then(|| init.args.ints("starts"));
    let arg_ends = init.args.has("ends").then(|| init.args.ints("ends"));
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let from_inputs = arg_starts.is_none();
        let (starts, ends) = if from_inputs {
            (ctx.input(1)?.to_i64_vec()?, ctx.input(2)?.to_i64_vec()?)
        } else {
            (
                arg_starts.clone().unwrap_or_default(),
                arg_ends.clone().unwrap_or_default(),
            )
        };
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let dims = x.dims().to_vec();
        let ranges = slice_ranges(&dims, &starts, &ends)?;
        let out_dims: Vec<usize> = ranges.iter().map(|r| r.1).collect();
        if gradient {
            let dy = ins.tensor(if from_inputs { 3 } else { 1 })?;
            if dy.dims() != out_dims.as_slice() {
                bail!(ShapeMismatch: "dY has shape {:?}, the slice has {out_dims:?}", dy.dims());
            }
            let g = dy.as_slice::<f32>()?;
            let dx = outs.tensor(0)?.ensure::<f32>(&dims);
            dx.fill(0.0);
            for_each_run(&dims, &ranges, |full, part, len| {
                dx[full..full + len].copy_from_slice(&g[part..part + len])
            });
            return Ok(());
        }
        dispatch!(x.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64,
            Bool => bool, Uint8 => u8, Int8 => i8, Int16 => i16, Uint16 => u16, Float16 => half::f16], |T| {
            let xs = x.as_slice::<T>()?;
            let y = outs.tensor(0)?.ensure::<T>(&out_dims);
            for_each_run(&dims, &ranges, |full, part, len| {
                y[part..part + len].copy_from_slice(&xs[full..full + len])
            });
            Ok(())
        })
    })))
}

fn create_tile(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let tiles_arg = init.args.int("tiles", 1)?;
    let axis_arg = init.args.int("axis", 0)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n_in = ctx.num_inputs();
        let tiles = if n_in > 1 {
            ctx.input(1)?.to_i64_vec()?.first().copied().unwrap_or(1)
        } else {
            tiles_arg
        };
        let axis = if n_in > 2 {
            ctx.input(2)?.to_i64_vec()?.first().copied().unwrap_or(0)
        } else {
            axis_arg
        };
        let tiles = usize::try_from(tiles)
            .map_err(|_| err!(BadArgument: "tiles must not be negative, got {tiles}"))?;
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let d = x.dims().to_vec();
        let ax = canonical(axis, d.len(), false)?;
        let outer: usize = d[..ax].iter().product();
        let block: usize = d[ax..].iter().product();
        if gradient {
            // x is dY (tiled); dX sums the tiles.
            if d[ax] % tiles.max(1) != 0 {
                bail!(ShapeMismatch: "dY dimension {} is not a multiple of tiles {tiles}", d[ax]);
            }
            let mut od = d.clone();
            od[ax] /= tiles.max(1);
            let small = block / tiles.max(1);
            let g = x.as_slice::<f32>()?;
            let dx = outs.tensor(0)?.try_ensure::<f32>(&od)?;
            dx.fill(0.0);
            if g.is_empty() {
                // Nothing to add up (the loops below would run `tiles` times for nothing).
                return Ok(());
            }
            for o in 0..outer {
                for t in 0..tiles {
                    let src = o * block + t * small;
                    for j in 0..small {
                        dx[o * small + j] += g[src + j];
                    }
                }
            }
            return Ok(());
        }
        let mut od = d.clone();
        od[ax] = od[ax].checked_mul(tiles).ok_or_else(
            || err!(BadArgument: "dimension {} of shape {d:?} times tiles {tiles} overflows", ax),
        )?;
        dispatch!(x.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64,
            Bool => bool, Uint8 => u8], |T| {
            let xs = x.as_slice::<T>()?;
            let y = outs.tensor(0)?.try_ensure::<T>(&od)?;
            if y.is_empty() {
                // An empty output: the copies below would be `outer * tiles` empty ones.
                return Ok(());
            }
            for o in 0..outer {
                for t in 0..tiles {
                    let dst = (o * tiles + t) * block;
                    y[dst..dst + block].copy_from_slice(&xs[o * block..(o + 1) * block]);
                }
            }
            Ok(())
        })
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_rules() {
        assert_eq!(new_shape(&[0, -1], &[2, 3, 4], 24).unwrap(), vec![2, 12]);
        assert!(new_shape(&[-1, -1], &[6], 6).is_err());
        let e = new_shape(&[4], &[6], 6).unwrap_err().to_string();
        assert!(e.contains("does not agree with the input data"), "{e}");
    }

    #[test]
    fn batched_transposes_are_recognized() {
        let d = [2, 3, 4, 5];
        assert_eq!(as_batched_transpose(&d, &[0, 2, 3, 1]), Some((2, 3, 20)));
        assert_eq!(as_batched_transpose(&d, &[0, 3, 1, 2]), Some((2, 12, 5)));
        assert_eq!(as_batched_transpose(&d, &[2, 3, 0, 1]), Some((1, 6, 20)));
        assert_eq!(as_batched_transpose(&d, &[1, 0, 2, 3]), None);
        assert_eq!(as_batched_transpose(&d, &[0, 1, 3, 2]), Some((6, 4, 5)));
        assert_eq!(as_batched_transpose(&d, &[3, 2, 1, 0]), None);
        assert_eq!(as_batched_transpose(&d, &[0, 1, 2, 3]), None);
    }

    #[test]
    fn permute_matches_index_math() {
        let x: Vec<i32> = (0..24).collect();
        let mut y = vec![0; 24];
        permute(&x, &[2, 3, 4], &[2, 0, 1], &mut y);
        // y[k, i, j] = x[i, j, k]
        assert_eq!(y[0..6], [0, 4, 8, 12, 16, 20]);
        assert_eq!(y[6], 1);
    }

    #[test]
    fn slice_runs() {
        let r = slice_ranges(&[2, 3, 4], &[0, 1], &[-1, 3]).unwrap();
        assert_eq!(r, vec![(0, 2), (1, 2), (0, 4)]);
        let mut runs = Vec::new();
        for_each_run(&[2, 3, 4], &r, |a, b, n| runs.push((a, b, n)));
        assert_eq!(runs, vec![(4, 0, 4), (8, 4, 4), (16, 8, 4), (20, 12, 4)]);
    }

    #[test]
    fn size_is_an_int64_scalar() {
        use crate::proto::OperatorDef;
        use crate::tensor::Tensor;
        use crate::workspace::Workspace;
        let ws = Workspace::new();
        let op = OperatorDef::new("Size", ["x"], ["n"]);
        for (dims, want) in [(vec![2usize, 3, 4], 24i64), (vec![], 1), (vec![5, 0], 0)] {
            let numel = dims.iter().product();
            ws.feed("x", Tensor::from_vec(&dims, vec![1.0f32; numel]).unwrap());
            ws.run_operator_once(&op).unwrap();
            let n = ws.fetch("n").unwrap();
            assert_eq!(n.dims(), &[] as &[usize]);
            assert_eq!(n.as_slice::<i64>().unwrap(), &[want]);
        }
        ws.feed("s", Tensor::from_vec(&[3], vec![1i32, 2, 3]).unwrap());
        ws.run_operator_once(&OperatorDef::new("Size", ["s"], ["n"]))
            .unwrap();
        assert_eq!(ws.fetch("n").unwrap().as_slice::<i64>().unwrap(), &[3]);
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
    }
}
