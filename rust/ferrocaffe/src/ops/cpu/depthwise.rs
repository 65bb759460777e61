//! Depthwise convolution (one filter per channel: `group == C == M`), computed directly:
//! im2col + GEMM would multiply a `1 x kH*kW` filter per channel, wasting most of its time on
//! the column matrix.
//!
//! NCHW works a plane at a time: for each tap, whole output rows get `w * input row` added,
//! over the output columns whose input lies inside the image (`valid_range`), so the inner
//! loop vectorizes. NHWC works a pixel at a time with the channels innermost, against the
//! filters laid out tap-major once per call. Every output is `bias + sum over taps in (kh, kw)
//! order`, in both layouts. Planes (NCHW) or output rows (NHWC) are shared out to the team of
//! compute threads.

use super::conv::Dims;
use super::conv_args::{Geometry, Order};
use super::im2col::valid_range;
use crate::blas::{for_each_part, part_len};
use crate::error::{try_vec, Result};

/// `y = depthwise_conv(x, w) + bias` for all images.
pub(crate) fn forward(
    g: &Geometry,
    d: &Dims,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
) -> Result<()> {
    let kk = d.kh * d.kw;
    let work = y.len().saturating_mul(kk);
    match g.order {
        Order::Nchw => {
            let (plane_in, plane_out) = (d.h * d.w, d.oh * d.ow);
            let planes = d.n * d.c;
            let per = part_len(planes, work);
            let parts: Vec<(usize, &mut [f32])> = y
                .chunks_mut(per * plane_out)
                .enumerate()
                .map(|(i, p)| (i * per, p))
                .collect();
            for_each_part(parts, &|(first, out)| {
                for (k, yp) in out.chunks_mut(plane_out).enumerate() {
                    let p = first + k;
                    let ch = p % d.c;
                    let xp = &x[p * plane_in..(p + 1) * plane_in];
                    plane_nchw(
                        g,
                        d,
                        xp,
                        &w[ch * kk..(ch + 1) * kk],
                        bias.map(|b| b[ch]),
                        yp,
                    );
                }
            });
        }
        Order::Nhwc => {
            // W is [C, kh, kw, 1]: tap-major [kh * kw, C] puts a tap's channels side by side.
            let mut wt = try_vec(kk * d.c, 0f32, "the depthwise filter buffer")?;
            for ch in 0..d.c {
                for t in 0..kk {
                    wt[t * d.c + ch] = w[ch * kk + t];
                }
            }
            let rows = d.n * d.oh;
            let row_len = d.ow * d.c;
            let per = part_len(rows, work);
            let parts: Vec<(usize, &mut [f32])> = y
                .chunks_mut(per * row_len)
                .enumerate()
                .map(|(i, p)| (i * per, p))
                .collect();
            let wt = &wt;
            for_each_part(parts, &|(first, out)| {
                for (k, yr) in out.chunks_mut(row_len).enumerate() {
                    let r = first + k;
                    row_nhwc(g, d, x, wt, bias, r / d.oh, r % d.oh, yr);
                }
            });
        }
    }
    Ok(())
}

/// One NCHW plane: `xp` is `[h, w]`, `wk` the channel's `kh * kw` taps, `yp` `[oh, ow]`.
fn plane_nchw(g: &Geometry, d: &Dims, xp: &[f32], wk: &[f32], bias: Option<f32>, yp: &mut [f32]) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    yp.fill(bias.unwrap_or(0.0));
    for ki in 0..d.kh {
        for kj in 0..d.kw {
            let wv = wk[ki * d.kw + kj];
            let off = (kj * dw) as isize - pl;
            let (lo, hi) = valid_range(d.ow, sw, off, d.w);
            if lo == hi {
                continue;
            }
            let first = (lo as isize * sw as isize + off) as usize;
            for oy in 0..d.oh {
                let iy = (oy * sh + ki * dh) as isize - pt;
                if iy < 0 || iy >= d.h as isize {
                    continue;
                }
                let xr = &xp[iy as usize * d.w..(iy as usize + 1) * d.w];
                let yr = &mut yp[oy * d.ow + lo..oy * d.ow + hi];
                if sw == 1 {
                    for (o, v) in yr.iter_mut().zip(&xr[first..first + (hi - lo)]) {
                        *o += wv * v;
                    }
                } else {
                    for (o, v) in yr.iter_mut().zip(xr[first..].iter().step_by(sw)) {
                        *o += wv * v;
                    }
                }
            }
        }
    }
}

/// One NHWC output row `oy` of image `img`: `yr` is `[ow, C]`, `wt` the filters `[kh*kw, C]`.
#[allow(clippy::too_many_arguments)]
fn row_nhwc(
    g: &Geometry,
    d: &Dims,
    x: &[f32],
    wt: &[f32],
    bias: Option<&[f32]>,
    img: usize,
    oy: usize,
    yr: &mut [f32],
) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    let c = d.c;
    for (ox, out) in yr.chunks_mut(c).enumerate() {
        match bias {
            Some(b) => out.copy_from_slice(b),
            None => out.fill(0.0),
        }
        for ki in 0..d.kh {
            let iy = (oy * sh + ki * dh) as isize - pt;
            if iy < 0 || iy >= d.h as isize {
                continue;
            }
            for kj in 0..d.kw {
                let ix = (ox * sw + kj * dw) as isize - pl;
                if ix < 0 || ix >= d.w as isize {
                    continue;
                }
                let at = ((img * d.h + iy as usize) * d.w + ix as usize) * c;
                let xin = &x[at..at + c];
                let wk = &wt[(ki * d.kw + kj) * c..(ki * d.kw + kj + 1) * c];
                for ((o, xv), wv) in out.iter_mut().zip(xin).zip(wk) {
                    *o += xv * wv;
                }
            }
        }
    }
}
