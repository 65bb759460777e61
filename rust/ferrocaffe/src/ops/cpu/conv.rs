//! 2-d convolution (Conv, with groups, strides, padding, dilation, NCHW or NHWC) and its
//! gradient (ConvGradient), by im2col + GEMM.
//!
//! W is `[M, C/G, kH, kW]` (NCHW) or `[M, kH, kW, C/G]` (NHWC); the optional bias has M values.

use super::conv_args::{Geometry, Order};
use crate::bail;
use crate::error::{try_vec, Error, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Conv", |i| create(i, false));
    r.cpu("Conv2D", |i| create(i, false));
    r.cpu("ConvGradient", |i| create(i, true));
    r.cpu("Conv2DGradient", |i| create(i, true));
}

/// Sizes of one convolution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) m: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) group: usize,
}

impl Dims {
    fn cg(&self) -> usize {
        self.c / self.group
    }
    fn mg(&self) -> usize {
        self.m / self.group
    }
    /// Rows of the column matrix (per group).
    fn kdim(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// Output pixels per image (saturating: exact whenever an output is not empty, which
    /// is when it is used).
    fn spatial_out(&self) -> usize {
        self.oh.saturating_mul(self.ow)
    }
    /// Elements of the per-image column matrix, checked (the output size is the user's).
    fn col_len(&self) -> Result<usize> {
        self.kdim()
            .checked_mul(self.spatial_out())
            .ok_or_else(|| too_large("the column buffer", self))
    }
}

fn too_large(what: &str, d: &Dims) -> Error {
    Error::OutOfMemory(format!(
        "{what} of a convolution with output {}x{} and kernel {}x{} is too large to allocate",
        d.oh, d.ow, d.kh, d.kw
    ))
}

struct Conv {
    g: Geometry,
    group: usize,
    gradient: bool,
    no_bias: bool,
}

impl Conv {
    fn dims(&self, xd: &[usize], wd: &[usize]) -> Result<Dims> {
        let (n, c, h, w) = self.g.nchw(xd)?;
        if wd.len() != 4 {
            bail!(ShapeMismatch: "filter must be 4-d, got {wd:?}");
        }
        let (m, wc, kh, kw) = match self.g.order {
            Order::Nchw => (wd[0], wd[1], wd[2], wd[3]),
            Order::Nhwc => (wd[0], wd[3], wd[1], wd[2]),
        };
        if c != wc * self.group {
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

    fn im2col(&self, d: &Dims, x: &[f32], img: usize, gi: usize, col: &mut [f32]) {
        im2col(&self.g, d, x, img, gi, col)
    }

    fn col2im(&self, d: &Dims, col: &[f32], img: usize, gi: usize, dx: &mut [f32]) {
        col2im(&self.g, d, col, img, gi, dx)
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let d = self.dims(x.dims(), w.dims())?;
        let bias = if ins.len() > 2 {
            let b = ins.tensor(2)?.as_slice::<f32>()?;
            if b.len() != d.m {
                bail!(ShapeMismatch: "bias has {} values, expected {}", b.len(), d.m);
            }
            Some(b)
        } else {
            None
        };
        let (xs, ws) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let y_dims = self.g.dims(d.n, d.m, d.oh, d.ow);
        let y = outs.tensor(0)?.try_ensure::<f32>(&y_dims)?;
        if y.is_empty() {
            // No image, no output channel or no output pixel: an empty Y of the right shape.
            return Ok(());
        }
        if d.group == d.c && d.m == d.c && self.g.order == Order::Nhwc {
            depthwise(&self.g, &d, xs, ws, bias, y);
            return Ok(());
        }
        let (kd, so, mg) = (d.kdim(), d.spatial_out(), d.mg());
        let mut col = try_vec(d.col_len()?, 0f32, "the column buffer")?;
        let mut tmp = if self.g.order == Order::Nhwc && d.group > 1 {
            // so * mg <= so * m = one image of Y, which is allocated already.
            try_vec(so * mg, 0f32, "the group buffer")?
        } else {
            Vec::new()
        };
        let img_out = d.m * so;
        for img in 0..d.n {
            let yi = &mut y[img * img_out..(img + 1) * img_out];
            for gi in 0..d.group {
                let wg = &ws[gi * mg * kd..(gi + 1) * mg * kd];
                let one_by_one = self.g.order == Order::Nchw
                    && d.kh == 1
                    && d.kw == 1
                    && self.g.stride == [1, 1]
                    && self.g.pad == [0, 0, 0, 0];
                match self.g.order {
                    Order::Nchw => {
                        let dst = &mut yi[gi * mg * so..(gi + 1) * mg * so];
                        if one_by_one {
                            let base = (img * d.c + gi * d.cg()) * d.h * d.w;
                            gemm.sgemm(
                                false,
                                false,
                                mg,
                                so,
                                kd,
                                1.0,
                                wg,
                                &xs[base..base + kd * so],
                                0.0,
                                dst,
                            );
                        } else {
                            self.im2col(&d, xs, img, gi, &mut col);
                            gemm.sgemm(false, false, mg, so, kd, 1.0, wg, &col, 0.0, dst);
                        }
                    }
                    Order::Nhwc => {
                        self.im2col(&d, xs, img, gi, &mut col);
                        if d.group == 1 {
                            gemm.sgemm(false, true, so, d.m, kd, 1.0, &col, wg, 0.0, yi);
                        } else {
                            gemm.sgemm(false, true, so, mg, kd, 1.0, &col, wg, 0.0, &mut tmp);
                            for p in 0..so {
                                yi[p * d.m + gi * mg..p * d.m + (gi + 1) * mg]
                                    .copy_from_slice(&tmp[p * mg..(p + 1) * mg]);
                            }
                        }
                    }
                }
            }
            if let Some(b) = bias {
                match self.g.order {
                    Order::Nchw => {
                        for (m, &bv) in b.iter().enumerate() {
                            for v in &mut yi[m * so..(m + 1) * so] {
                                *v += bv;
                            }
                        }
                    }
                    Order::Nhwc => {
                        for row in yi.chunks_mut(d.m) {
                            for (v, &bv) in row.iter_mut().zip(b) {
                                *v += bv;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Inputs (X, W, dY); outputs (dW, db, dX) or, with no_bias, (dW, dX); dX optional.
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let n_out = ctx.num_outputs();
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let d = self.dims(x.dims(), w.dims())?;
        let dy = ins.tensor(2)?;
        let y_dims = self.g.dims(d.n, d.m, d.oh, d.ow);
        if dy.dims() != y_dims.as_slice() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let (xs, ws, g) = (
            x.as_slice::<f32>()?,
            w.as_slice::<f32>()?,
            dy.as_slice::<f32>()?,
        );
        let (kd, so, mg) = (d.kdim(), d.spatial_out(), d.mg());
        let mut dw = try_vec(ws.len(), 0f32, "dW")?;
        let mut db = try_vec(d.m, 0f32, "db")?;
        let want_dx = n_out > if self.no_bias { 1 } else { 2 };
        let mut dx = if want_dx {
            try_vec(xs.len(), 0f32, "dX")?
        } else {
            Vec::new()
        };
        // No image: dW, db and dX are zeros (the column buffers would be of no use).
        let n_imgs = if g.is_empty() { 0 } else { d.n };
        let (col_len, gg_len) = if n_imgs == 0 {
            (0, 0)
        } else {
            (d.col_len()?, so * mg)
        };
        let mut col = try_vec(col_len, 0f32, "the column buffer")?;
        let mut gg = try_vec(gg_len, 0f32, "the group buffer")?;
        let img_out = d.m.saturating_mul(so);
        for img in 0..n_imgs {
            let gi_all = &g[img * img_out..(img + 1) * img_out];
            for gi in 0..d.group {
                // dY of this group as [mg, so] (NCHW) or [so, mg] (NHWC).
                match self.g.order {
                    Order::Nchw => gg.copy_from_slice(&gi_all[gi * mg * so..(gi + 1) * mg * so]),
                    Order::Nhwc => {
                        for p in 0..so {
                            gg[p * mg..(p + 1) * mg].copy_from_slice(
                                &gi_all[p * d.m + gi * mg..p * d.m + (gi + 1) * mg],
                            );
                        }
                    }
                }
                self.im2col(&d, xs, img, gi, &mut col);
                let dwg = &mut dw[gi * mg * kd..(gi + 1) * mg * kd];
                let wg = &ws[gi * mg * kd..(gi + 1) * mg * kd];
                match self.g.order {
                    Order::Nchw => {
                        gemm.sgemm(false, true, mg, kd, so, 1.0, &gg, &col, 1.0, dwg);
                        if want_dx {
                            gemm.sgemm(true, false, kd, so, mg, 1.0, wg, &gg, 0.0, &mut col);
                        }
                    }
                    Order::Nhwc => {
                        gemm.sgemm(true, false, mg, kd, so, 1.0, &gg, &col, 1.0, dwg);
                        if want_dx {
                            gemm.sgemm(false, false, so, kd, mg, 1.0, &gg, wg, 0.0, &mut col);
                        }
                    }
                }
                if want_dx {
                    self.col2im(&d, &col, img, gi, &mut dx);
                }
            }
            match self.g.order {
                Order::Nchw => {
                    for (m, acc) in db.iter_mut().enumerate() {
                        *acc += gi_all[m * so..(m + 1) * so].iter().sum::<f32>();
                    }
                }
                Order::Nhwc if d.m > 0 => {
                    for row in gi_all.chunks(d.m) {
                        for (acc, v) in db.iter_mut().zip(row) {
                            *acc += v;
                        }
                    }
                }
                // No output channel: no bias gradient to add up.
                Order::Nhwc => {}
            }
        }
        let w_dims = w.dims().to_vec();
        let x_dims = x.dims().to_vec();
        outs.tensor(0)?
            .try_ensure::<f32>(&w_dims)?
            .copy_from_slice(&dw);
        let mut next = 1;
        if !self.no_bias {
            outs.tensor(1)?
                .try_ensure::<f32>(&[d.m])?
                .copy_from_slice(&db);
            next = 2;
        }
        if want_dx {
            outs.tensor(next)?
                .try_ensure::<f32>(&x_dims)?
                .copy_from_slice(&dx);
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

fn create(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let g = Geometry::new(init)?;
    let group = init.args.usize("group", 1)?;
    if group == 0 {
        bail!(op = init, BadArgument: "group must be positive");
    }
    Ok(Box::new(Conv {
        g,
        group,
        gradient,
        no_bias: init.args.bool("no_bias", false)?,
    }))
}

/// Column matrix of image `img`, group `gi`: NCHW `[kdim, oh*ow]`, NHWC `[oh*ow, kdim]`.
pub(crate) fn im2col(g: &Geometry, d: &Dims, x: &[f32], img: usize, gi: usize, col: &mut [f32]) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    let cg = d.cg();
    match g.order {
        Order::Nchw => {
            let base = (img * d.c + gi * cg) * d.h * d.w;
            let so = d.spatial_out();
            for c in 0..cg {
                for ki in 0..d.kh {
                    for kj in 0..d.kw {
                        let row = ((c * d.kh + ki) * d.kw + kj) * so;
                        for oy in 0..d.oh {
                            let iy = (oy * sh + ki * dh) as isize - pt;
                            let dst = &mut col[row + oy * d.ow..row + (oy + 1) * d.ow];
                            if iy < 0 || iy >= d.h as isize {
                                dst.fill(0.0);
                                continue;
                            }
                            let src = base + (c * d.h + iy as usize) * d.w;
                            for (ox, o) in dst.iter_mut().enumerate() {
                                let ix = (ox * sw + kj * dw) as isize - pl;
                                *o = if ix < 0 || ix >= d.w as isize {
                                    0.0
                                } else {
                                    x[src + ix as usize]
                                };
                            }
                        }
                    }
                }
            }
        }
        Order::Nhwc => {
            let kd = d.kdim();
            for oy in 0..d.oh {
                for ox in 0..d.ow {
                    let p = oy * d.ow + ox;
                    for ki in 0..d.kh {
                        let iy = (oy * sh + ki * dh) as isize - pt;
                        for kj in 0..d.kw {
                            let ix = (ox * sw + kj * dw) as isize - pl;
                            let dst = &mut col[p * kd + (ki * d.kw + kj) * cg..][..cg];
                            if iy < 0 || iy >= d.h as isize || ix < 0 || ix >= d.w as isize {
                                dst.fill(0.0);
                            } else {
                                let src =
                                    ((img * d.h + iy as usize) * d.w + ix as usize) * d.c + gi * cg;
                                dst.copy_from_slice(&x[src..src + cg]);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Adds the column matrix back into image `img`, group `gi` of `dx` (inverse of im2col).
pub(crate) fn col2im(g: &Geometry, d: &Dims, col: &[f32], img: usize, gi: usize, dx: &mut [f32]) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    let cg = d.cg();
    match g.order {
        Order::Nchw => {
            let base = (img * d.c + gi * cg) * d.h * d.w;
            let so = d.spatial_out();
            for c in 0..cg {
                for ki in 0..d.kh {
                    for kj in 0..d.kw {
                        let row = ((c * d.kh + ki) * d.kw + kj) * so;
                        for oy in 0..d.oh {
                            let iy = (oy * sh + ki * dh) as isize - pt;
                            if iy < 0 || iy >= d.h as isize {
                                continue;
                            }
                            for ox in 0..d.ow {
                                let ix = (ox * sw + kj * dw) as isize - pl;
                                if ix >= 0 && ix < d.w as isize {
                                    dx[base + (c * d.h + iy as usize) * d.w + ix as usize] +=
                                        col[row + oy * d.ow + ox];
                                }
                            }
                        }
                    }
                }
            }
        }
        Order::Nhwc => {
            let kd = d.kdim();
            for oy in 0..d.oh {
                for ox in 0..d.ow {
                    let p = oy * d.ow + ox;
                    for ki in 0..d.kh {
                        let iy = (oy * sh + ki * dh) as isize - pt;
                        for kj in 0..d.kw {
                            let ix = (ox * sw + kj * dw) as isize - pl;
                            if iy < 0 || iy >= d.h as isize || ix < 0 || ix >= d.w as isize {
                                continue;
                            }
                            let src = &col[p * kd + (ki * d.kw + kj) * cg..][..cg];
                            let dst =
                                ((img * d.h + iy as usize) * d.w + ix as usize) * d.c + gi * cg;
                            for (o, v) in dx[dst..dst + cg].iter_mut().zip(src) {
                                *o += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Depthwise convolution (one filter per channel), computed directly: channel-major loops for
/// NCHW, channel-minor for NHWC, so reads stay contiguous.
fn depthwise(g: &Geometry, d: &Dims, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    let (c, h, wd) = (d.c, d.h as isize, d.w as isize);
    let kk = d.kh * d.kw;
    // W: NCHW [C, 1, kh, kw]; NHWC [C, kh, kw, 1]: both are ch * kk + ki * kw + kj.
    let one = |img: usize, ch: usize, oy: usize, ox: usize| -> f32 {
        let mut acc = bias.map_or(0.0, |b| b[ch]);
        for ki in 0..d.kh {
            let iy = (oy * sh + ki * dh) as isize - pt;
            if iy < 0 || iy >= h {
                continue;
            }
            for kj in 0..d.kw {
                let ix = (ox * sw + kj * dw) as isize - pl;
                if ix < 0 || ix >= wd {
                    continue;
                }
                let xi = match g.order {
                    Order::Nchw => ((img * c + ch) * d.h + iy as usize) * d.w + ix as usize,
                    Order::Nhwc => ((img * d.h + iy as usize) * d.w + ix as usize) * c + ch,
                };
                acc += x[xi] * w[ch * kk + ki * d.kw + kj];
            }
        }
        acc
    };
    for img in 0..d.n {
        match g.order {
            Order::Nchw => {
                for ch in 0..c {
                    for oy in 0..d.oh {
                        for ox in 0..d.ow {
                            y[((img * c + ch) * d.oh + oy) * d.ow + ox] = one(img, ch, oy, ox);
                        }
                    }
                }
            }
            Order::Nhwc => {
                for oy in 0..d.oh {
                    for ox in 0..d.ow {
                        for ch in 0..c {
                            y[((img * d.oh + oy) * d.ow + ox) * c + ch] = one(img, ch, oy, ox);
                        }
                    }
                }
            }
        }
    }
}
