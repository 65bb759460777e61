//! ConvTranspose (2-d, NCHW with W `[C_in, C_out, kH, kW]` or NHWC with W
//! `[C_in, kH, kW, C_out]`): GEMM into columns, then col2im. Output size
//! `(in - 1) * stride - pad_head - pad_tail + kernel + adj`.
//!
//! ConvTransposeGradient (inputs X, W, dY; outputs dW, then db unless `no_bias`, then dX when
//! one more output is given): im2col of dY, then one GEMM for dW and one for dX, as Caffe2.
//! Groups are not supported: a `group` other than 1 is refused rather than ignored.

use super::conv::{col2im, im2col, Dims};
use super::conv_args::{self, Geometry, Order};
use super::par::macs_part_len;
use crate::blas::for_each_part;
use crate::error::{try_vec, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

/// Registers ConvTranspose and its gradient.
pub fn register(r: &mut Registry) {
    r.cpu("ConvTranspose", |i| create(i, false));
    r.cpu("ConvTransposeGradient", |i| create(i, true));
}

struct ConvTranspose {
    g: Geometry,
    adj: [usize; 2],
    no_bias: bool,
    gradient: bool,
}

/// One output extent: `(in - 1) * stride + kernel + adj - pad_head - pad_tail`.
fn out_extent(inp: usize, k: usize, s: usize, p0: usize, p1: usize, adj: usize) -> Result<usize> {
    let full = inp
        .max(1)
        .saturating_sub(1)
        .checked_mul(s)
        .and_then(|v| v.checked_add(k))
        .and_then(|v| v.checked_add(adj))
        .ok_or_else(|| err!(BadArgument: "ConvTranspose output size overflows"))?;
    full.checked_sub(p0.saturating_add(p1))
        .ok_or_else(|| err!(BadArgument: "padding larger than the output"))
}

impl ConvTranspose {
    /// Sizes of the convolution whose input is our output (`c`, `h`, `w`: C_out and the output
    /// extent) and whose output is our input (`m`, `oh`, `ow`: C_in and the input extent).
    fn dims(&self, xd: &[usize], wdims: &[usize]) -> Result<Dims> {
        let (n, cin, h, wd) = self.g.nchw(xd)?;
        if wdims.len() != 4 || wdims[0] != cin {
            bail!(ShapeMismatch: "filter {wdims:?} must be 4-d with {cin} input channels first");
        }
        let (cout, kh, kw) = match self.g.order {
            Order::Nchw => (wdims[1], wdims[2], wdims[3]),
            Order::Nhwc => (wdims[3], wdims[1], wdims[2]),
        };
        for (i, (&k, &gk)) in [kh, kw].iter().zip(&self.g.kernel).enumerate() {
            if gk != 0 && gk != k {
                bail!(ShapeMismatch: "kernel argument {gk} disagrees with filter dim {i}: {k}");
            }
        }
        let g = &self.g;
        let oh = out_extent(h, kh, g.stride[0], g.pad[0], g.pad[2], self.adj[0])?;
        let ow = out_extent(wd, kw, g.stride[1], g.pad[1], g.pad[3], self.adj[1])?;
        Ok(Dims {
            n,
            c: cout,
            h: oh,
            w: ow,
            m: cin,
            kh,
            kw,
            oh: h,
            ow: wd,
            group: 1,
        })
    }

    /// Elements of the column buffer: `C_out * kH * kW` rows by the input's spatial size.
    fn col_len(d: &Dims) -> Result<(usize, usize)> {
        let kd = d.c.checked_mul(d.kh).and_then(|v| v.checked_mul(d.kw));
        let so = d.oh.checked_mul(d.ow);
        match (kd, so) {
            (Some(kd), Some(so)) if kd.checked_mul(so).is_some() => Ok((kd, so)),
            _ => bail!(OutOfMemory: "ConvTranspose column buffer size overflows"),
        }
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let d = self.dims(x.dims(), w.dims())?;
        let (n, cin, cout) = (d.n, d.m, d.c);
        let bias = conv_args::bias(&ins, cout)?;
        let g = &self.g;
        let (xs, ws) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let y_dims = g.dims(n, cout, d.h, d.w);
        let y = outs.tensor(0)?.try_ensure::<f32>(&y_dims)?;
        y.fill(0.0);
        if y.is_empty() {
            // No image or no output channel: an empty Y of the right shape.
            return Ok(());
        }
        let (kd, so) = Self::col_len(&d)?;
        // Images are shared out to the team, a few consecutive ones per part with a column
        // buffer each (the products inside a part then run on its thread alone); `col2im`
        // writes image `img` of the part's slice of Y.
        let img_out = cout * d.h * d.w;
        let macs = kd.saturating_mul(so).saturating_mul(cin).saturating_mul(n);
        let per = macs_part_len(n, macs);
        let mut parts = Vec::with_capacity(n.div_ceil(per));
        for (i, yp) in y.chunks_mut(per * img_out).enumerate() {
            parts.push((
                i * per,
                yp,
                try_vec(kd * so, 0f32, "ConvTranspose column buffer")?,
            ));
        }
        for_each_part(parts, &|(first, yp, mut col)| {
            for img in 0..yp.len() / img_out {
                let xi = &xs[(first + img) * cin * so..(first + img + 1) * cin * so];
                match g.order {
                    Order::Nchw => gemm.sgemm(true, false, kd, so, cin, 1.0, ws, xi, 0.0, &mut col),
                    Order::Nhwc => {
                        gemm.sgemm(false, false, so, kd, cin, 1.0, xi, ws, 0.0, &mut col)
                    }
                }
                col2im(g, &d, &col, img, 0, yp);
            }
        });
        if let Some(b) = bias {
            let plane = d.h * d.w;
            for img in 0..n {
                let yi = &mut y[img * cout * plane..(img + 1) * cout * plane];
                match g.order {
                    Order::Nchw => {
                        for (c, &bv) in b.iter().enumerate() {
                            yi[c * plane..(c + 1) * plane]
                                .iter_mut()
                                .for_each(|v| *v += bv);
                        }
                    }
                    Order::Nhwc => {
                        for row in yi.chunks_mut(cout) {
                            row.iter_mut().zip(b).for_each(|(v, bv)| *v += bv);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Inputs (X, W, dY); outputs (dW, db, dX) or, with `no_bias`, (dW, dX); dX optional.
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let n_out = ctx.num_outputs();
        if self.no_bias && n_out == 3 {
            bail!(
                op = ctx,
                Schema: "If bias is not present, you should not have 3 grad output."
            );
        }
        let want_dx = n_out == if self.no_bias { 2 } else { 3 };
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let dy = ins.tensor(2)?;
        let d = self.dims(x.dims(), w.dims())?;
        let (n, cin, cout) = (d.n, d.m, d.c);
        let g = &self.g;
        let y_dims = g.dims(n, cout, d.h, d.w);
        if dy.dims() != y_dims.as_slice() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let (xs, ws, gs) = (
            x.as_slice::<f32>()?,
            w.as_slice::<f32>()?,
            dy.as_slice::<f32>()?,
        );
        let (kd, so) = Self::col_len(&d)?;
        let mut col = try_vec(kd * so, 0f32, "ConvTransposeGradient column buffer")?;
        let mut dw = try_vec(ws.len(), 0f32, "ConvTransposeGradient dW")?;
        let mut dx = try_vec(if want_dx { xs.len() } else { 0 }, 0f32, "dX")?;
        let mut db = try_vec(cout, 0f32, "ConvTransposeGradient db")?;
        let plane = d.h * d.w;
        for img in 0..n {
            // Columns of dY: [C_out*kH*kW, H*W] (NCHW) or [H*W, kH*kW*C_out] (NHWC).
            im2col(g, &d, gs, img, 0, &mut col);
            let xi = &xs[img * cin * so..(img + 1) * cin * so];
            match g.order {
                Order::Nchw => {
                    gemm.sgemm(false, true, cin, kd, so, 1.0, xi, &col, 1.0, &mut dw);
                    if want_dx {
                        let dxi = &mut dx[img * cin * so..(img + 1) * cin * so];
                        gemm.sgemm(false, false, cin, so, kd, 1.0, ws, &col, 0.0, dxi);
                    }
                }
                Order::Nhwc => {
                    gemm.sgemm(true, false, cin, kd, so, 1.0, xi, &col, 1.0, &mut dw);
                    if want_dx {
                        let dxi = &mut dx[img * cin * so..(img + 1) * cin * so];
                        gemm.sgemm(false, true, so, cin, kd, 1.0, &col, ws, 0.0, dxi);
                    }
                }
            }
            let gi = &gs[img * cout * plane..(img + 1) * cout * plane];
            match g.order {
                Order::Nchw => {
                    for (c, acc) in db.iter_mut().enumerate() {
                        *acc += gi[c * plane..(c + 1) * plane].iter().sum::<f32>();
                    }
                }
                Order::Nhwc => {
                    for row in gi.chunks(cout.max(1)) {
                        db.iter_mut().zip(row).for_each(|(acc, v)| *acc += v);
                    }
                }
            }
        }
        let w_dims = w.dims().to_vec();
        let x_dims = x.dims().to_vec();
        outs.tensor(0)?.ensure::<f32>(&w_dims).copy_from_slice(&dw);
        let mut next = 1;
        if !self.no_bias {
            outs.tensor(1)?.ensure::<f32>(&[cout]).copy_from_slice(&db);
            next = 2;
        }
        if want_dx {
            outs.tensor(next)?
                .ensure::<f32>(&x_dims)
                .copy_from_slice(&dx);
        }
        Ok(())
    }
}

impl Operator for ConvTranspose {
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
    let a = &init.args;
    let (ah, aw) = if a.has("adj_h") || a.has("adj_w") {
        (a.usize("adj_h", 0)?, a.usize("adj_w", 0)?)
    } else {
        let v = a.usize("adj", 0)?;
        (v, v)
    };
    let group = a.int("group", 1)?;
    if group != 1 {
        bail!(op = init, NotImplemented: "ConvTranspose with group {group} is not supported (group must be 1)");
    }
    if ah >= g.stride[0] || aw >= g.stride[1] {
        bail!(op = init, BadArgument: "adj ({ah}, {aw}) must be smaller than the stride {:?}", g.stride);
    }
    Ok(Box::new(ConvTranspose {
        g,
        adj: [ah, aw],
        no_bias: a.bool("no_bias", false)?,
        gradient,
    }))
}
