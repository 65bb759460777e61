//! FC, FCTransposed and their gradients, MatMul and BatchMatMul, on cuBLAS.

use crate::cuda::op::{device, init_device, input_f32, n64, output_tensor};
use crate::cuda::{grid, grid_rows_cols, BiasPlan, Gemm};
use crate::cuda_launch;
use crate::device::DeviceType;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::DataType;
use crate::{bail, err};

/// Registers the product ops.
pub fn register(r: &mut Registry) {
    r.register("FC", DeviceType::Cuda, "", |i| create_fc(i, false));
    r.register("FCTransposed", DeviceType::Cuda, "", |i| create_fc(i, true));
    r.register("FCGradient", DeviceType::Cuda, "", |i| {
        create_fc_grad(i, false)
    });
    r.register("FCTransposedGradient", DeviceType::Cuda, "", |i| {
        create_fc_grad(i, true)
    });
    r.register("MatMul", DeviceType::Cuda, "", create_matmul);
    r.register("BatchMatMul", DeviceType::Cuda, "", create_batch_matmul);
}

fn canonical(axis: i64, nd: usize) -> Option<usize> {
    let a = if axis < 0 { axis + nd as i64 } else { axis };
    (0..=nd as i64).contains(&a).then_some(a as usize)
}

/// (M, K, N, Y dims) of an FC.
fn fc_sizes(
    x: &[usize],
    w: &[usize],
    axis: i64,
    axis_w: i64,
    transposed: bool,
) -> Result<(usize, usize, usize, Vec<usize>)> {
    let ax = canonical(axis, x.len())
        .ok_or_else(|| err!(BadArgument: "axis {axis} out of range for X of shape {x:?}"))?;
    let axw = canonical(axis_w, w.len())
        .ok_or_else(|| err!(BadArgument: "axis_w {axis_w} out of range for W of shape {w:?}"))?;
    let m: usize = x[..ax].iter().product();
    let k: usize = x[ax..].iter().product();
    let (wa, wb): (usize, usize) = (w[..axw].iter().product(), w[axw..].iter().product());
    let (n, kw) = if transposed { (wb, wa) } else { (wa, wb) };
    if k != kw {
        bail!(ShapeMismatch: "Dimension mismatch: X: {x:?}, W: {w:?} (K = {k} from X, {kw} from W)");
    }
    let mut y = x[..ax].to_vec();
    y.push(n);
    Ok((m, k, n, y))
}

fn create_fc(init: &OpInit<'_>, transposed: bool) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let bias = dev0.function("elementwise", "add_row_bias_f32")?;
    let axis = init.args.int("axis", 1)?;
    let axis_w = init.args.int("axis_w", 1)?;
    // The bias in the product's epilogue (cuBLASLt) unless FERROCAFFE_CUBLASLT=0.
    let fused = std::env::var("FERROCAFFE_CUBLASLT").map_or(true, |v| v != "0");
    let mut plan: Option<BiasPlan> = None;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let w = input_f32(ctx, &dev, 1)?;
        let b = input_f32(ctx, &dev, 2)?;
        let (m, k, n, ydims) = fc_sizes(x.dims(), w.dims(), axis, axis_w, transposed)?;
        if b.numel() != n {
            bail!(ShapeMismatch: "bias of {} elements for an FC with {n} outputs", b.numel());
        }
        let yp = output_tensor(ctx, &dev, 0, DataType::Float, &ydims)?;
        if k == 0 {
            // No inputs per row: every row of Y is the bias, as on the CPU (Caffe2 returns
            // early and leaves Y as allocated, whatever its memory held).
            dev.fill_zero(yp, m * n)?;
            if m * n > 0 {
                cuda_launch!(dev, bias, grid_rows_cols(m, n); yp, b.ptr, n64(m), n64(n))?;
            }
        } else if m * n > 0 {
            let g = Gemm {
                trans_a: false,
                trans_b: !transposed,
                m,
                n,
                k,
                alpha: 1.0,
                beta: 0.0,
            };
            if !(fused && dev.sgemm_bias(&mut plan, g, x.ptr, w.ptr, b.ptr, yp)?) {
                dev.sgemm(g, x.ptr, w.ptr, yp)?;
                cuda_launch!(dev, bias, grid_rows_cols(m, n); yp, b.ptr, n64(m), n64(n))?;
            }
        }
        Ok(())
    })))
}

fn create_fc_grad(init: &OpInit<'_>, transposed: bool) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let colsum = dev0.function("elementwise", "col_sum_f32")?;
    let axis = init.args.int("axis", 1)?;
    let axis_w = init.args.int("axis_w", 1)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let w = input_f32(ctx, &dev, 1)?;
        let dy = input_f32(ctx, &dev, 2)?;
        let (m, k, n, _) = fc_sizes(x.dims(), w.dims(), axis, axis_w, transposed)?;
        if dy.numel() != m * n {
            bail!(ShapeMismatch: "dY of shape {:?} for an FC of {m} x {n} outputs", dy.dims());
        }
        // dW = dY^T X ([n, k]) or X^T dY ([k, n]) when transposed.
        let dwp = output_tensor(ctx, &dev, 0, DataType::Float, w.dims())?;
        if transposed {
            let g = Gemm {
                trans_a: true,
                trans_b: false,
                m: k,
                n,
                k: m,
                alpha: 1.0,
                beta: 0.0,
            };
            dev.sgemm_or_zero(g, x.ptr, dy.ptr, dwp)?;
        } else {
            let g = Gemm {
                trans_a: true,
                trans_b: false,
                m: n,
                n: k,
                k: m,
                alpha: 1.0,
                beta: 0.0,
            };
            dev.sgemm_or_zero(g, dy.ptr, x.ptr, dwp)?;
        }
        let dbp = output_tensor(ctx, &dev, 1, DataType::Float, &[n])?;
        if n > 0 {
            cuda_launch!(dev, colsum, grid(n); dy.ptr, dbp, n64(m), n64(n))?;
        }
        if ctx.num_outputs() > 2 {
            // dX = dY W ([m, k]) or dY W^T.
            let dxp = output_tensor(ctx, &dev, 2, DataType::Float, x.dims())?;
            let g = Gemm {
                trans_a: false,
                trans_b: transposed,
                m,
                n: k,
                k: n,
                alpha: 1.0,
                beta: 0.0,
            };
            dev.sgemm_or_zero(g, dy.ptr, w.ptr, dxp)?;
        }
        Ok(())
    })))
}

fn create_matmul(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    init_device(init)?;
    let axis_a = init.args.int("axis_a", 1)?;
    let axis_b = init.args.int("axis_b", 1)?;
    let ta = init.args.int("trans_a", 0)? != 0;
    let tb = init.args.int("trans_b", 0)? != 0;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let a = input_f32(ctx, &dev, 0)?;
        let b = input_f32(ctx, &dev, 1)?;
        let flat = |d: &[usize], ax: i64, what: &str| -> Result<(usize, usize)> {
            let c = canonical(ax, d.len()).ok_or_else(
                || err!(BadArgument: "axis {ax} out of range for {what} of shape {d:?}"),
            )?;
            Ok((d[..c].iter().product(), d[c..].iter().product()))
        };
        let (a0, a1) = flat(a.dims(), axis_a, "A")?;
        let (b0, b1) = flat(b.dims(), axis_b, "B")?;
        let (m, k) = if ta { (a1, a0) } else { (a0, a1) };
        let (kb, n) = if tb { (b1, b0) } else { (b0, b1) };
        if k != kb {
            bail!(
                ShapeMismatch: "Matrix dimension mismatch: A {:?} gives K = {k}, B {:?} gives K = {kb}",
                a.dims(),
                b.dims()
            );
        }
        // A third input (as gradient ops pass) gives the output its shape.
        let mut ydims = vec![m, n];
        if ctx.num_inputs() > 2 {
            let like = ctx.input(2)?.dims().to_vec();
            if like.iter().product::<usize>() != m * n {
                bail!(ShapeMismatch: "MatMul output of {m} x {n} cannot take the shape {like:?}");
            }
            ydims = like;
        }
        let yp = output_tensor(ctx, &dev, 0, DataType::Float, &ydims)?;
        let g = Gemm {
            trans_a: ta,
            trans_b: tb,
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
        };
        dev.sgemm_or_zero(g, a.ptr, b.ptr, yp)?;
        Ok(())
    })))
}

fn create_batch_matmul(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    init_device(init)?;
    let ta = init.args.int("trans_a", 0)? != 0;
    let tb = init.args.int("trans_b", 0)? != 0;
    let broadcast = init.args.int("broadcast", 0)? != 0;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let a = input_f32(ctx, &dev, 0)?;
        let b = input_f32(ctx, &dev, 1)?;
        let (ad, bd) = (a.dims().to_vec(), b.dims().to_vec());
        if ad.len() < 2 || bd.len() < 2 {
            bail!(NotImplemented: "BatchMatMul on CUDA needs A and B of rank >= 2 (got {ad:?} and {bd:?})");
        }
        let (ra, rb) = (ad.len(), bd.len());
        // Batch dims: equal, or one side a single matrix broadcast over the other's batch.
        let (batch_dims, sa, sb) = if ad[..ra - 2] == bd[..rb - 2] {
            (ad[..ra - 2].to_vec(), true, true)
        } else if rb == 2 && broadcast {
            (ad[..ra - 2].to_vec(), true, false)
        } else if ra == 2 && broadcast {
            (bd[..rb - 2].to_vec(), false, true)
        } else {
            bail!(ShapeMismatch: "BatchMatMul batch dims differ: A {ad:?}, B {bd:?}");
        };
        let batch: usize = batch_dims.iter().product();
        let (m, k) = if ta {
            (ad[ra - 1], ad[ra - 2])
        } else {
            (ad[ra - 2], ad[ra - 1])
        };
        let (kb, n) = if tb {
            (bd[rb - 1], bd[rb - 2])
        } else {
            (bd[rb - 2], bd[rb - 1])
        };
        if k != kb {
            bail!(ShapeMismatch: "BatchMatMul inner dims differ: A {ad:?}, B {bd:?} (K = {k} vs {kb})");
        }
        let mut ydims = batch_dims;
        ydims.extend([m, n]);
        let yp = output_tensor(ctx, &dev, 0, DataType::Float, &ydims)?;
        let g = Gemm {
            trans_a: ta,
            trans_b: tb,
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
        };
        if k == 0 {
            dev.fill_zero(yp, batch * m * n)?;
        } else {
            dev.sgemm_batched(
                g,
                a.ptr,
                if sa { m * k } else { 0 },
                b.ptr,
                if sb { k * n } else { 0 },
                yp,
                m * n,
                batch,
            )?;
        }
        Ok(())
    })))
}
