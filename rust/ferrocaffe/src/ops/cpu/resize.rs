//! UpsampleBilinear (NCHW): output `floor(H * height_scale) x floor(W * width_scale)` (scales
//! from arguments or from a second input `[height_scale, width_scale]`), corners aligned.
//!
//! UpsampleBilinearGradient: inputs dY, X (and the scales input, read for its shape only, as
//! Caffe2's ratios come from the two tensors' sizes); output dX of X's shape, each dY element
//! spread over its four source pixels with the forward's weights.

use super::par::for_each_chunk;
use crate::bail;
use crate::error::Result;
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

/// [`source`] of every output index `0..out` (`inp` > 0).
/// Each output row `o` of a plane (`out`, rows of `ow`) `= (1 - l1) * across[h1] + l1 *
/// across[h1 + h1p]` for `rows[o] = (h1, h1p, l1)`, element by element: the whole plane in one
/// call, compiled per SIMD level (a call per row cost as much as the blends on 32-wide rows).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn blend_rows(rows: &[(usize, usize, f32)], across: &[f32], ow: usize, out: &mut [f32]) {
    for (&(h1, h1p, l1), drow) in rows.iter().zip(out.chunks_exact_mut(ow)) {
        let l0 = 1.0 - l1;
        let top = &across[h1 * ow..(h1 + 1) * ow];
        let bottom = &across[(h1 + h1p) * ow..(h1 + h1p + 1) * ow];
        for ((o, &t), &b) in drow.iter_mut().zip(top).zip(bottom) {
            *o = l0 * t + l1 * b;
        }
    }
}

fn axis_sources(r: f32, out: usize, inp: usize) -> Vec<(usize, usize, f32)> {
    (0..out).map(|o| source(r, o, inp)).collect()
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
        let xd = xd.to_vec();
        let dx = outs.tensor(0)?.ensure::<f32>(&xd);
        dx.fill(0.0);
        if dx.is_empty() || oh * ow == 0 {
            return Ok(());
        }
        let (rows, cols) = (
            axis_sources(ratio(h, oh), oh, h),
            axis_sources(ratio(w, ow), ow, w),
        );
        for_each_chunk(
            dx,
            h * w,
            (h * w).saturating_add(4 * oh * ow),
            &|first, part| {
                for (k, dst) in part.chunks_mut(h * w).enumerate() {
                    let p = first + k;
                    let src = &g[p * oh * ow..(p + 1) * oh * ow];
                    for (&(h1, h1p, l1), grow) in rows.iter().zip(src.chunks_exact(ow)) {
                        let l0 = 1.0 - l1;
                        let (top, bottom) = (h1 * w, (h1 + h1p) * w);
                        for (&(w1, w1p, m1), &v) in cols.iter().zip(grow) {
                            let m0 = 1.0 - m1;
                            dst[top + w1] += l0 * m0 * v;
                            dst[top + w1 + w1p] += l0 * m1 * v;
                            dst[bottom + w1] += l1 * m0 * v;
                            dst[bottom + w1 + w1p] += l1 * m1 * v;
                        }
                    }
                }
            },
        );
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
        if y.is_empty() {
            return Ok(());
        }
        // oh, ow > 0 here, and so are h and w (oh = floor(h * hs)).
        let (rows, cols) = (
            axis_sources(ratio(h, oh), oh, h),
            axis_sources(ratio(w, ow), ow, w),
        );
        for_each_chunk(y, oh * ow, (oh * ow).saturating_mul(4), &|first, part| {
            if h <= oh {
                // Each input row interpolated along the width once (h * ow <= the output
                // plane), then each output row a vector blend of two of those.
                let mut across = vec![0f32; h * ow];
                for (k, dst) in part.chunks_mut(oh * ow).enumerate() {
                    let p = first + k;
                    let src = &xs[p * h * w..(p + 1) * h * w];
                    for (srow, arow) in src.chunks_exact(w).zip(across.chunks_exact_mut(ow)) {
                        for (o, &(w1, w1p, m1)) in arow.iter_mut().zip(&cols) {
                            *o = (1.0 - m1) * srow[w1] + m1 * srow[w1 + w1p];
                        }
                    }
                    blend_rows(&rows, &across, ow, dst);
                }
                return;
            }
            for (k, dst) in part.chunks_mut(oh * ow).enumerate() {
                let p = first + k;
                let src = &xs[p * h * w..(p + 1) * h * w];
                for (&(h1, h1p, l1), drow) in rows.iter().zip(dst.chunks_exact_mut(ow)) {
                    let l0 = 1.0 - l1;
                    let top = &src[h1 * w..(h1 + 1) * w];
                    let bottom = &src[(h1 + h1p) * w..(h1 + h1p + 1) * w];
                    for (o, &(w1, w1p, m1)) in drow.iter_mut().zip(&cols) {
                        let m0 = 1.0 - m1;
                        let (a, b) = (top[w1], top[w1 + w1p]);
                        let (cc, dd) = (bottom[w1], bottom[w1 + w1p]);
                        *o = l0 * (m0 * a + m1 * b) + l1 * (m0 * cc + m1 * dd);
                    }
                }
            }
        });
        Ok(())
    })))
}
