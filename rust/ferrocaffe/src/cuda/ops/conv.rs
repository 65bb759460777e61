//! CUDA kernels of the `conv` family (see kernels/conv.cu): 2-d Conv and ConvGradient by
//! im2col / col2im and cuBLAS products (NCHW and NHWC, groups, strides, padding, dilation; a
//! direct kernel for depthwise Conv), and 2-d MaxPool / AveragePool with their gradients.
//!
//! The argument parsing and output sizes are the CPU kernels' ([`Geometry`]); the checks and
//! error kinds mirror `ops/cpu/conv.rs` and `ops/cpu/pool.rs`.
//!
//! Column matrices: NCHW `col[b][(c * kh + ki) * kw + kj][p]` per image (group `gi`'s rows
//! are a contiguous block), products per image and group; NHWC group-major
//! `col[g][b][p][(ki * kw + kj) * cg + ci]`, so one product per group covers every image of a
//! chunk (grouped outputs are shuffled to and from `[b][p][g * mg + j]`). Images go in chunks
//! that keep the column matrix under [`COL_CAP`] floats.

use std::sync::Arc;

use cudarc::driver::CudaFunction;

use crate::cuda::op::{device, init_device, input_f32, n64, new_tensor, set_output};
use crate::cuda::{grid, rows, DeviceCtx, Gemm};
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

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
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
        if ny > 0 {
            if d.group == d.c && d.m == d.c {
                self.depthwise(&dev, &d, x.ptr, w.ptr, bias.as_ref().map(|b| b.ptr), yp, ny)?;
            } else {
                self.products(&dev, &d, x.ptr, w.ptr, yp)?;
                if let Some(b) = &bias {
                    let inner = match self.g.order {
                        Order::Nchw => d.so()?,
                        Order::Nhwc => 1,
                    };
                    cuda_launch!(dev, self.k.bias_add, grid(ny);
                        yp, b.ptr, n64(ny), n64(inner), n64(d.m))?;
                }
            }
        }
        set_output(ctx, 0, y)
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
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
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
        dev.fill_zero(dwp, dw.numel())?;
        let dx = if want_dx {
            let (t, p) = new_tensor(&dev, DataType::Float, x.dims())?;
            if d.mg() == 0 {
                dev.fill_zero(p, t.numel())?;
            }
            Some((t, p))
        } else {
            None
        };
        let dxp = dx.as_ref().filter(|_| d.mg() > 0).map(|t| t.1);
        self.backward_products(&dev, &d, x.ptr, w.ptr, dy.ptr, dwp, dxp)?;
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
