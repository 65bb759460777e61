//! UpsampleBilinear (NCHW): output `floor(H * height_scale) x floor(W * width_scale)` (scales
//! from arguments or from a second input `[height_scale, width_scale]`), corners aligned.

use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("UpsampleBilinear", create);
}

fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let ws = init.args.float("width_scale", 1.0)?;
    let hs = init.args.float("height_scale", 1.0)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (hs, ws) = if ctx.num_inputs() > 1 {
            let s = ctx.input(1)?.as_slice::<f32>()?;
            if s.len() != 2 {
                bail!(
                    op = ctx,
                    ShapeMismatch: "scales input must hold [height_scale, width_scale]"
                );
            }
            (s[0], s[1])
        } else {
            (hs, ws)
        };
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let d = x.dims();
        if d.len() != 4 {
            bail!(ShapeMismatch: "UpsampleBilinear expects NCHW input, got {d:?}");
        }
        let (n, c, h, w) = (d[0], d[1], d[2], d[3]);
        let (oh, ow) = ((h as f32 * hs) as usize, (w as f32 * ws) as usize);
        let xs = x.as_slice::<f32>()?;
        let y = outs.tensor(0)?.ensure::<f32>(&[n, c, oh, ow]);
        let rh = if oh > 1 {
            (h as f32 - 1.0) / (oh as f32 - 1.0)
        } else {
            0.0
        };
        let rw = if ow > 1 {
            (w as f32 - 1.0) / (ow as f32 - 1.0)
        } else {
            0.0
        };
        for p in 0..n * c {
            let src = &xs[p * h * w..(p + 1) * h * w];
            let dst = &mut y[p * oh * ow..(p + 1) * oh * ow];
            for y2 in 0..oh {
                let h1r = rh * y2 as f32;
                let h1 = h1r as usize;
                let h1p = usize::from(h1 + 1 < h);
                let l1 = h1r - h1 as f32;
                let l0 = 1.0 - l1;
                for x2 in 0..ow {
                    let w1r = rw * x2 as f32;
                    let w1 = w1r as usize;
                    let w1p = usize::from(w1 + 1 < w);
                    let m1 = w1r - w1 as f32;
                    let m0 = 1.0 - m1;
                    let a = src[h1 * w + w1];
                    let b = src[h1 * w + w1 + w1p];
                    let cc = src[(h1 + h1p) * w + w1];
                    let dd = src[(h1 + h1p) * w + w1 + w1p];
                    dst[y2 * ow + x2] = l0 * (m0 * a + m1 * b) + l1 * (m0 * cc + m1 * dd);
                }
            }
        }
        Ok(())
    })))
}
