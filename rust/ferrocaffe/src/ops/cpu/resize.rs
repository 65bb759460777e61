//! UpsampleBilinear (NCHW): output `floor(H * height_scale) x floor(W * width_scale)` (scales
//! from arguments or from a second input `[height_scale, width_scale]`), corners aligned.
//!
//! UpsampleBilinearGradient: inputs dY, X (and the scales input, read for its shape only, as
//! Caffe2's ratios come from the two tensors' sizes); output dX of X's shape, each dY element
//! spread over its four source pixels with the forward's weights.

use crate::bail;
use crate::error::{try_vec, Result};
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("UpsampleBilinear", create);
    r.cpu("UpsampleBilinearGradient", create_gradient);
}

/// `(in - 1) / (out - 1)`, the align-corners ratio from an output index to an input position.
fn ratio(inp: usize, out: usize) -> f32 {
    if out > 1 {
        (inp as f32 - 1.0) / (out as f32 - 1.0)
    } else {
        0.0
    }
}

/// Source row (or column) of output index `o`: (first index, step to the second, weight of
/// the second), the index clamped to `inp - 1` (`inp` > 0).
fn source(r: f32, o: usize, inp: usize) -> (usize, usize, f32) {
    let pos = r * o as f32;
    let i = (pos as usize).min(inp - 1);
    (i, usize::from(i + 1 < inp), pos - i as f32)
}

fn create_gradient(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    init.args.float("width_scale", 1.0)?;
    init.args.float("height_scale", 1.0)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        if ctx.num_inputs() > 2 && ctx.input(2)?.numel() != 2 {
            bail!(
                op = ctx,
                ShapeMismatch: "scales input must hold [height_scale, width_scale]"
            );
        }
        let (ins, mut outs) = ctx.split();
        let dy = ins.tensor(0)?;
        let x = ins.tensor(1)?;
        let (gd, xd) = (dy.dims(), x.dims());
        if gd.len() != 4 || xd.len() != 4 || gd[..2] != xd[..2] {
            bail!(
                ShapeMismatch: "UpsampleBilinearGradient expects NCHW dY and X with the same N \
                 and C, got {gd:?} and {xd:?}"
            );
        }
        let (n, c, oh, ow) = (gd[0], gd[1], gd[2], gd[3]);
        let (h, w) = (xd[2], xd[3]);
        let planes = n * c;
        if planes > 0 && oh * ow > 0 && h * w == 0 {
            bail!(ShapeMismatch: "dY {gd:?} is not empty but X {xd:?} has no pixels");
        }
        let g = dy.as_slice::<f32>()?;
        let mut acc = try_vec(x.numel(), 0f32, "UpsampleBilinearGradient dX")?;
        let (rh, rw) = (ratio(h, oh), ratio(w, ow));
        for p in 0..planes {
            let src = &g[p * oh * ow..(p + 1) * oh * ow];
            let dst = &mut acc[p * h * w..(p + 1) * h * w];
            for y2 in 0..oh {
                let (h1, h1p, l1) = source(rh, y2, h);
                let l0 = 1.0 - l1;
                for x2 in 0..ow {
                    let (w1, w1p, m1) = source(rw, x2, w);
                    let m0 = 1.0 - m1;
                    let v = src[y2 * ow + x2];
                    let top = h1 * w + w1;
                    let bottom = (h1 + h1p) * w + w1;
                    dst[top] += l0 * m0 * v;
                    dst[top + w1p] += l0 * m1 * v;
                    dst[bottom] += l1 * m0 * v;
                    dst[bottom + w1p] += l1 * m1 * v;
                }
            }
        }
        let xd = xd.to_vec();
        outs.tensor(0)?.ensure::<f32>(&xd).copy_from_slice(&acc);
        Ok(())
    })))
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
        let y = outs.tensor(0)?.try_ensure::<f32>(&[n, c, oh, ow])?;
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
