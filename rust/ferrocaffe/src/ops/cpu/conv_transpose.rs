//! ConvTranspose (2-d, NCHW with W `[C_in, C_out, kH, kW]` or NHWC with W
//! `[C_in, kH, kW, C_out]`): GEMM into columns, then col2im. Output size
//! `(in - 1) * stride - pad_head - pad_tail + kernel + adj`.

use super::conv::{col2im, Dims};
use super::conv_args::{Geometry, Order};
use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

/// Registers ConvTranspose.
pub fn register(r: &mut Registry) {
    r.cpu("ConvTranspose", create);
}

struct ConvTranspose {
    g: Geometry,
    adj: [usize; 2],
}

impl Operator for ConvTranspose {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let (n, cin, h, wd) = self.g.nchw(x.dims())?;
        let wdims = w.dims();
        if wdims.len() != 4 || wdims[0] != cin {
            bail!(ShapeMismatch: "filter {wdims:?} must be 4-d with {cin} input channels first");
        }
        let (cout, kh, kw) = match self.g.order {
            Order::Nchw => (wdims[1], wdims[2], wdims[3]),
            Order::Nhwc => (wdims[3], wdims[1], wdims[2]),
        };
        let size =
            |inp: usize, k: usize, s: usize, p0: usize, p1: usize, adj: usize| -> Result<usize> {
                ((inp.max(1) - 1) * s + k + adj)
                    .checked_sub(p0 + p1)
                    .ok_or_else(|| err!(BadArgument: "padding larger than the output"))
            };
        let g = &self.g;
        let oh = size(h, kh, g.stride[0], g.pad[0], g.pad[2], self.adj[0])?;
        let ow = size(wd, kw, g.stride[1], g.pad[1], g.pad[3], self.adj[1])?;
        let bias = if ins.len() > 2 {
            let b = ins.tensor(2)?.as_slice::<f32>()?;
            if b.len() != cout {
                bail!(ShapeMismatch: "bias has {} values, expected {cout}", b.len());
            }
            Some(b)
        } else {
            None
        };
        // The conv whose input is our output and whose output is our input.
        let d = Dims {
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
        };
        let (xs, ws) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let y_dims = g.dims(n, cout, oh, ow);
        let y = outs.tensor(0)?.ensure::<f32>(&y_dims);
        y.fill(0.0);
        let so = h * wd;
        let kd = cout * kh * kw;
        let mut col = vec![0f32; kd * so];
        for img in 0..n {
            let xi = &xs[img * cin * so..(img + 1) * cin * so];
            match g.order {
                Order::Nchw => gemm.sgemm(true, false, kd, so, cin, 1.0, ws, xi, 0.0, &mut col),
                Order::Nhwc => gemm.sgemm(false, false, so, kd, cin, 1.0, xi, ws, 0.0, &mut col),
            }
            col2im(g, &d, &col, img, 0, y);
        }
        if let Some(b) = bias {
            let plane = oh * ow;
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
}

fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let g = Geometry::new(init)?;
    let a = &init.args;
    let (ah, aw) = if a.has("adj_h") || a.has("adj_w") {
        (a.usize("adj_h", 0)?, a.usize("adj_w", 0)?)
    } else {
        let v = a.usize("adj", 0)?;
        (v, v)
    };
    Ok(Box::new(ConvTranspose { g, adj: [ah, aw] }))
}
