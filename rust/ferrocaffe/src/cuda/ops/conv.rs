//! CUDA kernels of the `conv` family (see kernels/conv.cu): 2-d Conv and ConvGradient by
//! im2col / col2im and cuBLAS products (NCHW and NHWC, groups, strides, padding, dilation; a
//! direct kernel for depthwise Conv), and 2-d MaxPool / AveragePool with their gradients.
//!
//! The argument parsing and output sizes are the CPU kernels' ([`Geometry`]); the checks and
//! error kinds mirror `ops/cpu/conv.rs` and `ops/cpu/pool.rs`.
//!
//! When cuDNN is present (and `FERROCAFFE_CUDNN` is not `0` when the op is created), 2-d
//! float32 Conv and ConvGradient with symmetric padding run on cuDNN instead (see
//! [`CudnnPlan`]); empty tensors, asymmetric padding, sizes beyond cuDNN's 32-bit dims, and
//! shapes the heuristics offer no FMA-math algorithm for stay on the kernels below.
//!
//! Column matrices: NCHW `col[b][(c * kh + ki) * kw + kj][p]` per image (group `gi`'s rows
//! are a contiguous block), products per image and group; NHWC group-major
//! `col[g][b][p][(ki * kw + kj) * cg + ci]`, so one product per group covers every image of a
//! chunk (grouped outputs are shuffled to and from `[b][p][g * mg + j]`). Images go in chunks
//! that keep the column matrix under [`COL_CAP`] floats.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cudnn::sys as dnn;
use cudarc::driver::CudaFunction;

use crate::cuda::cudnn::{
    check, usable_algo, ConvDesc, ConvParams, FilterDesc, Layout, TensorDesc,
};
use crate::cuda::op::{device, init_device, input_f32, n64, new_tensor, set_output};
use crate::cuda::{grid, rows, Cudnn, DeviceCtx, Gemm};
use crate::cuda_launch;
use crate::device::DeviceType;
use crate::error::Result;
use crate::ops::cpu::conv_args::{Geometry, Order};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::DataType;
use crate::{bail, err};

/// Floats of the column buffer per chunk of images (at least one image per chunk).
const COL_CAP: usize = 1 << 25;

/// Registers Conv, ConvGradient, MaxPool, AveragePool and their gradients (and the `2D`
/// aliases the CPU registers).
pub fn register(r: &mut Registry) {
    r.register("Conv", DeviceType::Cuda, "", |i| create_conv(i, false));
    r.register("Conv2D", DeviceType::Cuda, "", |i| create_conv(i, false));
    r.register("ConvGradient", DeviceType::Cuda, "", |i| {
        create_conv(i, true)
    });
    r.register("Conv2DGradient", DeviceType::Cuda, "", |i| {
        create_conv(i, true)
    });
    r.register("MaxPool", DeviceType::Cuda, "", |i| {
        create_pool(i, true, false)
    });
    r.register("MaxPool2D", DeviceType::Cuda, "", |i| {
        create_pool(i, true, false)
    });
    r.register("AveragePool", DeviceType::Cuda, "", |i| {
        create_pool(i, false, false)
    });
    r.register("AveragePool2D", DeviceType::Cuda, "", |i| {
        create_pool(i, false, false)
    });
    r.register("MaxPoolGradient", DeviceType::Cuda, "", |i| {
        create_pool(i, true, true)
    });
    r.register("MaxPool2DGradient", DeviceType::Cuda, "", |i| {
        create_pool(i, true, true)
    });
    r.register("AveragePoolGradient", DeviceType::Cuda, "", |i| {
        create_pool(i, false, true)
    });
    r.register("AveragePool2DGradient", DeviceType::Cuda, "", |i| {
        create_pool(i, false, true)
    });
}

/// The device address `elems` floats after `p` (inside a live tensor).
fn at(p: u64, elems: usize) -> u64 {
    p.saturating_add((elems as u64).saturating_mul(4))
}

/// The product of `v`, or an error when it overflows.
fn prod(v: &[usize]) -> Result<usize> {
    v.iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| err!(ShapeMismatch: "sizes {v:?} overflow"))
}

// ---------------------------------------------------------------------------------------
// Conv

/// Sizes of one convolution.
#[derive(Clone, Copy, Debug)]
struct Dims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    m: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    group: usize,
}

impl Dims {
    fn cg(&self) -> usize {
        self.c / self.group
    }
    fn mg(&self) -> usize {
        self.m / self.group
    }
    /// Rows of one group's column matrix.
    fn kd(&self) -> Result<usize> {
        prod(&[self.cg(), self.kh, self.kw])
    }
    /// Output positions per image.
    fn so(&self) -> Result<usize> {
        prod(&[self.oh, self.ow])
    }
}

/// The kernels a Conv or ConvGradient uses.
struct ConvKernels {
    im2col: CudaFunction,
    col2im: CudaFunction,
    ungroup: CudaFunction,
    group_rows: CudaFunction,
    bias_add: CudaFunction,
    bias_grad: CudaFunction,
    depthwise: CudaFunction,
}

struct Conv {
    g: Geometry,
    group: usize,
    no_bias: bool,
    gradient: bool,
    k: ConvKernels,
    /// The device's cuDNN when this op may use it (present, not turned off when the op was
    /// made, symmetric padding).
    cudnn: Option<Arc<Cudnn>>,
    /// cuDNN plans by (X dims, W dims); None where the shape stays on the kernels.
    plans: HashMap<(Vec<usize>, Vec<usize>), Option<CudnnPlan>>,
    /// Forward shapes whose path (cuDNN or the kernels) has been chosen by timing both.
    timed: std::collections::HashSet<(Vec<usize>, Vec<usize>)>,
}

/// A strided family of row-major matrices: image `i`, group `j` at `p + i * img + j * grp`
/// floats.
#[derive(Clone, Copy)]
struct Mats {
    p: u64,
    img: usize,
    grp: usize,
}

/// `nimg * ngrp` products `C[i, j] = op(A[i, j]) op(B[i, j])` as strided batches: batched
/// over images (one call per group) when C differs between images and there are at least as
/// many images as groups, else over groups (one call per image; images accumulating into one
/// C, `img` 0 with beta 1, stay in order).
fn grouped(
    dev: &DeviceCtx,
    g: Gemm,
    a: Mats,
    b: Mats,
    c: Mats,
    nimg: usize,
    ngrp: usize,
) -> Result<()> {
    if c.img != 0 && nimg >= ngrp {
        for j in 0..ngrp {
            dev.sgemm_batched(
                g,
                at(a.p, j * a.grp),
                a.img,
                at(b.p, j * b.grp),
                b.img,
                at(c.p, j * c.grp),
                c.img,
                nimg,
            )?;
        }
    } else {
        for i in 0..nimg {
            dev.sgemm_batched(
                g,
                at(a.p, i * a.img),
                a.grp,
                at(b.p, i * b.img),
                b.grp,
                at(c.p, i * c.img),
                c.grp,
                ngrp,
            )?;
        }
    }
    Ok(())
}

/// A product shape.
fn gemm(trans_a: bool, trans_b: bool, m: usize, n: usize, k: usize, beta: f32) -> Gemm {
    Gemm {
        trans_a,
        trans_b,
        m,
        n,
        k,
        alpha: 1.0,
        beta,
    }
}

impl Conv {
    /// The CPU kernel's shape checks.
    fn dims(&self, xd: &[usize], wd: &[usize]) -> Result<Dims> {
        let (n, c, h, w) = self.g.nchw(xd)?;
        if wd.len() != 4 {
            bail!(ShapeMismatch: "filter must be 4-d, got {wd:?}");
        }
        let (m, wc, kh, kw) = match self.g.order {
            Order::Nchw => (wd[0], wd[1], wd[2], wd[3]),
            Order::Nhwc => (wd[0], wd[3], wd[1], wd[2]),
        };
        if wc.checked_mul(self.group) != Some(c) {
            bail!(
                ShapeMismatch: "Convolution op: input channels does not match: # of input \
                 channels {c} is not equal to kernel channels * group: {wc}*{}",
                self.group
            );
        }
        if m % self.group != 0 {
            bail!(
                ShapeMismatch: "The number of output channels {m} is not divisible by group {}",
                self.group
            );
        }
        for (i, (&k, &gk)) in [kh, kw].iter().zip(&self.g.kernel).enumerate() {
            if gk != 0 && gk != k {
                bail!(ShapeMismatch: "kernel argument {gk} disagrees with filter dim {i}: {k}");
            }
        }
        let (oh, ow) = self.g.out_size(h, w, kh, kw)?;
        Ok(Dims {
            n,
            c,
            h,
            w,
            m,
            kh,
            kw,
            oh,
            ow,
            group: self.group,
        })
    }

    /// Whether the column matrix is the input itself (1x1, stride 1, no padding; NHWC only
    /// with one group).
    fn direct(&self, d: &Dims) -> bool {
        d.kh == 1
            && d.kw == 1
            && self.g.stride == [1, 1]
            && self.g.pad == [0, 0, 0, 0]
            && (self.g.order == Order::Nchw || d.group == 1)
    }

    /// (images per chunk, floats of a chunk's column matrix, floats per image's columns).
    fn chunking(&self, d: &Dims) -> Result<(usize, usize, usize)> {
        let per_img = prod(&[d.c, d.kh, d.kw, d.oh, d.ow])?;
        if self.direct(d) {
            return Ok((d.n.max(1), 0, per_img));
        }
        let nb = (COL_CAP / per_img.max(1)).clamp(1, d.n.max(1));
        Ok((nb, prod(&[nb, per_img])?, per_img))
    }

    /// Launches im2col of images `[i0, i0 + nb)` of `x` into `col`.
    fn im2col(&self, dev: &DeviceCtx, d: &Dims, xc: u64, col: u64, nb: usize) -> Result<()> {
        let total = prod(&[nb, d.c, d.kh, d.kw, d.oh, d.ow])?;
        if total == 0 {
            return Ok(());
        }
        let g = &self.g;
        let (c, h, w, oh, ow) = (n64(d.c), n64(d.h), n64(d.w), n64(d.oh), n64(d.ow));
        let (kh, kw, sh, sw) = (n64(d.kh), n64(d.kw), n64(g.stride[0]), n64(g.stride[1]));
        let (pt, pl, dh, dw) = (
            n64(g.pad[0]),
            n64(g.pad[1]),
            n64(g.dilation[0]),
            n64(g.dilation[1]),
        );
        match g.order {
            Order::Nchw => cuda_launch!(dev, self.k.im2col, grid(total);
                xc, col, n64(nb), c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw),
            Order::Nhwc => cuda_launch!(dev, self.k.im2col, grid(total);
                xc, col, n64(nb), c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw,
                n64(d.group)),
        }
    }

    /// Launches col2im of `col` into images `[i0, i0 + nb)` of `dx` (written, not added).
    fn col2im(&self, dev: &DeviceCtx, d: &Dims, col: u64, dxc: u64, nb: usize) -> Result<()> {
        let total = prod(&[nb, d.c, d.h, d.w])?;
        if total == 0 {
            return Ok(());
        }
        let g = &self.g;
        let (c, h, w, oh, ow) = (n64(d.c), n64(d.h), n64(d.w), n64(d.oh), n64(d.ow));
        let (kh, kw, sh, sw) = (n64(d.kh), n64(d.kw), n64(g.stride[0]), n64(g.stride[1]));
        let (pt, pl, dh, dw) = (
            n64(g.pad[0]),
            n64(g.pad[1]),
            n64(g.dilation[0]),
            n64(g.dilation[1]),
        );
        match g.order {
            Order::Nchw => cuda_launch!(dev, self.k.col2im, grid(total);
                col, dxc, n64(nb), c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw),
            Order::Nhwc => cuda_launch!(dev, self.k.col2im, grid(total);
                col, dxc, n64(nb), c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw,
                n64(d.group)),
        }
    }

    fn forward(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let w = input_f32(ctx, &dev, 1)?;
        let d = self.dims(x.dims(), w.dims())?;
        let bias = if ctx.num_inputs() > 2 {
            let b = input_f32(ctx, &dev, 2)?;
            if b.numel() != d.m {
                bail!(ShapeMismatch: "bias has {} values, expected {}", b.numel(), d.m);
            }
            Some(b)
        } else {
            None
        };
        let y_dims = self.g.dims(d.n, d.m, d.oh, d.ow);
        let (y, yp) = new_tensor(&dev, DataType::Float, &y_dims)?;
        let ny = y.numel();
        self.prepare(&dev, &d, x.dims(), w.dims(), false)?;
        let b = bias.as_ref().map(|b| b.ptr);
        let key = (x.dims().to_vec(), w.dims().to_vec());
        if !self.timed.contains(&key) {
            if let Some((cd, plan)) = self.planned(x.dims(), w.dims()) {
                // cuDNN's heuristic choice is not always faster than the kernels here
                // (depthwise and 1x1 convolutions, small images): time both once for this
                // shape, keep the faster.
                let t_dnn = self.time(&dev, || {
                    self.forward_cudnn(&dev, &d, (cd, plan), x.ptr, w.ptr, b, yp, ny)
                })?;
                let t_ker = self.time(&dev, || {
                    self.forward_kernels(&dev, &d, x.ptr, w.ptr, b, yp, ny)
                })?;
                if t_ker <= t_dnn {
                    self.plans.insert(key.clone(), None);
                }
            }
            self.timed.insert(key);
        }
        if let Some(p) = self.planned(x.dims(), w.dims()) {
            self.forward_cudnn(&dev, &d, p, x.ptr, w.ptr, b, yp, ny)?;
        } else {
            self.forward_kernels(&dev, &d, x.ptr, w.ptr, b, yp, ny)?;
        }
        set_output(ctx, 0, y)
    }

    /// Seconds per call of `f` (three calls after one, the device synchronised around them).
    fn time(&self, dev: &Arc<DeviceCtx>, f: impl Fn() -> Result<()>) -> Result<f64> {
        f()?;
        dev.synchronize()?;
        let t0 = std::time::Instant::now();
        for _ in 0..3 {
            f()?;
        }
        dev.synchronize()?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Y = conv(X, W) (+ bias) on cuDNN (the plan must exist).
    #[allow(clippy::too_many_arguments)]
    fn forward_cudnn(
        &self,
        dev: &Arc<DeviceCtx>,
        d: &Dims,
        (cd, plan): (&Cudnn, &CudnnPlan),
        x: u64,
        w: u64,
        bias: Option<u64>,
        yp: u64,
        ny: usize,
    ) -> Result<()> {
        plan.forward(dev, cd, x, w, yp)?;
        if let Some(b) = bias {
            self.add_bias(dev, d, b, yp, ny)?;
        }
        Ok(())
    }

    /// Y = conv(X, W) (+ bias) on the kernels (direct depthwise, or im2col + cuBLAS).
    #[allow(clippy::too_many_arguments)]
    fn forward_kernels(
        &self,
        dev: &Arc<DeviceCtx>,
        d: &Dims,
        x: u64,
        w: u64,
        bias: Option<u64>,
        yp: u64,
        ny: usize,
    ) -> Result<()> {
        if ny == 0 {
            return Ok(());
        }
        if d.group == d.c && d.m == d.c {
            self.depthwise(dev, d, x, w, bias, yp, ny)
        } else {
            self.products(dev, d, x, w, yp)?;
            match bias {
                Some(b) => self.add_bias(dev, d, b, yp, ny),
                None => Ok(()),
            }
        }
    }

    /// Y += the bias of each output channel.
    fn add_bias(&self, dev: &Arc<DeviceCtx>, d: &Dims, b: u64, yp: u64, ny: usize) -> Result<()> {
        if ny == 0 {
            return Ok(());
        }
        let inner = match self.g.order {
            Order::Nchw => d.so()?,
            Order::Nhwc => 1,
        };
        cuda_launch!(dev, self.k.bias_add, grid(ny);
            yp, b, n64(ny), n64(inner), n64(d.m))
    }

    /// Makes the cuDNN plan for these shapes on first sight of them (when this op may use
    /// cuDNN).
    fn prepare(
        &mut self,
        dev: &Arc<DeviceCtx>,
        d: &Dims,
        xd: &[usize],
        wd: &[usize],
        want_dx: bool,
    ) -> Result<()> {
        let Some(cd) = &self.cudnn else {
            return Ok(());
        };
        let key = (xd.to_vec(), wd.to_vec());
        if !self.plans.contains_key(&key) {
            let p = CudnnPlan::new(dev, cd, &self.g, d, self.gradient, want_dx)?;
            self.plans.insert(key, p);
        }
        Ok(())
    }

    /// The handle and the cuDNN plan for these shapes ([`prepare`](Self::prepare)d before);
    /// None when they stay on the kernels.
    fn planned(&self, xd: &[usize], wd: &[usize]) -> Option<(&Cudnn, &CudnnPlan)> {
        let cd = self.cudnn.as_deref()?;
        let p = self.plans.get(&(xd.to_vec(), wd.to_vec()))?.as_ref()?;
        Some((cd, p))
    }

    /// Depthwise Conv (groups = C = M) directly, bias included.
    #[allow(clippy::too_many_arguments)]
    fn depthwise(
        &self,
        dev: &Arc<DeviceCtx>,
        d: &Dims,
        x: u64,
        w: u64,
        bias: Option<u64>,
        yp: u64,
        ny: usize,
    ) -> Result<()> {
        let g = &self.g;
        let (c, h, wd, oh, ow) = (n64(d.c), n64(d.h), n64(d.w), n64(d.oh), n64(d.ow));
        let (kh, kw, sh, sw) = (n64(d.kh), n64(d.kw), n64(g.stride[0]), n64(g.stride[1]));
        let (pt, pl, dh, dw) = (
            n64(g.pad[0]),
            n64(g.pad[1]),
            n64(g.dilation[0]),
            n64(g.dilation[1]),
        );
        let nhwc = i64::from(g.order == Order::Nhwc);
        let has_bias = i64::from(bias.is_some());
        cuda_launch!(dev, self.k.depthwise, grid(ny);
            x, w, bias.unwrap_or(0), yp, n64(d.n), c, h, wd, oh, ow, kh, kw, sh, sw, pt, pl,
            dh, dw, nhwc, has_bias)
    }

    /// Y (without bias) by im2col and products, in chunks of images.
    fn products(&self, dev: &Arc<DeviceCtx>, d: &Dims, x: u64, w: u64, yp: u64) -> Result<()> {
        let (kd, so, mg) = (d.kd()?, d.so()?, d.mg());
        let ny = prod(&[d.n, d.m, so])?;
        if kd == 0 {
            return dev.fill_zero(yp, ny);
        }
        let (nb_max, col_len, per_img) = self.chunking(d)?;
        let direct = self.direct(d);
        let col = new_tensor(dev, DataType::Float, &[col_len])?;
        let grouped_nhwc = self.g.order == Order::Nhwc && d.group > 1;
        let tmp_len = if grouped_nhwc {
            prod(&[nb_max, so, d.m])?
        } else {
            0
        };
        let tmp = new_tensor(dev, DataType::Float, &[tmp_len])?;
        let img_in = prod(&[d.c, d.h, d.w])?;
        let img_out = prod(&[d.m, so])?;
        let mut i0 = 0;
        while i0 < d.n {
            let nb = nb_max.min(d.n - i0);
            let xc = at(x, i0 * img_in);
            let yc = at(yp, i0 * img_out);
            let colp = if direct {
                xc
            } else {
                self.im2col(dev, d, xc, col.1, nb)?;
                col.1
            };
            match self.g.order {
                Order::Nchw => grouped(
                    dev,
                    gemm(false, false, mg, so, kd, 0.0),
                    Mats {
                        p: w,
                        img: 0,
                        grp: mg * kd,
                    },
                    Mats {
                        p: colp,
                        img: per_img,
                        grp: kd * so,
                    },
                    Mats {
                        p: yc,
                        img: img_out,
                        grp: mg * so,
                    },
                    nb,
                    d.group,
                )?,
                Order::Nhwc => {
                    let rows_n = nb * so;
                    let out = if grouped_nhwc { tmp.1 } else { yc };
                    dev.sgemm_batched(
                        gemm(false, true, rows_n, mg, kd, 0.0),
                        colp,
                        rows_n * kd,
                        w,
                        mg * kd,
                        out,
                        rows_n * mg,
                        d.group,
                    )?;
                    if grouped_nhwc {
                        let total = rows_n * d.m;
                        cuda_launch!(dev, self.k.ungroup, grid(total);
                            tmp.1, yc, n64(rows_n), n64(d.m), n64(mg))?;
                    }
                }
            }
            i0 += nb;
        }
        Ok(())
    }

    /// Inputs (X, W, dY); outputs (dW, db, dX) or, with no_bias, (dW, dX); dX optional.
    fn backward(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let w = input_f32(ctx, &dev, 1)?;
        let d = self.dims(x.dims(), w.dims())?;
        let dy = input_f32(ctx, &dev, 2)?;
        let y_dims = self.g.dims(d.n, d.m, d.oh, d.ow);
        if dy.dims() != y_dims.as_slice() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let want_dx = ctx.num_outputs() > if self.no_bias { 1 } else { 2 };
        let (dw, dwp) = new_tensor(&dev, DataType::Float, w.dims())?;
        let dx = if want_dx {
            let (t, p) = new_tensor(&dev, DataType::Float, x.dims())?;
            Some((t, p))
        } else {
            None
        };
        self.prepare(&dev, &d, x.dims(), w.dims(), want_dx)?;
        if let Some((cd, plan)) = self.planned(x.dims(), w.dims()) {
            // Every size is positive here: dW and dX are written whole.
            let dxp = dx.as_ref().map(|t| t.1);
            plan.backward(&dev, cd, x.ptr, w.ptr, dy.ptr, dwp, dxp)?;
        } else {
            dev.fill_zero(dwp, dw.numel())?;
            if let Some((t, p)) = &dx {
                if d.mg() == 0 {
                    dev.fill_zero(*p, t.numel())?;
                }
            }
            let dxp = dx.as_ref().filter(|_| d.mg() > 0).map(|t| t.1);
            self.backward_products(&dev, &d, x.ptr, w.ptr, dy.ptr, dwp, dxp)?;
        }
        set_output(ctx, 0, dw)?;
        let mut next = 1;
        if !self.no_bias {
            let (db, dbp) = new_tensor(&dev, DataType::Float, &[d.m])?;
            let so = d.so()?;
            let (outer, inner) = match self.g.order {
                Order::Nchw => (d.n, so),
                Order::Nhwc => (prod(&[d.n, so])?, 1),
            };
            if prod(&[outer, inner])? == 0 {
                dev.fill_zero(dbp, d.m)?;
            } else if d.m > 0 {
                cuda_launch!(dev, self.k.bias_grad, rows(d.m, 256);
                    dy.ptr, dbp, n64(outer), n64(d.m), n64(inner))?;
            }
            set_output(ctx, 1, db)?;
            next = 2;
        }
        if let Some((t, _)) = dx {
            set_output(ctx, next, t)?;
        }
        Ok(())
    }

    /// dW (zeroed before) += the products of each chunk; dX (when `dxp` is given) written.
    #[allow(clippy::too_many_arguments)]
    fn backward_products(
        &self,
        dev: &Arc<DeviceCtx>,
        d: &Dims,
        x: u64,
        w: u64,
        dy: u64,
        dwp: u64,
        dxp: Option<u64>,
    ) -> Result<()> {
        let (kd, so, mg) = (d.kd()?, d.so()?, d.mg());
        if d.n == 0 || kd == 0 || mg == 0 {
            // Nothing to accumulate into dW (zeros); dX is empty (C = 0) or zeros (M = 0),
            // written by the caller.
            return Ok(());
        }
        let (nb_max, col_len, per_img) = self.chunking(d)?;
        let direct = self.direct(d);
        let col = new_tensor(dev, DataType::Float, &[col_len])?;
        let grouped_nhwc = self.g.order == Order::Nhwc && d.group > 1;
        let tmp_len = if grouped_nhwc {
            prod(&[nb_max, so, d.m])?
        } else {
            0
        };
        let tmp = new_tensor(dev, DataType::Float, &[tmp_len])?;
        let img_in = prod(&[d.c, d.h, d.w])?;
        let img_out = prod(&[d.m, so])?;
        let mut i0 = 0;
        while i0 < d.n {
            let nb = nb_max.min(d.n - i0);
            let xc = at(x, i0 * img_in);
            let dyc = at(dy, i0 * img_out);
            let dxc = dxp.map(|p| at(p, i0 * img_in));
            let colp = if direct {
                xc
            } else {
                self.im2col(dev, d, xc, col.1, nb)?;
                col.1
            };
            // Where dX's column matrix goes: dX itself when the columns are the input.
            let dcol = if direct { dxc } else { dxc.map(|_| col.1) };
            match self.g.order {
                Order::Nchw => {
                    // dW_g += dY[b, g] col[b, g]^T
                    grouped(
                        dev,
                        gemm(false, true, mg, kd, so, 1.0),
                        Mats {
                            p: dyc,
                            img: img_out,
                            grp: mg * so,
                        },
                        Mats {
                            p: colp,
                            img: per_img,
                            grp: kd * so,
                        },
                        Mats {
                            p: dwp,
                            img: 0,
                            grp: mg * kd,
                        },
                        nb,
                        d.group,
                    )?;
                    if let Some(dc) = dcol {
                        // dcol[b, g] = W_g^T dY[b, g]
                        grouped(
                            dev,
                            gemm(true, false, kd, so, mg, 0.0),
                            Mats {
                                p: w,
                                img: 0,
                                grp: mg * kd,
                            },
                            Mats {
                                p: dyc,
                                img: img_out,
                                grp: mg * so,
                            },
                            Mats {
                                p: dc,
                                img: per_img,
                                grp: kd * so,
                            },
                            nb,
                            d.group,
                        )?;
                    }
                }
                Order::Nhwc => {
                    let rows_n = nb * so;
                    let dyg = if grouped_nhwc {
                        let total = rows_n * d.m;
                        cuda_launch!(dev, self.k.group_rows, grid(total);
                            dyc, tmp.1, n64(rows_n), n64(d.m), n64(mg))?;
                        tmp.1
                    } else {
                        dyc
                    };
                    // dW_g += dY_g^T col_g over every image of the chunk.
                    dev.sgemm_batched(
                        gemm(true, false, mg, kd, rows_n, 1.0),
                        dyg,
                        rows_n * mg,
                        colp,
                        rows_n * kd,
                        dwp,
                        mg * kd,
                        d.group,
                    )?;
                    if let Some(dc) = dcol {
                        // dcol_g = dY_g W_g
                        dev.sgemm_batched(
                            gemm(false, false, rows_n, kd, mg, 0.0),
                            dyg,
                            rows_n * mg,
                            w,
                            mg * kd,
                            dc,
                            rows_n * kd,
                            d.group,
                        )?;
                    }
                }
            }
            if let (Some(dxc), false) = (dxc, direct) {
                self.col2im(dev, d, col.1, dxc, nb)?;
            }
            i0 += nb;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Conv on cuDNN

/// Entries asked of cuDNN's algorithm heuristics (more than there are algorithms).
const ALGOS: usize = 16;

/// The most workspace an algorithm may ask for to be chosen.
const WORKSPACE_CAP: usize = 1 << 30;

/// An algorithm and the workspace bytes it needs.
#[derive(Clone, Copy, Debug)]
struct Algo<A> {
    algo: A,
    workspace: usize,
}

/// What cuDNN needs to run one op's convolution on one pair of input shapes: descriptors of
/// X (and dX), Y (and dY), W (and dW) and the convolution, and the algorithms the
/// heuristics chose (the forward one for Conv; the filter one, and the data one when dX is
/// wanted, for ConvGradient).
struct CudnnPlan {
    x: TensorDesc,
    y: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    fwd: Option<Algo<dnn::cudnnConvolutionFwdAlgo_t>>,
    filter: Option<Algo<dnn::cudnnConvolutionBwdFilterAlgo_t>>,
    data: Option<Algo<dnn::cudnnConvolutionBwdDataAlgo_t>>,
}

/// A size as a positive cuDNN dimension (None: zero, or beyond 32 bits).
fn dnn_dim(v: usize) -> Option<i32> {
    i32::try_from(v).ok().filter(|&v| v > 0)
}

/// A device address as cuDNN takes it.
fn dptr(p: u64) -> *mut c_void {
    p as usize as *mut c_void
}

/// A host scalar (alpha, beta) as cuDNN takes it.
fn scalar(v: &f32) -> *const c_void {
    (v as *const f32).cast()
}

/// The first algorithm of the heuristics' list (best first) that is supported, uses no
/// tensor-core math and needs at most [`WORKSPACE_CAP`] bytes.
fn first_usable<P, A: Copy>(
    perf: &[P],
    count: i32,
    fields: impl Fn(&P) -> (A, dnn::cudnnStatus_t, dnn::cudnnMathType_t, usize),
) -> Option<A> {
    let n = usize::try_from(count).unwrap_or(0).min(perf.len());
    perf[..n]
        .iter()
        .map(fields)
        .find_map(|(a, status, math, mem)| {
            (usable_algo(status, math) && mem <= WORKSPACE_CAP).then_some(a)
        })
}

impl CudnnPlan {
    /// The plan of a convolution of sizes `d`, or None when cuDNN cannot take it (a size
    /// is zero or beyond its 32-bit dims, or no algorithm fits).
    fn new(
        dev: &Arc<DeviceCtx>,
        cd: &Cudnn,
        g: &Geometry,
        d: &Dims,
        gradient: bool,
        want_dx: bool,
    ) -> Result<Option<Self>> {
        let sizes = [
            d.n,
            d.c,
            d.h,
            d.w,
            d.m,
            d.cg(),
            d.kh,
            d.kw,
            d.oh,
            d.ow,
            d.group,
        ];
        let mut v = [0i32; 11];
        for (o, &s) in v.iter_mut().zip(&sizes) {
            let Some(s) = dnn_dim(s) else {
                return Ok(None);
            };
            *o = s;
        }
        let [n, c, h, w, m, cg, kh, kw, oh, ow, groups] = v;
        let elems = [
            prod(&[d.n, d.c, d.h, d.w])?,
            prod(&[d.n, d.m, d.oh, d.ow])?,
            prod(&[d.m, d.cg(), d.kh, d.kw])?,
        ];
        if elems.iter().any(|&e| i32::try_from(e).is_err()) {
            return Ok(None);
        }
        let geo = [
            g.pad[0],
            g.pad[1],
            g.stride[0],
            g.stride[1],
            g.dilation[0],
            g.dilation[1],
        ];
        let mut q = [0i32; 6];
        for (o, &s) in q.iter_mut().zip(&geo) {
            let Ok(s) = i32::try_from(s) else {
                return Ok(None);
            };
            *o = s;
        }
        let [pad_h, pad_w, stride_h, stride_w, dil_h, dil_w] = q;
        let layout = match g.order {
            Order::Nchw => Layout::Nchw,
            Order::Nhwc => Layout::Nhwc,
        };
        let xd = TensorDesc::new(layout, [n, c, h, w])?;
        let yd = TensorDesc::new(layout, [n, m, oh, ow])?;
        let wd = FilterDesc::new(layout, [m, cg, kh, kw])?;
        let conv = ConvDesc::new(ConvParams {
            pad: [pad_h, pad_w],
            stride: [stride_h, stride_w],
            dilation: [dil_h, dil_w],
            groups,
        })?;
        let mut plan = CudnnPlan {
            x: xd,
            y: yd,
            w: wd,
            conv,
            fwd: None,
            filter: None,
            data: None,
        };
        let usable = cd.with(dev, |hd| {
            if plan.out_dims()? != [n, m, oh, ow] {
                return Ok(false);
            }
            if gradient {
                plan.filter = plan.filter_algo(hd)?;
                if want_dx {
                    plan.data = plan.data_algo(hd)?;
                }
                Ok(plan.filter.is_some() && (!want_dx || plan.data.is_some()))
            } else {
                plan.fwd = plan.fwd_algo(hd)?;
                Ok(plan.fwd.is_some())
            }
        })?;
        Ok(usable.then_some(plan))
    }

    /// cuDNN's output dims `[n, c, h, w]` of the forward convolution (checked against ours).
    fn out_dims(&self) -> Result<[i32; 4]> {
        let (mut n, mut c, mut h, mut w) = (0i32, 0i32, 0i32, 0i32);
        // SAFETY: the descriptors are live; (convolution, input tensor, filter, n, c, h, w)
        // with four valid places for the results.
        check("cudnnGetConvolution2dForwardOutputDim", unsafe {
            dnn::cudnnGetConvolution2dForwardOutputDim(
                self.conv.raw(),
                self.x.raw(),
                self.w.raw(),
                &mut n,
                &mut c,
                &mut h,
                &mut w,
            )
        })?;
        Ok([n, c, h, w])
    }

    fn fwd_algo(
        &self,
        h: dnn::cudnnHandle_t,
    ) -> Result<Option<Algo<dnn::cudnnConvolutionFwdAlgo_t>>> {
        let init = dnn::cudnnConvolutionFwdAlgoPerf_t {
            algo: dnn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            status: dnn::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED,
            time: 0.0,
            memory: 0,
            determinism: dnn::cudnnDeterminism_t::CUDNN_NON_DETERMINISTIC,
            mathType: dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            reserved: [0; 3],
        };
        let mut perf = [init; ALGOS];
        let mut count = 0i32;
        // SAFETY: live handle and descriptors; (handle, x, w, conv, y, requested count,
        // returned count, results) with room for the ALGOS results requested.
        check("cudnnGetConvolutionForwardAlgorithm_v7", unsafe {
            dnn::cudnnGetConvolutionForwardAlgorithm_v7(
                h,
                self.x.raw(),
                self.w.raw(),
                self.conv.raw(),
                self.y.raw(),
                ALGOS as i32,
                &mut count,
                perf.as_mut_ptr(),
            )
        })?;
        let Some(algo) = first_usable(&perf, count, |p| (p.algo, p.status, p.mathType, p.memory))
        else {
            return Ok(None);
        };
        let mut workspace = 0usize;
        // SAFETY: as above; (handle, x, w, conv, y, algorithm, size).
        check("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
            dnn::cudnnGetConvolutionForwardWorkspaceSize(
                h,
                self.x.raw(),
                self.w.raw(),
                self.conv.raw(),
                self.y.raw(),
                algo,
                &mut workspace,
            )
        })?;
        Ok(Some(Algo { algo, workspace }))
    }

    fn filter_algo(
        &self,
        h: dnn::cudnnHandle_t,
    ) -> Result<Option<Algo<dnn::cudnnConvolutionBwdFilterAlgo_t>>> {
        let init = dnn::cudnnConvolutionBwdFilterAlgoPerf_t {
            algo: dnn::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
            status: dnn::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED,
            time: 0.0,
            memory: 0,
            determinism: dnn::cudnnDeterminism_t::CUDNN_NON_DETERMINISTIC,
            mathType: dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            reserved: [0; 3],
        };
        let mut perf = [init; ALGOS];
        let mut count = 0i32;
        // SAFETY: live handle and descriptors; (handle, x, dy, conv, dw, requested count,
        // returned count, results) with room for the ALGOS results requested.
        check("cudnnGetConvolutionBackwardFilterAlgorithm_v7", unsafe {
            dnn::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                h,
                self.x.raw(),
                self.y.raw(),
                self.conv.raw(),
                self.w.raw(),
                ALGOS as i32,
                &mut count,
                perf.as_mut_ptr(),
            )
        })?;
        let Some(algo) = first_usable(&perf, count, |p| (p.algo, p.status, p.mathType, p.memory))
        else {
            return Ok(None);
        };
        let mut workspace = 0usize;
        // SAFETY: as above; (handle, x, dy, conv, dw, algorithm, size).
        check("cudnnGetConvolutionBackwardFilterWorkspaceSize", unsafe {
            dnn::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                h,
                self.x.raw(),
                self.y.raw(),
                self.conv.raw(),
                self.w.raw(),
                algo,
                &mut workspace,
            )
        })?;
        Ok(Some(Algo { algo, workspace }))
    }

    fn data_algo(
        &self,
        h: dnn::cudnnHandle_t,
    ) -> Result<Option<Algo<dnn::cudnnConvolutionBwdDataAlgo_t>>> {
        let init = dnn::cudnnConvolutionBwdDataAlgoPerf_t {
            algo: dnn::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
            status: dnn::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED,
            time: 0.0,
            memory: 0,
            determinism: dnn::cudnnDeterminism_t::CUDNN_NON_DETERMINISTIC,
            mathType: dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            reserved: [0; 3],
        };
        let mut perf = [init; ALGOS];
        let mut count = 0i32;
        // SAFETY: live handle and descriptors; (handle, w, dy, conv, dx, requested count,
        // returned count, results) with room for the ALGOS results requested.
        check("cudnnGetConvolutionBackwardDataAlgorithm_v7", unsafe {
            dnn::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                h,
                self.w.raw(),
                self.y.raw(),
                self.conv.raw(),
                self.x.raw(),
                ALGOS as i32,
                &mut count,
                perf.as_mut_ptr(),
            )
        })?;
        let Some(algo) = first_usable(&perf, count, |p| (p.algo, p.status, p.mathType, p.memory))
        else {
            return Ok(None);
        };
        let mut workspace = 0usize;
        // SAFETY: as above; (handle, w, dy, conv, dx, algorithm, size).
        check("cudnnGetConvolutionBackwardDataWorkspaceSize", unsafe {
            dnn::cudnnGetConvolutionBackwardDataWorkspaceSize(
                h,
                self.w.raw(),
                self.y.raw(),
                self.conv.raw(),
                self.x.raw(),
                algo,
                &mut workspace,
            )
        })?;
        Ok(Some(Algo { algo, workspace }))
    }

    /// Y = conv(X, W) (without bias), written whole.
    fn forward(&self, dev: &Arc<DeviceCtx>, cd: &Cudnn, x: u64, w: u64, y: u64) -> Result<()> {
        let Some(a) = self.fwd else {
            bail!(Runtime: "Conv: the cuDNN plan has no forward algorithm");
        };
        // Freed after the call is queued: stream order keeps its reuse after the call.
        let ws = dev.alloc_block(a.workspace)?;
        let (one, zero) = (1.0f32, 0.0f32);
        cd.with(dev, |h| {
            // SAFETY: live handle and descriptors of these tensors' shapes; x, w and y are
            // device addresses of that many floats, the workspace holds `a.workspace` bytes;
            // (handle, alpha, xDesc, x, wDesc, w, conv, algo, workspace, bytes, beta, yDesc,
            // y), alpha and beta host floats (float data).
            check("cudnnConvolutionForward", unsafe {
                dnn::cudnnConvolutionForward(
                    h,
                    scalar(&one),
                    self.x.raw(),
                    dptr(x),
                    self.w.raw(),
                    dptr(w),
                    self.conv.raw(),
                    a.algo,
                    dptr(ws.ptr()),
                    a.workspace,
                    scalar(&zero),
                    self.y.raw(),
                    dptr(y),
                )
            })
        })?;
        drop(ws);
        Ok(())
    }

    /// dW (and dX when `dx` is given) from X, W and dY, written whole.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        dev: &Arc<DeviceCtx>,
        cd: &Cudnn,
        x: u64,
        w: u64,
        dy: u64,
        dw: u64,
        dx: Option<u64>,
    ) -> Result<()> {
        let Some(f) = self.filter else {
            bail!(Runtime: "ConvGradient: the cuDNN plan has no filter algorithm");
        };
        let data = match (dx, self.data) {
            (None, _) => None,
            (Some(p), Some(a)) => Some((p, a)),
            (Some(_), None) => {
                bail!(Runtime: "ConvGradient: the cuDNN plan has no data algorithm")
            }
        };
        let bytes = f.workspace.max(data.map_or(0, |(_, a)| a.workspace));
        // One workspace for both calls (they run in stream order), freed after both.
        let ws = dev.alloc_block(bytes)?;
        let (one, zero) = (1.0f32, 0.0f32);
        cd.with(dev, |h| {
            // SAFETY: live handle and descriptors of these tensors' shapes; x, dy and dw are
            // device addresses of that many floats, the workspace holds at least
            // `f.workspace` bytes; (handle, alpha, xDesc, x, dyDesc, dy, conv, algo,
            // workspace, bytes, beta, dwDesc, dw).
            check("cudnnConvolutionBackwardFilter", unsafe {
                dnn::cudnnConvolutionBackwardFilter(
                    h,
                    scalar(&one),
                    self.x.raw(),
                    dptr(x),
                    self.y.raw(),
                    dptr(dy),
                    self.conv.raw(),
                    f.algo,
                    dptr(ws.ptr()),
                    f.workspace,
                    scalar(&zero),
                    self.w.raw(),
                    dptr(dw),
                )
            })?;
            if let Some((dxp, a)) = data {
                // SAFETY: as above, w and dx of W's and X's shapes, the workspace at least
                // `a.workspace` bytes; (handle, alpha, wDesc, w, dyDesc, dy, conv, algo,
                // workspace, bytes, beta, dxDesc, dx).
                check("cudnnConvolutionBackwardData", unsafe {
                    dnn::cudnnConvolutionBackwardData(
                        h,
                        scalar(&one),
                        self.w.raw(),
                        dptr(w),
                        self.y.raw(),
                        dptr(dy),
                        self.conv.raw(),
                        a.algo,
                        dptr(ws.ptr()),
                        a.workspace,
                        scalar(&zero),
                        self.x.raw(),
                        dptr(dxp),
                    )
                })?;
            }
            Ok(())
        })?;
        drop(ws);
        Ok(())
    }
}

impl Operator for Conv {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            self.backward(ctx)
        } else {
            self.forward(ctx)
        }
    }
}

fn create_conv(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let g = Geometry::new(init)?;
    let group = init.args.usize("group", 1)?;
    if group == 0 {
        bail!(op = init, BadArgument: "group must be positive");
    }
    let no_bias = init.args.bool("no_bias", false)?;
    let dev = init_device(init)?;
    // cuDNN pads both sides of a dimension alike.
    let symmetric = g.pad[0] == g.pad[2] && g.pad[1] == g.pad[3];
    let cudnn = if symmetric {
        dev.cudnn().map_err(|e| init.err(e))?
    } else {
        None
    };
    let (im2col, col2im) = match g.order {
        Order::Nchw => ("im2col_nchw_f32", "col2im_nchw_f32"),
        Order::Nhwc => ("im2col_nhwc_f32", "col2im_nhwc_f32"),
    };
    let f = |name: &str| dev.function("conv", name);
    let k = ConvKernels {
        im2col: f(im2col)?,
        col2im: f(col2im)?,
        ungroup: f("ungroup_rows_f32")?,
        group_rows: f("group_rows_f32")?,
        bias_add: f("bias_add_f32")?,
        bias_grad: f("bias_grad_f32")?,
        depthwise: f("depthwise_f32")?,
    };
    Ok(Box::new(Conv {
        g,
        group,
        no_bias,
        gradient,
        k,
        cudnn,
        plans: HashMap::new(),
        timed: Default::default(),
    }))
}

// ---------------------------------------------------------------------------------------
// Pooling

struct Pool {
    g: Geometry,
    max: bool,
    gradient: bool,
    include_pad: bool,
    /// Forward (max_pool / avg_pool), or the gradient (max_pool_grad / avg_pool_grad).
    main: CudaFunction,
    /// max_pool_arg (max gradients only).
    arg: Option<CudaFunction>,
}

/// The kernels' window arguments: n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, pb, pr, nhwc.
#[derive(Clone, Copy)]
struct PoolArgs {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    oh: i64,
    ow: i64,
    kh: i64,
    kw: i64,
    sh: i64,
    sw: i64,
    pt: i64,
    pl: i64,
    pb: i64,
    pr: i64,
    nhwc: i64,
}

impl Pool {
    /// (n, c, oh, ow, window arguments), with the CPU kernel's checks.
    fn shape(&self, dims: &[usize]) -> Result<(usize, usize, usize, usize, PoolArgs)> {
        let (n, c, h, w) = self.g.nchw(dims)?;
        let (kh, kw) = if self.g.global {
            (h, w)
        } else {
            (self.g.kernel[0], self.g.kernel[1])
        };
        if kh == 0 || kw == 0 {
            bail!(BadArgument: "pooling needs a kernel size (or global_pooling)");
        }
        let (oh, ow) = if self.g.global {
            (1, 1)
        } else {
            self.g.out_size(h, w, kh, kw)?
        };
        let (s, p) = if self.g.global {
            ([1, 1], [0, 0, 0, 0])
        } else {
            (self.g.stride, self.g.pad)
        };
        let a = PoolArgs {
            n: n64(n),
            c: n64(c),
            h: n64(h),
            w: n64(w),
            oh: n64(oh),
            ow: n64(ow),
            kh: n64(kh),
            kw: n64(kw),
            sh: n64(s[0]),
            sw: n64(s[1]),
            pt: n64(p[0]),
            pl: n64(p[1]),
            pb: n64(p[2]),
            pr: n64(p[3]),
            nhwc: i64::from(self.g.order == Order::Nhwc),
        };
        Ok((n, c, oh, ow, a))
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let (n, c, oh, ow, a) = self.shape(x.dims())?;
        let (y, yp) = new_tensor(&dev, DataType::Float, &self.g.dims(n, c, oh, ow))?;
        let ny = y.numel();
        if ny > 0 {
            let f = &self.main;
            if self.max {
                cuda_launch!(dev, f, grid(ny);
                    x.ptr, yp, a.n, a.c, a.h, a.w, a.oh, a.ow, a.kh, a.kw, a.sh, a.sw, a.pt,
                    a.pl, a.pb, a.pr, a.nhwc)?;
            } else {
                cuda_launch!(dev, f, grid(ny);
                    x.ptr, yp, a.n, a.c, a.h, a.w, a.oh, a.ow, a.kh, a.kw, a.sh, a.sw, a.pt,
                    a.pl, a.pb, a.pr, a.nhwc, i64::from(self.include_pad))?;
            }
        }
        set_output(ctx, 0, y)
    }

    /// Inputs (X, Y, dY); output dX.
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dev = device(ctx)?;
        let x = input_f32(ctx, &dev, 0)?;
        let (n, c, oh, ow, a) = self.shape(x.dims())?;
        let y = input_f32(ctx, &dev, 1)?;
        let dy = input_f32(ctx, &dev, 2)?;
        let y_dims = self.g.dims(n, c, oh, ow);
        if dy.dims() != y_dims.as_slice() || y.numel() != dy.numel() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let (dx, dxp) = new_tensor(&dev, DataType::Float, x.dims())?;
        let (nx, ny) = (dx.numel(), dy.numel());
        if nx > 0 && ny == 0 {
            dev.fill_zero(dxp, nx)?;
        } else if nx > 0 {
            let f = &self.main;
            match &self.arg {
                Some(argf) => {
                    let (_arg, argp) = new_tensor(&dev, DataType::Int64, &[ny])?;
                    cuda_launch!(dev, argf, grid(ny);
                        x.ptr, y.ptr, argp, a.n, a.c, a.h, a.w, a.oh, a.ow, a.kh, a.kw, a.sh,
                        a.sw, a.pt, a.pl, a.pb, a.pr, a.nhwc)?;
                    cuda_launch!(dev, f, grid(nx);
                        argp, dy.ptr, dxp, a.n, a.c, a.h, a.w, a.oh, a.ow, a.kh, a.kw, a.sh,
                        a.sw, a.pt, a.pl, a.pb, a.pr, a.nhwc)?;
                }
                None => {
                    cuda_launch!(dev, f, grid(nx);
                        dy.ptr, dxp, a.n, a.c, a.h, a.w, a.oh, a.ow, a.kh, a.kw, a.sh, a.sw,
                        a.pt, a.pl, a.pb, a.pr, a.nhwc, i64::from(self.include_pad))?;
                }
            }
        }
        set_output(ctx, 0, dx)
    }
}

impl Operator for Pool {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            self.backward(ctx)
        } else {
            self.forward(ctx)
        }
    }
}

fn create_pool(init: &OpInit<'_>, max: bool, gradient: bool) -> Result<Box<dyn Operator>> {
    let g = Geometry::new(init)?;
    if g.dilation != [1, 1] {
        bail!(op = init, NotImplemented: "Pooling op does not support dilation right now.");
    }
    let include_pad = init.args.bool("count_include_pad", false)?;
    let dev = init_device(init)?;
    let main = match (max, gradient) {
        (true, false) => "max_pool_f32",
        (false, false) => "avg_pool_f32",
        (true, true) => "max_pool_grad_f32",
        (false, true) => "avg_pool_grad_f32",
    };
    let main = dev.function("conv", main)?;
    let arg = if max && gradient {
        Some(dev.function("conv", "max_pool_arg_f32")?)
    } else {
        None
    };
    Ok(Box::new(Pool {
        g,
        max,
        gradient,
        include_pad,
        main,
        arg,
    }))
}
