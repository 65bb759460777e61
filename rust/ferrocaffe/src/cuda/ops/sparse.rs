//! CUDA kernels of the `sparse` family (see kernels/sparse.cu): Gather, the (Sparse)Lengths
//! reductions and their gradients, ScatterAssign, ScatterWeightedSum, the optimizer updates
//! (MomentumSGD(Update), Adagrad, SparseAdagrad, RowWiseSparseAdagrad, Adam, SparseAdam,
//! SparseMomentumSGDUpdate) and the LSTM and GRU units with their gradients.
//!
//! Semantics, arguments, checks and errors are the CPU kernels' (`ops/cpu/sparse.rs`,
//! `optim.rs`, `sparse_optim.rs`, `rowwise_optim.rs`, `rnn_units.rs`). Indices (int32 or
//! int64) are checked on the device before any update, the first bad value coming back to the
//! host in one small copy, so an op that fails leaves its state untouched. Lengths, the
//! iteration and the timestep are read on the host; the learning rate stays on the device.
//! Updates whose result depends on the order of repeated indices walk the indices in order
//! (one thread per column), as the CPU does.

use std::sync::Arc;

use cudarc::driver::CudaFunction;

use crate::cuda::op::{
    device, init_device, input, input_f32, n64, new_tensor, set_output, update_in_place, DevIn,
};
use crate::cuda::{grid, raw, rows as one_block_per_row, DeviceCtx};
use crate::cuda_launch;
use crate::device::DeviceType;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::{bail, err};

/// Registers this family's CUDA kernels.
pub fn register(r: &mut Registry) {
    let c = DeviceType::Cuda;
    r.register("Gather", c, "", create_gather);
    r.register("SparseLengthsSum", c, "", |i| {
        create_reduce(i, Red::Sum, true)
    });
    r.register("SparseLengthsMean", c, "", |i| {
        create_reduce(i, Red::Mean, true)
    });
    r.register("SparseLengthsWeightedSum", c, "", |i| {
        create_reduce(i, Red::Weighted, true)
    });
    r.register("LengthsSum", c, "", |i| create_reduce(i, Red::Sum, false));
    r.register("LengthsMean", c, "", |i| create_reduce(i, Red::Mean, false));
    r.register("LengthsWeightedSum", c, "", |i| {
        create_reduce(i, Red::Weighted, false)
    });
    for (red, kind) in [
        (Red::Sum, "Sum"),
        (Red::Mean, "Mean"),
        (Red::Weighted, "WeightedSum"),
    ] {
        for prefix in [
            "SparseLengthsIndicesInGradient",
            "LengthsIndicesInGradient",
            "SparseLengths",
            "Lengths",
        ] {
            let name = format!("{prefix}{kind}Gradient");
            match red {
                Red::Sum => r.register(&name, c, "", |i| create_grad(i, Red::Sum)),
                Red::Mean => r.register(&name, c, "", |i| create_grad(i, Red::Mean)),
                Red::Weighted => r.register(&name, c, "", |i| create_grad(i, Red::Weighted)),
            }
        }
    }
    r.register(
        "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
        c,
        "",
        create_weighted_grad_main,
    );
    r.register("ScatterAssign", c, "", create_scatter_assign);
    r.register("ScatterWeightedSum", c, "", create_scatter_weighted_sum);
    r.register("MomentumSGD", c, "", |i| create_momentum(i, false));
    r.register("MomentumSGDUpdate", c, "", |i| create_momentum(i, true));
    r.register("Adagrad", c, "", create_adagrad);
    r.register("SparseAdagrad", c, "", create_sparse_adagrad);
    r.register("RowWiseSparseAdagrad", c, "", create_rowwise_adagrad);
    r.register("Adam", c, "", create_adam);
    r.register("SparseAdam", c, "", create_sparse_adam);
    r.register("SparseMomentumSGDUpdate", c, "", create_sparse_momentum);
    r.register("LSTMUnit", c, "", |i| create_unit(i, Cell::Lstm, false));
    r.register("LSTMUnitGradient", c, "", |i| {
        create_unit(i, Cell::Lstm, true)
    });
    r.register("GRUUnit", c, "", |i| create_unit(i, Cell::Gru, false));
    r.register("GRUUnitGradient", c, "", |i| {
        create_unit(i, Cell::Gru, true)
    });
}

// -- helpers ---------------------------------------------------------------------------------

/// A kernel's int32 and int64 index variants.
type Pair = [CudaFunction; 2];

fn pair(dev: &Arc<DeviceCtx>, base: &str) -> Result<Pair> {
    Ok([
        dev.function("sparse", &format!("{base}_i32"))?,
        dev.function("sparse", &format!("{base}_i64"))?,
    ])
}

/// Indices on the device and whether they are int64.
struct Idx {
    d: DevIn,
    is64: bool,
}

impl Idx {
    fn f<'a>(&self, p: &'a Pair) -> &'a CudaFunction {
        &p[usize::from(self.is64)]
    }

    fn n(&self) -> usize {
        self.d.numel()
    }
}

fn indices(ctx: &OpContext<'_>, dev: &Arc<DeviceCtx>, i: usize) -> Result<Idx> {
    let d = input(ctx, dev, i)?;
    let is64 = match d.t.dtype() {
        DataType::Int32 => false,
        DataType::Int64 => true,
        other => bail!(
            DtypeMismatch: "input {i} ('{}') must hold int32 or int64 indices on CUDA, got {other}",
            ctx.input_name(i)
        ),
    };
    Ok(Idx { d, is64 })
}

/// Checks every index against `[0, bound)` on the device; the first bad value seen, if any.
fn bad_index(dev: &Arc<DeviceCtx>, chk: &Pair, idx: &Idx, bound: usize) -> Result<Option<i64>> {
    let n = idx.n();
    if n == 0 {
        return Ok(None);
    }
    let flag = dev.zeros(DataType::Int64, &[2])?;
    let (fp, _) = raw(&flag)?;
    cuda_launch!(dev, idx.f(chk), grid(n); idx.d.ptr, n64(n), n64(bound), fp)?;
    let h = flag.to_host()?;
    let v = h.as_slice::<i64>()?;
    Ok(match (v.first(), v.get(1)) {
        (Some(&f), Some(&b)) if f != 0 => Some(b),
        _ => None,
    })
}

/// Row count and row size of input `i` (at least one dimension).
fn rows_of(t: &Tensor) -> Result<(usize, usize)> {
    let n = *t
        .dims()
        .first()
        .ok_or_else(|| err!(ShapeMismatch: "DATA must have at least one dimension"))?;
    Ok((n, t.numel().checked_div(n).unwrap_or(0)))
}

/// Lengths (input `i`, read on the host) as segment offsets `[0, l0, l0 + l1, ...]`.
fn offsets(ctx: &OpContext<'_>, i: usize) -> Result<Vec<i64>> {
    let lens = ctx.input(i)?.to_host()?.to_i64_vec()?;
    let mut offs = Vec::with_capacity(lens.len() + 1);
    let mut acc = 0i64;
    offs.push(acc);
    for l in lens {
        if l < 0 {
            bail!(BadArgument: "negative length {l}");
        }
        acc = acc
            .checked_add(l)
            .ok_or_else(|| err!(InvalidArgument: "the lengths' sum overflows"))?;
        offs.push(acc);
    }
    Ok(offs)
}

/// The offsets' total (the last value) as a count.
fn total_of(offs: &[i64]) -> usize {
    offs.last()
        .map_or(0, |&t| usize::try_from(t).unwrap_or(usize::MAX))
}

/// The offsets on the device.
fn upload_offsets(dev: &Arc<DeviceCtx>, offs: &[i64]) -> Result<(Tensor, u64)> {
    let t = dev.upload(&Tensor::from_slice(&[offs.len()], offs)?)?;
    let (p, _) = raw(&t)?;
    Ok((t, p))
}

/// The learning rate (or another one-value float input) on the device.
fn lr_input(ctx: &OpContext<'_>, dev: &Arc<DeviceCtx>, i: usize) -> Result<DevIn> {
    let t = ctx.input(i)?;
    if t.numel() != 1 {
        bail!(
            ShapeMismatch: "input {i} ('{}') must hold one value, got shape {:?}",
            ctx.input_name(i),
            t.dims()
        );
    }
    input_f32(ctx, dev, i)
}

/// Checks that input `i` is a float tensor of `n` values.
fn expect_f32(ctx: &OpContext<'_>, i: usize, n: usize, what: &str) -> Result<()> {
    let t = ctx.input(i)?;
    if t.dtype() != DataType::Float {
        bail!(
            DtypeMismatch: "input {i} ('{}') holds {}, expected float on CUDA",
            ctx.input_name(i),
            t.dtype()
        );
    }
    if t.numel() != n {
        bail!(
            ShapeMismatch: "input {i} ('{}') has {} values, expected {n} ({what})",
            ctx.input_name(i),
            t.numel()
        );
    }
    Ok(())
}

/// The first value of input `i` read on the host as an integer (an iteration, a timestep).
fn host_int(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<i64> {
    let v = ctx.input(i)?.to_host()?.to_i64_vec()?;
    v.first()
        .copied()
        .ok_or_else(|| err!(ShapeMismatch: "{what}"))
}

/// An optional new float output `j` of `dims` (address 0 when the op has no output `j`).
fn optional_out(
    ctx: &OpContext<'_>,
    dev: &Arc<DeviceCtx>,
    j: usize,
    dims: &[usize],
) -> Result<Option<(Tensor, u64)>> {
    if ctx.num_outputs() > j {
        Ok(Some(new_tensor(dev, DataType::Float, dims)?))
    } else {
        Ok(None)
    }
}

fn ptr_of(o: &Option<(Tensor, u64)>) -> u64 {
    o.as_ref().map_or(0, |(_, p)| *p)
}

fn store_optional(ctx: &mut OpContext<'_>, j: usize, o: Option<(Tensor, u64)>) -> Result<()> {
    match o {
        Some((t, _)) => set_output(ctx, j, t),
        None => Ok(()),
    }
}

// -- Gather ----------------------------------------------------------------------------------

fn create_gather(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let axis = init.args.int("axis", 0)?;
    let chk = pair(&dev0, "check_indices")?;
    let fs = [
        pair(&dev0, "gather_b1")?,
        pair(&dev0, "gather_b2")?,
        pair(&dev0, "gather_b4")?,
        pair(&dev0, "gather_b8")?,
    ];
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let data = input(ctx, &dev, 0)?;
        let idx = indices(ctx, &dev, 1)?;
        let d = data.dims().to_vec();
        let nd = n64(d.len());
        let ax = if axis < 0 {
            axis.saturating_add(nd)
        } else {
            axis
        };
        if ax < 0 || ax >= nd {
            bail!(BadArgument: "axis {axis} out of range for DATA of shape {d:?}");
        }
        let ax = usize::try_from(ax).unwrap_or(0);
        let f = match data.t.dtype().item_size() {
            1 => &fs[0],
            2 => &fs[1],
            4 => &fs[2],
            8 => &fs[3],
            _ => bail!(DtypeMismatch: "Gather on CUDA cannot copy {} elements", data.t.dtype()),
        };
        let axis_dim = d[ax];
        if let Some(v) = bad_index(&dev, &chk, &idx, axis_dim)? {
            bail!(BadArgument: "INDICES element is out of DATA bounds, id={v} axis_dim={axis_dim}");
        }
        let outer: usize = d[..ax].iter().product();
        let inner: usize = d[ax + 1..].iter().product();
        let mut od = d[..ax].to_vec();
        od.extend_from_slice(idx.d.dims());
        od.extend_from_slice(&d[ax + 1..]);
        let (y, yp) = new_tensor(&dev, data.t.dtype(), &od)?;
        let total = y.numel();
        if total > 0 {
            cuda_launch!(dev, idx.f(f), grid(total);
                data.ptr, idx.d.ptr, yp, n64(outer), n64(axis_dim), n64(idx.n()), n64(inner))?;
        }
        set_output(ctx, 0, y)
    })))
}

// -- Lengths reductions ----------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Red {
    Sum,
    Mean,
    Weighted,
}

/// (Sparse)Lengths{Sum,Mean,WeightedSum}: inputs DATA, [WEIGHTS], [INDICES], LENGTHS.
fn create_reduce(init: &OpInit<'_>, red: Red, sparse: bool) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let chk = pair(&dev0, "check_indices")?;
    let f = pair(&dev0, "lengths_reduce")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let data = input_f32(ctx, &dev, 0)?;
        let (n_rows, block) = rows_of(&data.t)?;
        let mut k = 1;
        let w = if red == Red::Weighted {
            k += 1;
            Some(input_f32(ctx, &dev, 1)?)
        } else {
            None
        };
        let idx = if sparse {
            k += 1;
            Some(indices(ctx, &dev, k - 1)?)
        } else {
            None
        };
        if let Some(ix) = &idx {
            if let Some(v) = bad_index(&dev, &chk, ix, n_rows)? {
                bail!(BadArgument: "INDICES element is out of DATA bounds, id={v} axis_dim={n_rows}");
            }
        }
        let offs = offsets(ctx, k)?;
        let total = total_of(&offs);
        let n_items = idx.as_ref().map_or(n_rows, Idx::n);
        if total != n_items {
            bail!(
                ShapeMismatch: "Your input seems to be incorrect: the sum of lengths values should \
                 be the size of the indices tensor, but it appears not. ({total} vs {n_items})"
            );
        }
        if let Some(w) = &w {
            if w.numel() != n_items {
                bail!(ShapeMismatch: "WEIGHTS has {} values, expected {n_items}", w.numel());
            }
        }
        let n_seg = offs.len() - 1;
        let mut od = data.dims().to_vec();
        od[0] = n_seg;
        let (y, yp) = new_tensor(&dev, DataType::Float, &od)?;
        if y.numel() > 0 {
            let (_offs_t, op) = upload_offsets(&dev, &offs)?;
            let wp = w.as_ref().map_or(0, |w| w.ptr);
            let (ip, func) = match &idx {
                Some(ix) => (ix.d.ptr, ix.f(&f)),
                None => (0u64, &f[0]),
            };
            let mean = i32::from(red == Red::Mean);
            cuda_launch!(dev, func, grid(y.numel());
                data.ptr, wp, ip, op, yp, n64(n_seg), n64(block), n64(n_rows), mean)?;
        }
        set_output(ctx, 0, y)
    })))
}

/// Gradient of the length reductions: (dY, LENGTHS, ...) or, weighted, (WEIGHTS, dY,
/// LENGTHS, ...) -> one row per item.
fn create_grad(init: &OpInit<'_>, red: Red) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let f = dev0.function("sparse", "lengths_grad_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let off = usize::from(red == Red::Weighted);
        let dy = input_f32(ctx, &dev, off)?;
        let offs = offsets(ctx, off + 1)?;
        let n_lens = offs.len() - 1;
        let (n_seg, block) = rows_of(&dy.t)?;
        if n_seg != n_lens {
            bail!(ShapeMismatch: "dY has {n_seg} rows for {n_lens} lengths");
        }
        let total = total_of(&offs);
        let w = if red == Red::Weighted {
            let w = input_f32(ctx, &dev, 0)?;
            if w.numel() != total {
                bail!(ShapeMismatch: "WEIGHTS has {} values, expected {total}", w.numel());
            }
            Some(w)
        } else {
            None
        };
        let mut od = dy.dims().to_vec();
        od[0] = total;
        let (out, outp) = new_tensor(&dev, DataType::Float, &od)?;
        if out.numel() > 0 {
            let (_offs_t, op) = upload_offsets(&dev, &offs)?;
            let wp = w.as_ref().map_or(0, |w| w.ptr);
            let mean = i32::from(red == Red::Mean);
            cuda_launch!(dev, f, grid(out.numel());
                dy.ptr, wp, op, outp, n64(n_seg), n64(total), n64(block), mean)?;
        }
        set_output(ctx, 0, out)
    })))
}

/// SparseLengthsWeightedSum's gradient with `grad_on_weights`: (WEIGHTS, dY, LENGTHS, DATA,
/// INDICES) -> (DATA_grad_values, WEIGHTS_grad).
fn create_weighted_grad_main(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let chk = pair(&dev0, "check_indices")?;
    let rows_f = dev0.function("sparse", "lengths_grad_f32")?;
    let wf = pair(&dev0, "lengths_weight_grad")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let w = input_f32(ctx, &dev, 0)?;
        let dy = input_f32(ctx, &dev, 1)?;
        let len_dims = ctx.input(2)?.dims().to_vec();
        if len_dims.len() != 1 {
            bail!(ShapeMismatch: "LENGTHS must be a vector, got shape {len_dims:?}");
        }
        let offs = offsets(ctx, 2)?;
        let n_lens = offs.len() - 1;
        let data = input_f32(ctx, &dev, 3)?;
        let (n_rows, block) = rows_of(&data.t)?;
        let idx = indices(ctx, &dev, 4)?;
        if let Some(v) = bad_index(&dev, &chk, &idx, n_rows)? {
            bail!(BadArgument: "INDICES element is out of DATA bounds, id={v} axis_dim={n_rows}");
        }
        if dy.dims().is_empty() {
            bail!(ShapeMismatch: "dY must have at least one dimension");
        }
        let (n_seg, dy_block) = rows_of(&dy.t)?;
        if n_seg != n_lens {
            bail!(ShapeMismatch: "dY has {n_seg} rows for {n_lens} lengths");
        }
        if dy_block != block {
            bail!(ShapeMismatch: "dY rows have {dy_block} values, DATA rows {block}");
        }
        let total = total_of(&offs);
        if total != idx.n() {
            bail!(
                ShapeMismatch: "Your input seems to be incorrect: the sum of lengths values should \
                 be the size of the indices tensor, but it appears not. ({total} vs {})",
                idx.n()
            );
        }
        if w.numel() != total {
            bail!(ShapeMismatch: "WEIGHTS has {} values, expected {total}", w.numel());
        }
        let mut od = vec![total];
        od.extend_from_slice(&dy.dims()[1..]);
        let (out, outp) = new_tensor(&dev, DataType::Float, &od)?;
        let (wg, wgp) = new_tensor(&dev, DataType::Float, w.dims())?;
        if total > 0 {
            let (_offs_t, op) = upload_offsets(&dev, &offs)?;
            if out.numel() > 0 {
                cuda_launch!(dev, rows_f, grid(out.numel());
                    dy.ptr, w.ptr, op, outp, n64(n_seg), n64(total), n64(block), 0i32)?;
            }
            cuda_launch!(dev, idx.f(&wf), grid(total);
                dy.ptr, data.ptr, idx.d.ptr, op, wgp, n64(n_seg), n64(total), n64(block),
                n64(n_rows))?;
        }
        set_output(ctx, 0, out)?;
        set_output(ctx, 1, wg)
    })))
}

// -- Scatter ---------------------------------------------------------------------------------

/// DATA[INDICES[k]] = SLICES[k] in place; with repeated indices the last slice wins.
fn create_scatter_assign(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let chk = pair(&dev0, "check_indices")?;
    let owner = pair(&dev0, "scatter_owner")?;
    let fs = [
        pair(&dev0, "scatter_assign_b2")?,
        pair(&dev0, "scatter_assign_b4")?,
        pair(&dev0, "scatter_assign_b8")?,
    ];
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let idx = indices(ctx, &dev, 1)?;
        let slices = input(ctx, &dev, 2)?;
        let x = ctx.input(0)?;
        let dtype = x.dtype();
        let (n_rows, block) = rows_of(x)?;
        let n_idx = idx.n();
        let want = n_idx.checked_mul(block);
        if want != Some(slices.numel()) || slices.t.dtype() != dtype {
            bail!(ShapeMismatch: "SLICES must hold {n_idx} x {block} values of {dtype}");
        }
        let f = match dtype {
            DataType::Float16 => &fs[0],
            DataType::Float | DataType::Int32 => &fs[1],
            DataType::Double | DataType::Int64 => &fs[2],
            other => bail!(DtypeMismatch: "ScatterAssign does not support {other} DATA"),
        };
        if u32::try_from(n_idx).map_or(true, |n| n == u32::MAX) {
            bail!(NotImplemented: "ScatterAssign on CUDA takes fewer than 2^32 - 1 indices");
        }
        if let Some(i) = bad_index(&dev, &chk, &idx, n_rows)? {
            bail!(BadArgument: "Index out of bounds: {i}, range 0 to {n_rows}");
        }
        let yp = update_in_place(ctx, &dev, 0, 0)?;
        let total = slices.numel();
        if total > 0 {
            let own = dev.zeros(DataType::Int32, &[n_rows])?;
            let (ownp, _) = raw(&own)?;
            cuda_launch!(dev, idx.f(&owner), grid(n_idx);
                idx.d.ptr, ownp, n64(n_idx), n64(n_rows))?;
            cuda_launch!(dev, idx.f(f), grid(total);
                yp, slices.ptr, idx.d.ptr, ownp, n64(n_idx), n64(block), n64(n_rows))?;
        }
        Ok(())
    })))
}

/// X0[idx] = X0[idx] * W0 + sum_i X_i * W_i in place, inputs (X0, W0, INDICES, X1, W1, ...).
fn create_scatter_weighted_sum(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let chk = pair(&dev0, "check_indices")?;
    let f = pair(&dev0, "scatter_weighted_sum")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n = ctx.num_inputs();
        if n < 5 || !(n - 3).is_multiple_of(2) {
            bail!(Schema: "ScatterWeightedSum needs (X0, W0, INDICES, X1, W1, ...)");
        }
        let dev = device(ctx)?;
        let weight = |ctx: &OpContext<'_>, i: usize| -> Result<DevIn> {
            if ctx.input(i)?.numel() == 0 {
                bail!(InvalidArgument: "index 0 out of range");
            }
            input_f32(ctx, &dev, i)
        };
        let w0 = weight(ctx, 1)?;
        let idx = indices(ctx, &dev, 2)?;
        let mut xs = Vec::new();
        let mut ws = Vec::new();
        for k in (3..n).step_by(2) {
            xs.push(input_f32(ctx, &dev, k)?);
            ws.push(weight(ctx, k + 1)?);
        }
        let x0 = ctx.input(0)?;
        if x0.dtype() != DataType::Float {
            bail!(DtypeMismatch: "input 0 ('{}') holds {}, expected float", ctx.input_name(0), x0.dtype());
        }
        let (n_rows, block) = rows_of(x0)?;
        if let Some(i) = bad_index(&dev, &chk, &idx, n_rows)? {
            bail!(BadArgument: "Index out of bounds: {i}, range 0 to {n_rows}");
        }
        let yp = update_in_place(ctx, &dev, 0, 0)?;
        let n_idx = idx.n();
        if n_idx > 0 && block > 0 {
            // The terms' addresses, their weights' addresses and their lengths.
            let mut terms: Vec<i64> = xs.iter().map(|x| x.ptr as i64).collect();
            terms.extend(ws.iter().map(|w| w.ptr as i64));
            terms.extend(xs.iter().map(|x| n64(x.numel())));
            let tt = dev.upload(&Tensor::from_slice(&[terms.len()], &terms)?)?;
            let (tp, _) = raw(&tt)?;
            cuda_launch!(dev, idx.f(&f), grid(block);
                yp, w0.ptr, idx.d.ptr, tp, n64(xs.len()), n64(n_idx), n64(block), n64(n_rows))?;
        }
        Ok(())
    })))
}

// -- Dense optimizers ------------------------------------------------------------------------

/// MomentumSGD (grad, moment, lr) -> (grad, moment) and MomentumSGDUpdate (grad, moment, lr,
/// param) -> (grad, moment, param).
fn create_momentum(init: &OpInit<'_>, update: bool) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let f = dev0.function("sparse", "momentum_sgd_f32")?;
    let mu = init.args.float("momentum", 0.0)?;
    let nesterov = i32::from(init.args.bool("nesterov", false)?);
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let lr = lr_input(ctx, &dev, 2)?;
        let g = input_f32(ctx, &dev, 0)?;
        let m = input_f32(ctx, &dev, 1)?;
        if g.numel() != m.numel() {
            bail!(ShapeMismatch: "grad and moment must have the same size");
        }
        let n = g.numel();
        let pp = if update {
            expect_f32(ctx, 3, n, "param must have the size of grad")?;
            update_in_place(ctx, &dev, 3, 2)?
        } else {
            0
        };
        let (ng, ngp) = new_tensor(&dev, DataType::Float, g.dims())?;
        let (nm, nmp) = new_tensor(&dev, DataType::Float, g.dims())?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n);
                g.ptr, m.ptr, lr.ptr, ngp, nmp, pp, mu, nesterov, n64(n))?;
        }
        set_output(ctx, 0, ng)?;
        set_output(ctx, 1, nm)
    })))
}

/// Adagrad (param, moment, grad, lr) -> (param, moment[, effective_lr, update]).
fn create_adagrad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let f = dev0.function("sparse", "adagrad_f32")?;
    let eps = init.args.float("epsilon", 1e-5)?;
    let decay = init.args.float("decay", 1.0)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let lr = lr_input(ctx, &dev, 3)?;
        let g = input_f32(ctx, &dev, 2)?;
        let n = g.numel();
        let what = "param, moment and grad must have the same size";
        expect_f32(ctx, 0, n, what)?;
        expect_f32(ctx, 1, n, what)?;
        let dims = ctx.input(0)?.dims().to_vec();
        let pp = update_in_place(ctx, &dev, 0, 0)?;
        let hp = update_in_place(ctx, &dev, 1, 1)?;
        let eff = optional_out(ctx, &dev, 2, &dims)?;
        let upd = optional_out(ctx, &dev, 3, &dims)?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n);
                pp, hp, g.ptr, lr.ptr, ptr_of(&eff), ptr_of(&upd), eps, decay, n64(n))?;
        }
        store_optional(ctx, 2, eff)?;
        store_optional(ctx, 3, upd)
    })))
}

/// Adam (param, m1, m2, grad, lr, iter) -> (param, m1, m2[, effective grad]).
fn create_adam(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let f = dev0.function("sparse", "adam_f32")?;
    let b1 = init.args.float("beta1", 0.9)?;
    let b2 = init.args.float("beta2", 0.999)?;
    let eps = init.args.float("epsilon", 1e-5)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let lr = lr_input(ctx, &dev, 4)?;
        let it = host_int(ctx, 5, "the iteration input is empty")?;
        let t = it as f32 + 1.0;
        let corr = (1.0 - b2.powf(t)).sqrt() / (1.0 - b1.powf(t));
        let g = input_f32(ctx, &dev, 3)?;
        let n = g.numel();
        let what = "param, moments and grad must have the same size";
        for i in 0..3 {
            expect_f32(ctx, i, n, what)?;
        }
        let pp = update_in_place(ctx, &dev, 0, 0)?;
        let m1 = update_in_place(ctx, &dev, 1, 1)?;
        let m2 = update_in_place(ctx, &dev, 2, 2)?;
        let eg = optional_out(ctx, &dev, 3, g.dims())?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n);
                pp, m1, m2, g.ptr, lr.ptr, ptr_of(&eg), b1, b2, 1.0 - b1, 1.0 - b2, eps, corr,
                n64(n))?;
        }
        store_optional(ctx, 3, eg)
    })))
}

// -- Sparse optimizers -----------------------------------------------------------------------

/// The shape checks of the CPU's `sparse_rows` (indices checked separately): (rows, block).
fn sparse_shapes(
    ctx: &OpContext<'_>,
    param: usize,
    state: &[usize],
    idx: &Idx,
    idx_i: usize,
    grad: usize,
) -> Result<(usize, usize)> {
    let p = ctx.input(param)?;
    let rows = *p.dims().first().ok_or_else(|| {
        err!(
            ShapeMismatch: "input {param} ('{}') must have at least one dimension",
            ctx.input_name(param)
        )
    })?;
    if p.dtype() != DataType::Float {
        bail!(
            DtypeMismatch: "input {param} ('{}') holds {}, expected float on CUDA",
            ctx.input_name(param),
            p.dtype()
        );
    }
    for &s in state {
        let t = ctx.input(s)?;
        if t.numel() != p.numel() {
            bail!(
                ShapeMismatch: "input {s} ('{}') has {} values, expected {} (the size of '{}')",
                ctx.input_name(s),
                t.numel(),
                p.numel(),
                ctx.input_name(param)
            );
        }
        if t.dtype() != DataType::Float {
            bail!(
                DtypeMismatch: "input {s} ('{}') holds {}, expected float on CUDA",
                ctx.input_name(s),
                t.dtype()
            );
        }
    }
    let g = ctx.input(grad)?;
    let block = p.size_from_dim(1);
    let ind = idx.d.dims().len();
    let g_block = if ind <= g.ndim() {
        g.size_from_dim(ind)
    } else {
        usize::MAX
    };
    if g_block != block || Some(g.numel()) != idx.n().checked_mul(block) {
        bail!(
            ShapeMismatch: "'{}' {:?} must be the rows of '{}' {:?} at the indices '{}' {:?}",
            ctx.input_name(grad),
            g.dims(),
            ctx.input_name(param),
            p.dims(),
            ctx.input_name(idx_i),
            idx.d.dims()
        );
    }
    Ok((rows, block))
}

fn range_error(
    ctx: &OpContext<'_>,
    v: i64,
    idx_i: usize,
    param: usize,
    rows: usize,
) -> crate::error::Error {
    err!(
        BadArgument: "index {v} of '{}' out of range for '{}' with {rows} rows",
        ctx.input_name(idx_i),
        ctx.input_name(param)
    )
}

/// SparseAdagrad (param, moment, indices, grad, lr) -> (param, moment).
fn create_sparse_adagrad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let chk = pair(&dev0, "check_indices")?;
    let f = pair(&dev0, "sparse_adagrad")?;
    let eps = init.args.float("epsilon", 1e-5)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let lr = lr_input(ctx, &dev, 4)?;
        let idx = indices(ctx, &dev, 2)?;
        let g = input_f32(ctx, &dev, 3)?;
        let p = ctx.input(0)?;
        let rows = p.dims().first().copied().unwrap_or(0);
        let n = p.numel();
        let block = n.checked_div(rows).unwrap_or(0);
        if idx.n().checked_mul(block) != Some(g.numel()) {
            bail!(
                ShapeMismatch: "grad has {} values, expected {} indices x {block}",
                g.numel(),
                idx.n()
            );
        }
        expect_f32(ctx, 0, n, "param")?;
        expect_f32(ctx, 1, n, "moment must have the size of param")?;
        if let Some(v) = bad_index(&dev, &chk, &idx, rows)? {
            bail!(BadArgument: "Index out of bounds: {v}, range 0 to {rows}");
        }
        let pp = update_in_place(ctx, &dev, 0, 0)?;
        let hp = update_in_place(ctx, &dev, 1, 1)?;
        if idx.n() > 0 && block > 0 {
            cuda_launch!(dev, idx.f(&f), grid(block);
                pp, hp, idx.d.ptr, g.ptr, lr.ptr, eps, n64(idx.n()), n64(block), n64(rows))?;
        }
        Ok(())
    })))
}

/// RowWiseSparseAdagrad (param, moment, indices, grad, lr[, counter]) -> (param, moment).
fn create_rowwise_adagrad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let chk = pair(&dev0, "check_indices")?;
    let f = pair(&dev0, "rowwise_adagrad")?;
    let eps = init.args.float("epsilon", 1e-5)?;
    let wd = init.args.float("weight_decay", 0.0)?;
    let halflife = init.args.int("counter_halflife", -1)? as f64;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let idx = indices(ctx, &dev, 2)?;
        let (rows, block) = sparse_shapes(ctx, 0, &[], &idx, 2, 3)?;
        if let Some(v) = bad_index(&dev, &chk, &idx, rows)? {
            return Err(range_error(ctx, v, 2, 0, rows));
        }
        let h = ctx.input(1)?;
        if h.dtype() != DataType::Float || h.numel() != rows {
            bail!(
                DtypeMismatch: "input 1 ('{}') must hold {rows} float values (one moment per \
                 row), got {} of shape {:?}",
                ctx.input_name(1),
                h.dtype(),
                h.dims()
            );
        }
        let lr = lr_input(ctx, &dev, 4)?;
        let g = input_f32(ctx, &dev, 3)?;
        let counter = if ctx.num_inputs() > 5 {
            let c = ctx.input(5)?;
            if c.dtype() != DataType::Double || c.numel() < rows {
                bail!(
                    ShapeMismatch: "input 5 ('{}') (the counter) must hold at least {rows} double \
                     values, got {} of shape {:?}",
                    ctx.input_name(5),
                    c.dtype(),
                    c.dims()
                );
            }
            Some(input(ctx, &dev, 5)?)
        } else {
            None
        };
        let pp = update_in_place(ctx, &dev, 0, 0)?;
        let hp = update_in_place(ctx, &dev, 1, 1)?;
        if idx.n() > 0 {
            let cp = counter.as_ref().map_or(0, |c| c.ptr);
            cuda_launch!(dev, idx.f(&f), one_block_per_row(1, 256);
                pp, hp, idx.d.ptr, g.ptr, lr.ptr, cp, eps, wd, halflife, n64(idx.n()),
                n64(block), n64(rows))?;
        }
        Ok(())
    })))
}

/// SparseAdam (param, m1, m2, indices, grad, lr, iter) -> (param, m1, m2[, effective grad]).
fn create_sparse_adam(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let chk = pair(&dev0, "check_indices")?;
    let f = pair(&dev0, "sparse_adam")?;
    let b1 = init.args.float("beta1", 0.9)?;
    let b2 = init.args.float("beta2", 0.999)?;
    let eps = init.args.float("epsilon", 1e-5)?;
    let radam = init.args.bool("enableRAdam", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let idx = indices(ctx, &dev, 3)?;
        let (rows, block) = sparse_shapes(ctx, 0, &[1, 2], &idx, 3, 4)?;
        if let Some(v) = bad_index(&dev, &chk, &idx, rows)? {
            return Err(range_error(ctx, v, 3, 0, rows));
        }
        let lr = lr_input(ctx, &dev, 5)?;
        let what = format!("input 6 ('{}') (the iteration) is empty", ctx.input_name(6));
        let iter = host_int(ctx, 6, &what)?;
        // The step's coefficients, t = iter + 1 (as the CPU's AdamStep).
        let t = iter.saturating_add(1) as f64;
        let b1t = (b1 as f64).powf(t);
        let b2t = (b2 as f64).powf(t);
        let corr = (1.0 - b2t).sqrt() / (1.0 - b1t);
        let b1corr = 1.0 / (1.0 - b1t);
        let (mode, rect) = if radam {
            let rho_inf = (2.0 / (1.0 - b2) - 1.0) as f64;
            let rho_t = rho_inf - 2.0 * t * b2t / (1.0 - b2t);
            if rho_t >= 5.0 {
                let r_corr = (rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0))).sqrt();
                (
                    2i32,
                    (((rho_t - 4.0) * (rho_t - 2.0) / rho_t).sqrt() * r_corr) as f32,
                )
            } else {
                (1, 0.0)
            }
        } else {
            (0, 0.0)
        };
        let g = input_f32(ctx, &dev, 4)?;
        let pp = update_in_place(ctx, &dev, 0, 0)?;
        let m1 = update_in_place(ctx, &dev, 1, 1)?;
        let m2 = update_in_place(ctx, &dev, 2, 2)?;
        let eg = optional_out(ctx, &dev, 3, g.dims())?;
        let wide = i32::from(block == 1);
        if idx.n() > 0 && block > 0 {
            cuda_launch!(dev, idx.f(&f), grid(block);
                pp, m1, m2, idx.d.ptr, g.ptr, lr.ptr, ptr_of(&eg), b1, b2, 1.0 - b1, 1.0 - b2,
                eps, corr, b1corr, mode, rect, wide, n64(idx.n()), n64(block), n64(rows))?;
        }
        store_optional(ctx, 3, eg)
    })))
}

/// SparseMomentumSGDUpdate (grad, moment, lr, param, indices) -> (grad, moment, param).
fn create_sparse_momentum(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let chk = pair(&dev0, "check_indices")?;
    let f = pair(&dev0, "sparse_momentum")?;
    let mu = init.args.float("momentum", 0.0)?;
    let nesterov = i32::from(init.args.bool("nesterov", false)?);
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let lr = lr_input(ctx, &dev, 2)?;
        let idx = indices(ctx, &dev, 4)?;
        let (rows, block) = sparse_shapes(ctx, 3, &[1], &idx, 4, 0)?;
        if let Some(v) = bad_index(&dev, &chk, &idx, rows)? {
            return Err(range_error(ctx, v, 4, 3, rows));
        }
        let g = input_f32(ctx, &dev, 0)?;
        let mp = update_in_place(ctx, &dev, 1, 1)?;
        let pp = update_in_place(ctx, &dev, 3, 2)?;
        let (ng, ngp) = new_tensor(&dev, DataType::Float, g.dims())?;
        if idx.n() > 0 && block > 0 {
            cuda_launch!(dev, idx.f(&f), grid(block);
                g.ptr, mp, lr.ptr, pp, idx.d.ptr, ngp, mu, nesterov, n64(idx.n()), n64(block),
                n64(rows))?;
        }
        set_output(ctx, 0, ng)
    })))
}

// -- Recurrent units -------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Lstm,
    Gru,
}

/// (hidden dims, N, D), checking the gates (input `gates_i`) hold N x `gates` D values.
fn unit_sizes(
    ctx: &OpContext<'_>,
    gates_i: usize,
    gates: usize,
) -> Result<(Vec<usize>, usize, usize)> {
    let h = ctx.input(0)?;
    let hd = h.dims().to_vec();
    let d = *hd
        .last()
        .ok_or_else(|| err!(ShapeMismatch: "hidden state must not be 0-d"))?;
    let n = h.numel().checked_div(d).unwrap_or(0);
    let x = ctx.input(gates_i)?;
    if Some(x.numel()) != n.checked_mul(gates).and_then(|v| v.checked_mul(d)) {
        bail!(
            ShapeMismatch: "gates must hold N x {gates}D values (N = {n}, D = {d}), got shape {:?}",
            x.dims()
        );
    }
    Ok((hd, n, d))
}

fn check_len(ctx: &OpContext<'_>, i: usize, len: usize, what: &str) -> Result<()> {
    let t = ctx.input(i)?;
    if t.numel() != len {
        bail!(ShapeMismatch: "{what} must hold N x D = {len} values, got shape {:?}", t.dims());
    }
    Ok(())
}

struct Unit {
    cell: Cell,
    gradient: bool,
    forget_bias: f32,
    drop: i32,
    seq: bool,
    f: CudaFunction,
}

/// The timestep (read on the host) and the sequence lengths on the device (address and
/// whether int64; address 0 without `sequence_lengths`).
struct Steps {
    t: i64,
    lens: Option<DevIn>,
    lens64: i32,
}

impl Steps {
    fn ptr(&self) -> u64 {
        self.lens.as_ref().map_or(0, |l| l.ptr)
    }
}

impl Unit {
    fn steps(
        &self,
        ctx: &OpContext<'_>,
        dev: &Arc<DeviceCtx>,
        seq_i: usize,
        n: usize,
    ) -> Result<Steps> {
        let t_i = seq_i + usize::from(self.seq);
        let t = host_int(ctx, t_i, "timestep input is empty")?;
        if !self.seq {
            return Ok(Steps {
                t,
                lens: None,
                lens64: 0,
            });
        }
        let l = input(ctx, dev, seq_i)?;
        if l.numel() != n {
            bail!(ShapeMismatch: "seq_lengths has {} values, expected N = {n}", l.numel());
        }
        let lens64 = match l.t.dtype() {
            DataType::Int32 => 0,
            DataType::Int64 => 1,
            other => bail!(
                DtypeMismatch: "input {seq_i} ('{}') (seq_lengths) must hold int32 or int64 on \
                 CUDA, got {other}",
                ctx.input_name(seq_i)
            ),
        };
        Ok(Steps {
            t,
            lens: Some(l),
            lens64,
        })
    }

    fn lstm(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dev = device(ctx)?;
        let (hd, n, d) = unit_sizes(ctx, 2, 4)?;
        let nd = n * d;
        check_len(ctx, 1, nd, "the cell state")?;
        let s = self.steps(ctx, &dev, 3, n)?;
        let xd = ctx.input(2)?.dims().to_vec();
        let c_prev = input_f32(ctx, &dev, 1)?;
        let x = input_f32(ctx, &dev, 2)?;
        let (fb, drop, f) = (self.forget_bias, self.drop, &self.f);
        if !self.gradient {
            let h_prev = input_f32(ctx, &dev, 0)?;
            let (h, hp) = new_tensor(&dev, DataType::Float, &hd)?;
            let (c, cp) = new_tensor(&dev, DataType::Float, &hd)?;
            if nd > 0 {
                cuda_launch!(dev, f, grid(nd);
                    h_prev.ptr, c_prev.ptr, x.ptr, s.ptr(), s.lens64, s.t, hp, cp, n64(n), n64(d),
                    fb, drop)?;
            }
            set_output(ctx, 0, h)?;
            return set_output(ctx, 1, c);
        }
        // Inputs after timestep: hidden_t, cell_t, hidden_t_grad, cell_t_grad.
        let b = 4 + usize::from(self.seq);
        for (i, what) in [
            (b + 1, "cell_t"),
            (b + 2, "hidden_t_grad"),
            (b + 3, "cell_t_grad"),
        ] {
            check_len(ctx, i, nd, what)?;
        }
        let c_t = input_f32(ctx, &dev, b + 1)?;
        let dh = input_f32(ctx, &dev, b + 2)?;
        let dc = input_f32(ctx, &dev, b + 3)?;
        let (dh_prev, dhp) = new_tensor(&dev, DataType::Float, &hd)?;
        let (dc_prev, dcp) = new_tensor(&dev, DataType::Float, &hd)?;
        let (dx, dxp) = new_tensor(&dev, DataType::Float, &xd)?;
        if nd > 0 {
            cuda_launch!(dev, f, grid(nd);
                c_prev.ptr, x.ptr, s.ptr(), s.lens64, s.t, c_t.ptr, dh.ptr, dc.ptr, dhp, dcp, dxp,
                n64(n), n64(d), fb, drop)?;
        }
        set_output(ctx, 0, dh_prev)?;
        set_output(ctx, 1, dc_prev)?;
        set_output(ctx, 2, dx)
    }

    fn gru(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dev = device(ctx)?;
        let (hd, n, d) = unit_sizes(ctx, 1, 3)?;
        let nd = n * d;
        let s = self.steps(ctx, &dev, 2, n)?;
        let xd = ctx.input(1)?.dims().to_vec();
        let h_prev = input_f32(ctx, &dev, 0)?;
        let x = input_f32(ctx, &dev, 1)?;
        let (drop, f) = (self.drop, &self.f);
        if !self.gradient {
            let (h, hp) = new_tensor(&dev, DataType::Float, &hd)?;
            if nd > 0 {
                cuda_launch!(dev, f, grid(nd);
                    h_prev.ptr, x.ptr, s.ptr(), s.lens64, s.t, hp, n64(n), n64(d), drop)?;
            }
            return set_output(ctx, 0, h);
        }
        // Inputs after timestep: hidden_t, hidden_t_grad.
        let dh_i = 4 + usize::from(self.seq);
        check_len(ctx, dh_i, nd, "hidden_t_grad")?;
        let dh = input_f32(ctx, &dev, dh_i)?;
        let (dh_prev, dhp) = new_tensor(&dev, DataType::Float, &hd)?;
        let (dx, dxp) = new_tensor(&dev, DataType::Float, &xd)?;
        if nd > 0 {
            cuda_launch!(dev, f, grid(nd);
                h_prev.ptr, x.ptr, s.ptr(), s.lens64, s.t, dh.ptr, dhp, dxp, n64(n), n64(d),
                drop)?;
        }
        set_output(ctx, 0, dh_prev)?;
        set_output(ctx, 1, dx)
    }
}

impl Operator for Unit {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        match self.cell {
            Cell::Lstm => self.lstm(ctx),
            Cell::Gru => self.gru(ctx),
        }
    }
}

fn create_unit(init: &OpInit<'_>, cell: Cell, gradient: bool) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let name = match (cell, gradient) {
        (Cell::Lstm, false) => "lstm_unit_f32",
        (Cell::Lstm, true) => "lstm_unit_grad_f32",
        (Cell::Gru, false) => "gru_unit_f32",
        (Cell::Gru, true) => "gru_unit_grad_f32",
    };
    Ok(Box::new(Unit {
        cell,
        gradient,
        forget_bias: init.args.float("forget_bias", 0.0)?,
        drop: i32::from(init.args.bool("drop_states", false)?),
        seq: init.args.bool("sequence_lengths", true)?,
        f: dev0.function("sparse", name)?,
    }))
}
