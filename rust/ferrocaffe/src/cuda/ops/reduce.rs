//! The `reduce` family on CUDA (kernels in kernels/reduce.cu): SumElements (and its gradient),
//! SumSqrElements, AveragedLoss (and its gradient), ReduceSum / ReduceMean / ReduceMax /
//! ReduceMin and their gradients, Transpose, Concat / DepthConcat, Split / DepthSplit, and the
//! fills ConstantFill, UniformFill, GaussianFill, XavierFill and MSRAFill.
//!
//! Semantics, arguments and errors follow the CPU kernels (`ops/cpu/{math,nn,reduce,shape,
//! fill}.rs`). Index arithmetic runs on coalesced shapes: dims of size 1 are dropped and
//! neighbours that the kernel treats alike are merged, so at most [`MAXD`] dims reach a kernel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaFunction, LaunchConfig};

use crate::cuda::op::{device, init_device, input, input_f32, n64, new_tensor, set_output};
use crate::cuda::{grid, rows, DeviceCtx, BLOCK};
use crate::cuda_launch;
use crate::device::DeviceType;
use crate::error::{Error, Result};
use crate::ops::cpu::fill::FillShape;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, ensure, err};

/// Registers this family's CUDA kernels.
pub fn register(r: &mut Registry) {
    let cuda = DeviceType::Cuda;
    r.register("SumElements", cuda, "", |i| create_whole(i, Whole::Sum));
    r.register("SumSqrElements", cuda, "", |i| {
        create_whole(i, Whole::SumSqr)
    });
    r.register("AveragedLoss", cuda, "", |i| {
        create_whole(i, Whole::Averaged)
    });
    r.register("SumElementsGradient", cuda, "", |i| {
        create_scalar_grad(i, false)
    });
    r.register("AveragedLossGradient", cuda, "", |i| {
        create_scalar_grad(i, true)
    });
    r.register("ReduceSum", cuda, "", |i| create_reduce(i, Red::Sum));
    r.register("ReduceMean", cuda, "", |i| create_reduce(i, Red::Mean));
    r.register("ReduceMax", cuda, "", |i| create_reduce(i, Red::Max));
    r.register("ReduceMin", cuda, "", |i| create_reduce(i, Red::Min));
    r.register("ReduceSumGradient", cuda, "", |i| {
        create_reduce_grad(i, Red::Sum)
    });
    r.register("ReduceMeanGradient", cuda, "", |i| {
        create_reduce_grad(i, Red::Mean)
    });
    r.register("ReduceMaxGradient", cuda, "", |i| {
        create_reduce_grad(i, Red::Max)
    });
    r.register("ReduceMinGradient", cuda, "", |i| {
        create_reduce_grad(i, Red::Min)
    });
    r.register("Transpose", cuda, "", create_transpose);
    for t in ["Concat", "DepthConcat"] {
        r.register(t, cuda, "", create_concat);
    }
    for t in ["Split", "DepthSplit"] {
        r.register(t, cuda, "", create_split);
    }
    r.register("ConstantFill", cuda, "", create_constant);
    r.register("UniformFill", cuda, "", |i| create_random(i, Rand::Uniform));
    r.register("GaussianFill", cuda, "", |i| {
        create_random(i, Rand::Gaussian)
    });
    r.register("XavierFill", cuda, "", |i| create_random(i, Rand::Xavier));
    r.register("MSRAFill", cuda, "", |i| create_random(i, Rand::Msra));
}

// ---------------------------------------------------------------------------------------------
// Shapes as kernel arguments.

/// The most dims a kernel indexes (the kernels' `RD_MAXD`).
const MAXD: usize = 16;

/// Dims or strides passed by value (the kernels' `struct RdDims { i64 v[16]; }`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Dims([i64; MAXD]);

// SAFETY: plain data of 16 `i64`, laid out as the kernels' `RdDims` (size 128, alignment 8).
unsafe impl cudarc::driver::DeviceRepr for Dims {}

/// `v` as kernel dims, with its length as an `int`.
fn pack(v: &[usize]) -> Result<(Dims, i32)> {
    ensure!(
        v.len() <= MAXD,
        NotImplemented: "CUDA kernels index at most {MAXD} dims after merging neighbours; this \
         shape needs {}",
        v.len()
    );
    let mut d = [0i64; MAXD];
    for (o, &x) in d.iter_mut().zip(v) {
        *o = n64(x);
    }
    Ok((Dims(d), i32::try_from(v.len()).unwrap_or(0)))
}

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1].saturating_mul(dims[k + 1]);
    }
    s
}

/// The kernel functions `names` of module "reduce".
fn functions(init: &OpInit<'_>, names: &[&str]) -> Result<Vec<CudaFunction>> {
    let dev = init_device(init)?;
    names.iter().map(|n| dev.function("reduce", n)).collect()
}

/// A one-block-per-`n` launch of `blocks` blocks (at least one, at most 1024).
fn blocks(n: usize) -> LaunchConfig {
    let b = n.clamp(1, 1024);
    LaunchConfig {
        grid_dim: (u32::try_from(b).unwrap_or(1024), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The index of an element size among the kernels' `_u8`, `_u16`, `_u32`, `_u64` variants.
fn size_index(item: usize) -> Option<usize> {
    match item {
        1 => Some(0),
        2 => Some(1),
        4 => Some(2),
        8 => Some(3),
        _ => None,
    }
}

const U8_TO_U64: [&str; 4] = ["_u8", "_u16", "_u32", "_u64"];

fn sized(prefix: &str) -> Vec<String> {
    U8_TO_U64.iter().map(|s| format!("{prefix}{s}")).collect()
}

fn sized_functions(init: &OpInit<'_>, prefix: &str) -> Result<Vec<CudaFunction>> {
    let names = sized(prefix);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    functions(init, &refs)
}

/// The function of `fns` (one per element size) for dtype `dt`, or a `DtypeMismatch` naming
/// input `i`.
fn for_dtype<'f>(
    fns: &'f [CudaFunction],
    ctx: &OpContext<'_>,
    i: usize,
    dt: DataType,
) -> Result<&'f CudaFunction> {
    if dt != DataType::String {
        if let Some(f) = size_index(dt.item_size()).and_then(|k| fns.get(k)) {
            return Ok(f);
        }
    }
    bail!(
        DtypeMismatch: "input {i} ('{}') holds {dt}, which has no CUDA kernel here",
        ctx.input_name(i)
    )
}

// ---------------------------------------------------------------------------------------------
// Whole-tensor sums.

#[derive(Clone, Copy, PartialEq)]
enum Whole {
    /// SumElements (`average`): float, double, int32, int64.
    Sum,
    /// SumSqrElements (`average`): float.
    SumSqr,
    /// AveragedLoss: float, the mean (0 when empty).
    Averaged,
}

/// `y[0] = sum(x or x^2) / div` over `n` elements of dtype index `k` (f32, f64, i32, i64).
#[allow(clippy::too_many_arguments)]
fn whole_sum(
    dev: &Arc<DeviceCtx>,
    partial: &CudaFunction,
    finish: &CudaFunction,
    x: u64,
    n: usize,
    y: u64,
    square: bool,
    div: f64,
) -> Result<()> {
    let parts = n.div_ceil(BLOCK as usize * 8).clamp(1, 1024);
    let (tmp, tp) = new_tensor(dev, DataType::Double, &[parts])?;
    cuda_launch!(dev, partial, blocks(parts); x, tp, n64(n), i32::from(square))?;
    cuda_launch!(dev, finish, rows(1, BLOCK); tp, y, n64(parts), div)?;
    drop(tmp);
    Ok(())
}

fn create_whole(init: &OpInit<'_>, kind: Whole) -> Result<Box<dyn Operator>> {
    let average = init.args.bool("average", false)?;
    let f = functions(
        init,
        &[
            "sum_partial_f32",
            "sum_partial_f64",
            "sum_partial_i32",
            "sum_partial_i64",
            "sum_finish_f32",
            "sum_finish_f64",
            "sum_finish_i32",
            "sum_finish_i64",
        ],
    )?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = if kind == Whole::Sum {
            input(ctx, &dev, 0)?
        } else {
            input_f32(ctx, &dev, 0)?
        };
        let dt = x.t.dtype();
        let k = match dt {
            DataType::Float => 0,
            DataType::Double => 1,
            DataType::Int32 => 2,
            DataType::Int64 => 3,
            other => bail!(
                DtypeMismatch: "SumElements supports float, double, int32 and int64 on CUDA; \
                 input 0 ('{}') holds {other}",
                ctx.input_name(0)
            ),
        };
        let n = x.numel();
        let div = match kind {
            Whole::Averaged => n.max(1) as f64,
            _ if average && n > 0 => n as f64,
            _ => 1.0,
        };
        let (y, yp) = new_tensor(&dev, dt, &[])?;
        whole_sum(
            &dev,
            &f[k],
            &f[k + 4],
            x.ptr,
            n,
            yp,
            kind == Whole::SumSqr,
            div,
        )?;
        set_output(ctx, 0, y)
    })))
}

/// SumElementsGradient (`averaged` false: inputs X, dY; dX = dY / (n if `average`)) and
/// AveragedLossGradient (`averaged`: dX = dY / max(n, 1)), dX of X's shape.
fn create_scalar_grad(init: &OpInit<'_>, averaged: bool) -> Result<Box<dyn Operator>> {
    let average = averaged || init.args.bool("average", false)?;
    let f = functions(init, &["fill_scalar_div_f32", "fill_bits_u32"])?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let (dims, dt) = {
            let x = ctx.input(0)?;
            (x.dims().to_vec(), x.dtype())
        };
        let n: usize = dims.iter().product();
        let g = ctx.input(1)?;
        let g_float = g.dtype() == DataType::Float;
        if averaged {
            if g.numel() == 0 {
                return Err(Error::InvalidArgument("index 0 out of range".into()));
            }
        } else {
            if g.numel() != 1 {
                bail!(
                    op = ctx,
                    ShapeMismatch: "SumElementsGradient expects a scalar output gradient"
                );
            }
            if dt != DataType::Float {
                bail!(op = ctx, DtypeMismatch: "SumElementsGradient supports float, got {dt}");
            }
        }
        let div = if averaged {
            n.max(1) as f32
        } else if average && n > 0 {
            n as f32
        } else {
            1.0
        };
        let (dx, dxp) = new_tensor(&dev, DataType::Float, &dims)?;
        if g_float {
            let g = input_f32(ctx, &dev, 1)?;
            if n > 0 {
                cuda_launch!(dev, f[0], grid(n); g.ptr, dxp, div, n64(n))?;
            }
        } else {
            let v = g.to_host()?.get_f64(0)? as f32 / div;
            if n > 0 {
                cuda_launch!(dev, f[1], grid(n); dxp, u64::from(v.to_bits()), n64(n))?;
            }
        }
        set_output(ctx, 0, dx)
    })))
}

// ---------------------------------------------------------------------------------------------
// Reductions over axes.

#[derive(Clone, Copy, PartialEq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
}

/// Which dims of `dims` `axes` reduces (all when absent), as the CPU kernel reads them.
fn reduce_flags(axes: &Option<Vec<i64>>, dims: &[usize]) -> Result<Vec<bool>> {
    let nd = n64(dims.len());
    let mut flags = vec![axes.is_none(); dims.len()];
    for &a in axes.iter().flatten() {
        let k = if a < 0 { a.saturating_add(nd) } else { a };
        if k < 0 || k >= nd {
            bail!(BadArgument: "axes {a} out of range for a tensor of {nd} dimensions");
        }
        flags[usize::try_from(k).unwrap_or(0)] = true;
    }
    Ok(flags)
}

/// `dims` without its size-1 dims, neighbours with the same flag merged: (dim, innermost
/// stride, flag) per group.
fn groups(dims: &[usize], flags: &[bool]) -> Vec<(usize, usize, bool)> {
    let st = strides(dims);
    let mut g: Vec<(usize, usize, bool)> = Vec::new();
    for k in 0..dims.len() {
        if dims[k] == 1 {
            continue;
        }
        match g.last_mut() {
            Some(last) if last.2 == flags[k] => {
                last.0 = last.0.saturating_mul(dims[k]);
                last.1 = st[k];
            }
            _ => g.push((dims[k], st[k], flags[k])),
        }
    }
    g
}

fn red_code(red: Red) -> i32 {
    match red {
        Red::Sum | Red::Mean => 0,
        Red::Max => 1,
        Red::Min => 2,
    }
}

fn create_reduce(init: &OpInit<'_>, red: Red) -> Result<Box<dyn Operator>> {
    let axes = init.args.has("axes").then(|| init.args.ints("axes"));
    let keepdims = init.args.bool("keepdims", true)?;
    let f = functions(init, &["reduce_thread_f32", "reduce_block_f32"])?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let dims = x.dims().to_vec();
        let flags = reduce_flags(&axes, &dims)?;
        let out_dims: Vec<usize> = if keepdims {
            dims.iter()
                .zip(&flags)
                .map(|(&d, &f)| if f { 1 } else { d })
                .collect()
        } else {
            dims.iter()
                .zip(&flags)
                .filter(|(_, &f)| !f)
                .map(|(&d, _)| d)
                .collect()
        };
        let out_n: usize = out_dims.iter().product();
        let count: usize = dims
            .iter()
            .zip(&flags)
            .filter(|(_, &f)| f)
            .map(|(&d, _)| d)
            .product();
        let (y, yp) = new_tensor(&dev, DataType::Float, &out_dims)?;
        if out_n > 0 {
            let g = groups(&dims, &flags);
            let kept: Vec<&(usize, usize, bool)> = g.iter().filter(|e| !e.2).collect();
            let reduced: Vec<&(usize, usize, bool)> = g.iter().filter(|e| e.2).collect();
            let (kd, nk) = pack(&kept.iter().map(|e| e.0).collect::<Vec<_>>())?;
            let (ks, _) = pack(&kept.iter().map(|e| e.1).collect::<Vec<_>>())?;
            let (rd, nr) = pack(&reduced.iter().map(|e| e.0).collect::<Vec<_>>())?;
            let (rs, _) = pack(&reduced.iter().map(|e| e.1).collect::<Vec<_>>())?;
            let div = if red == Red::Mean && count > 0 {
                count as f32
            } else {
                1.0
            };
            let op = red_code(red);
            // Few values per output, or outputs adjacent in memory (reading coalesced across
            // threads): one thread per output; else one block per output.
            let inner_kept = kept.last().is_some_and(|e| e.1 == 1);
            if count < 64 || (inner_kept && out_n >= 4096) {
                cuda_launch!(dev, f[0], grid(out_n);
                    x.ptr, yp, n64(out_n), n64(count), kd, ks, nk, rd, rs, nr, op, div)?;
            } else {
                cuda_launch!(dev, f[1], rows(out_n, BLOCK);
                    x.ptr, yp, n64(out_n), n64(count), kd, ks, nk, rd, rs, nr, op, div)?;
            }
        }
        set_output(ctx, 0, y)
    })))
}

/// The dtype check of `input_f32` without copying the input (its values are not read).
fn check_f32(ctx: &OpContext<'_>, i: usize) -> Result<()> {
    let dt = ctx.input(i)?.dtype();
    if dt != DataType::Float {
        return Err(Error::DtypeMismatch(format!(
            "input {i} ('{}') holds {dt}, expected {} on CUDA",
            ctx.input_name(i),
            DataType::Float
        )));
    }
    Ok(())
}

/// Inputs (dY, X, Y), output dX of X's shape.
fn create_reduce_grad(init: &OpInit<'_>, red: Red) -> Result<Box<dyn Operator>> {
    let axes = init.args.has("axes").then(|| init.args.ints("axes"));
    init.args.bool("keepdims", true)?;
    let f = functions(init, &["reduce_grad_f32"])?;
    let by_value = matches!(red, Red::Max | Red::Min);
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let dy = input_f32(ctx, &dev, 0)?;
        let (x, y) = if by_value {
            (
                Some(input_f32(ctx, &dev, 1)?),
                Some(input_f32(ctx, &dev, 2)?),
            )
        } else {
            check_f32(ctx, 1)?;
            check_f32(ctx, 2)?;
            (None, None)
        };
        let dims = ctx.input(1)?.dims().to_vec();
        let y_n = ctx.input(2)?.numel();
        let flags = reduce_flags(&axes, &dims)?;
        let n_out: usize = dims
            .iter()
            .zip(&flags)
            .map(|(&d, &f)| if f { 1 } else { d })
            .product();
        let count: usize = dims
            .iter()
            .zip(&flags)
            .filter(|(_, &f)| f)
            .map(|(&d, _)| d)
            .product();
        if dy.numel() != n_out || y_n != n_out {
            let keep: Vec<usize> = dims
                .iter()
                .zip(&flags)
                .map(|(&d, &f)| if f { 1 } else { d })
                .collect();
            bail!(ShapeMismatch: "dY and Y must hold {n_out} values (the reduced shape {keep:?})");
        }
        let n: usize = dims.iter().product();
        let (dx, dxp) = new_tensor(&dev, DataType::Float, &dims)?;
        if n > 0 {
            let g = groups(&dims, &flags);
            // Y strides: row-major over the kept groups, 0 for the reduced ones.
            let mut ys = vec![0usize; g.len()];
            let mut acc = 1usize;
            for (k, e) in g.iter().enumerate().rev() {
                if !e.2 {
                    ys[k] = acc;
                    acc = acc.saturating_mul(e.0);
                }
            }
            let (xd, nd) = pack(&g.iter().map(|e| e.0).collect::<Vec<_>>())?;
            let (ysd, _) = pack(&ys)?;
            let scale = if red == Red::Mean && count > 0 {
                1.0 / count as f32
            } else {
                1.0
            };
            let xp = x.as_ref().map_or(0, |t| t.ptr);
            let yp = y.as_ref().map_or(0, |t| t.ptr);
            let mode = i32::from(by_value);
            cuda_launch!(dev, f[0], grid(n);
                dy.ptr, xp, yp, dxp, n64(n), xd, ysd, nd, mode, scale)?;
        }
        set_output(ctx, 0, dx)
    })))
}

// ---------------------------------------------------------------------------------------------
// Transpose.

/// The coalesced transpose of `dims` by `perm`: output dims and the input stride of each.
fn transpose_plan(dims: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let st = strides(dims);
    // Rank of each non-1 input axis among the non-1 axes.
    let mut rank = vec![usize::MAX; dims.len()];
    let mut r = 0;
    for (k, &d) in dims.iter().enumerate() {
        if d != 1 {
            rank[k] = r;
            r += 1;
        }
    }
    // Runs of input axes that stay adjacent and in order in the output: (last axis, size).
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &p in perm {
        if dims[p] == 1 {
            continue;
        }
        match runs.last_mut() {
            Some(last) if rank[last.0].checked_add(1) == Some(rank[p]) => {
                last.0 = p;
                last.1 = last.1.saturating_mul(dims[p]);
            }
            _ => runs.push((p, dims[p])),
        }
    }
    (
        runs.iter().map(|e| e.1).collect(),
        runs.iter().map(|e| st[e.0]).collect(),
    )
}

fn create_transpose(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axes = init.args.ints("axes");
    if !axes.is_empty() {
        let mut s = axes.clone();
        s.sort_unstable();
        if s.iter().enumerate().any(|(i, &v)| v != n64(i)) {
            bail!(op = init, BadArgument: "Axes should be a permutation of 0 to ndim.");
        }
    }
    let f = sized_functions(init, "transpose")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = input(ctx, &dev, 0)?;
        let dims = x.dims().to_vec();
        let nd = dims.len();
        let perm: Vec<usize> = if axes.is_empty() {
            (0..nd).rev().collect()
        } else {
            axes.iter()
                .map(|&a| usize::try_from(a).unwrap_or(usize::MAX))
                .collect()
        };
        if perm.len() != nd {
            bail!(
                BadArgument: "Axes should be a permutation of 0 to ndim: {perm:?} for a tensor \
                 of shape {dims:?}"
            );
        }
        let dt = x.t.dtype();
        let func = for_dtype(&f, ctx, 0, dt)?;
        let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let (y, yp) = new_tensor(&dev, dt, &out_dims)?;
        let n = x.numel();
        if n > 0 {
            let (od, ss) = transpose_plan(&dims, &perm);
            if od.len() <= 1 {
                dev.copy_d2d(yp, x.ptr, n * dt.item_size())?;
            } else {
                let (odd, ndi) = pack(&od)?;
                let (ssd, _) = pack(&ss)?;
                cuda_launch!(dev, func, grid(n); x.ptr, yp, n64(n), odd, ssd, ndi)?;
            }
        }
        set_output(ctx, 0, y)
    })))
}

// ---------------------------------------------------------------------------------------------
// Concat and Split.

/// `axis` counted from the back when negative (`axis < nd`).
fn canonical(axis: i64, nd: usize) -> Result<usize> {
    let n = n64(nd);
    let a = if axis < 0 {
        axis.saturating_add(n)
    } else {
        axis
    };
    if a < 0 || a > n - 1 {
        bail!(BadArgument: "axis {axis} out of range for {nd} dimensions");
    }
    Ok(usize::try_from(a).unwrap_or(0))
}

fn order_axis(init: &OpInit<'_>) -> Result<i64> {
    if init.args.has("axis") {
        return init.args.int("axis", 1);
    }
    let order = init.args.string("order", "NCHW")?;
    Ok(if order == "NHWC" { 3 } else { 1 })
}

/// Copies `rows` rows of `width` bytes from `src` (rows `src_pitch` bytes apart) to `dst`
/// (rows `dst_pitch` bytes apart), with the widest element the addresses allow.
#[allow(clippy::too_many_arguments)]
fn copy_rows(
    dev: &Arc<DeviceCtx>,
    fns: &[CudaFunction],
    src: u64,
    dst: u64,
    rows: usize,
    width: usize,
    src_pitch: usize,
    dst_pitch: usize,
) -> Result<()> {
    if rows == 0 || width == 0 {
        return Ok(());
    }
    if rows == 1 || (width == src_pitch && width == dst_pitch) {
        return dev.copy_d2d(dst, src, rows * width);
    }
    let all = [src, dst, width as u64, src_pitch as u64, dst_pitch as u64];
    let (k, w) = [(3usize, 8usize), (2, 4), (1, 2), (0, 1)]
        .into_iter()
        .find(|&(_, w)| all.iter().all(|v| v % w as u64 == 0))
        .unwrap_or((0, 1));
    let (r, c) = (rows, width / w);
    cuda_launch!(dev, fns[k], grid(r * c);
        src, dst, n64(r), n64(c), n64(src_pitch / w), n64(dst_pitch / w))
}

fn create_concat(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axis = order_axis(init)?;
    let add_axis = init.args.bool("add_axis", false)?;
    let f = sized_functions(init, "copy_rows")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let n = ctx.num_inputs();
        let (d0, dt0) = {
            let t = ctx.input(0)?;
            (t.dims().to_vec(), t.dtype())
        };
        let ax = canonical(axis, d0.len() + usize::from(add_axis))?;
        let mut sizes = Vec::with_capacity(n);
        for i in 0..n {
            let t = ctx.input(i)?;
            if t.dtype() != dt0 {
                bail!(DtypeMismatch: "input {i} is {}, input 0 is {}", t.dtype(), dt0);
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
        for_dtype(&f, ctx, 0, dt0)?;
        let mut out_dims = d0.clone();
        if add_axis {
            out_dims.insert(ax, n);
        } else {
            out_dims[ax] = sizes
                .iter()
                .try_fold(0usize, |a, &s| a.checked_add(s))
                .ok_or_else(|| err!(ShapeMismatch: "Concat: the sizes along axis {ax} overflow"))?;
        }
        let outer: usize = out_dims[..ax].iter().product();
        let inner: usize = out_dims[ax + 1..].iter().product();
        let total_axis = out_dims[ax];
        let isz = dt0.item_size();
        let (y, yp) = new_tensor(&dev, dt0, &out_dims)?;
        if y.numel() > 0 {
            let mut off = 0usize;
            for (i, &s) in sizes.iter().enumerate() {
                let x = input(ctx, &dev, i)?;
                let dst = yp + (off * inner * isz) as u64;
                let width = s * inner * isz;
                copy_rows(
                    &dev,
                    &f,
                    x.ptr,
                    dst,
                    outer,
                    width,
                    width,
                    total_axis * inner * isz,
                )?;
                off += s;
            }
        }
        set_output(ctx, 0, y)?;
        if ctx.num_outputs() > 1 {
            let info = sizes
                .iter()
                .map(|&s| i32::try_from(s))
                .collect::<std::result::Result<Vec<i32>, _>>()
                .map_err(|_| err!(BadArgument: "a Concat input size exceeds int32"))?;
            let t = dev.upload(&Tensor::from_vec(&[n], info)?)?;
            set_output(ctx, 1, t)?;
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
    let f = sized_functions(init, "copy_rows")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let n_out = ctx.num_outputs();
        let sizes_in = if ctx.num_inputs() == 2 {
            Some(ctx.input(1)?.to_host()?.to_i64_vec()?)
        } else {
            None
        };
        let x = input(ctx, &dev, 0)?;
        let d = x.dims().to_vec();
        let ax = canonical(axis, d.len())?;
        let dim = d[ax];
        let sizes: Vec<usize> = match sizes_in
            .or_else(|| (!split.is_empty()).then(|| split.clone()))
        {
            Some(s) => {
                if s.len() != n_out {
                    bail!(BadArgument: "split has {} sizes for {n_out} outputs", s.len());
                }
                s.iter()
                    .map(|&v| usize::try_from(v.max(0)).unwrap_or(0))
                    .collect()
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
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(dim) {
            bail!(
                ShapeMismatch: "Sum of split dimensions do not match: should be {dim}, got {}",
                total.map_or_else(|| "an overflowing sum".to_string(), |t| t.to_string())
            );
        }
        let dt = x.t.dtype();
        for_dtype(&f, ctx, 0, dt)?;
        let isz = dt.item_size();
        let outer: usize = d[..ax].iter().product();
        let inner: usize = d[ax + 1..].iter().product();
        let mut off = 0usize;
        for (j, &s) in sizes.iter().enumerate() {
            let mut od = d.clone();
            if add_axis {
                od.remove(ax);
            } else {
                od[ax] = s;
            }
            let (y, yp) = new_tensor(&dev, dt, &od)?;
            let src = x.ptr + (off * inner * isz) as u64;
            let width = s * inner * isz;
            copy_rows(&dev, &f, src, yp, outer, width, dim * inner * isz, width)?;
            set_output(ctx, j, y)?;
            off += s;
        }
        Ok(())
    })))
}

// ---------------------------------------------------------------------------------------------
// Fills.

// The fill shape rules are the CPU's `FillShape` (a shape input on the device is read
// through `Tensor::to_i64_vec`, which copies it to the host).

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
    // (dtype, the bit pattern of one element); the range checks make the casts exact.
    let (dt, bits): (DataType, u64) = match dtype {
        1 => (DataType::Float, u64::from(a.float("value", 0.0)?.to_bits())),
        13 => (
            DataType::Double,
            f64::from(a.float("value", 0.0)?).to_bits(),
        ),
        5 => (DataType::Bool, u64::from(a.int("value", 0)? != 0)),
        7 => (DataType::Int8, u64::from(int(-128, 127)? as i8 as u8)),
        9 => (
            DataType::Int16,
            u64::from(int(-32768, 32767)? as i16 as u16),
        ),
        2 => (
            DataType::Int32,
            u64::from(int(i32::MIN.into(), i32::MAX.into())? as i32 as u32),
        ),
        10 => (DataType::Int64, a.int("value", 0)? as u64),
        6 => (DataType::Uint8, u64::from(int(0, 255)? as u8)),
        8 => (DataType::Uint16, u64::from(int(0, 65535)? as u16)),
        // Strings live on the host: the CPU kernel fills them.
        4 => return crate::cuda::fallback(init),
        other => bail!(op = init, BadArgument: "Unexpected 'dtype' argument value: {other}"),
    };
    let f = sized_functions(init, "fill_bits")?;
    let k = size_index(dt.item_size()).unwrap_or(0);
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let dims = shape.resolve(ctx)?;
        let (y, yp) = new_tensor(&dev, dt, &dims)?;
        let n = y.numel();
        if n > 0 {
            cuda_launch!(dev, f[k], grid(n); yp, bits, n64(n))?;
        }
        set_output(ctx, 0, y)
    })))
}

#[derive(Clone, Copy, PartialEq)]
enum Rand {
    Uniform,
    Gaussian,
    Xavier,
    Msra,
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream seed of a random fill: from `random_seed` when set, else a process-wide
/// sequence (mixed with the time) so successive fills differ.
fn stream_seed(seed: Option<u32>) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x5EED_CAFE_F00D);
    match seed {
        Some(s) => splitmix(u64::from(s)),
        None => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            splitmix(t ^ splitmix(NEXT.fetch_add(1, Ordering::Relaxed)))
        }
    }
}

fn create_random(init: &OpInit<'_>, kind: Rand) -> Result<Box<dyn Operator>> {
    let shape = FillShape::new(init)?;
    let a = &init.args;
    let (lo, hi) = match kind {
        Rand::Uniform => {
            if init.num_inputs() == 3 && (a.has("min") || a.has("max")) {
                bail!(
                    op = init,
                    BadArgument: "Cannot set both min/max arg and min/max input blobs"
                );
            }
            (
                f64::from(a.float("min", 0.0)?),
                f64::from(a.float("max", 1.0)?),
            )
        }
        Rand::Gaussian => (
            f64::from(a.float("mean", 0.0)?),
            f64::from(a.float("std", 1.0)?),
        ),
        _ => (0.0, 0.0),
    };
    let dtype =
        DataType::from_proto(a.int("dtype", 1)?).map_err(|e| err!(op = init, BadArgument: e))?;
    let (out_dt, out_code) = match dtype {
        DataType::Double => (DataType::Double, 1i32),
        DataType::Float16 => (DataType::Float16, 2),
        _ => (DataType::Float, 0),
    };
    let f = functions(init, &["random_fill"])?;
    let seed = stream_seed(init.random_seed());
    let mut offset = 0u64;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let (mut lo, mut hi) = (lo, hi);
        if ctx.num_inputs() == 3 && kind == Rand::Uniform {
            let read = |i: usize| -> Result<f64> {
                let t = ctx.input(i)?;
                if t.numel() != 1 {
                    bail!(op = ctx, ShapeMismatch: "{} must be a single value", ctx.input_name(i));
                }
                t.to_host()?.get_f64(0)
            };
            lo = read(1)?;
            hi = read(2)?;
        }
        let dims = shape.resolve(ctx)?;
        if lo > hi && kind != Rand::Gaussian {
            bail!(BadArgument: "max {hi} must be at least min {lo}");
        }
        let n: usize = dims.iter().product();
        // (kernel kind: 0 uniform in [a, b], 1 gaussian of mean a and std b; a; b)
        let (code, pa, pb) = match kind {
            Rand::Uniform => (0i32, lo as f32, hi as f32),
            Rand::Gaussian => (1, lo as f32, hi as f32),
            Rand::Xavier => {
                let fan_in = match dims.first() {
                    Some(&d0) if d0 != 0 => n / d0,
                    _ => 1,
                };
                let scale = (3.0f32 / fan_in.max(1) as f32).sqrt();
                (0, -scale, scale)
            }
            Rand::Msra => {
                let fan_out = match dims.get(1) {
                    Some(&d1) if d1 != 0 => n / d1,
                    _ => 1,
                };
                (1, 0.0, (2.0f32 / fan_out.max(1) as f32).sqrt())
            }
        };
        let (y, yp) = new_tensor(&dev, out_dt, &dims)?;
        if n > 0 {
            cuda_launch!(dev, f[0], grid(n); yp, n64(n), seed, offset, code, pa, pb, out_code)?;
            offset = offset.wrapping_add((n as u64).wrapping_mul(2));
        }
        set_output(ctx, 0, y)
    })))
}
