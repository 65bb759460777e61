//! Depthwise convolution (one filter per channel: `group == C == M`), computed directly:
//! im2col + GEMM would multiply a `1 x kH*kW` filter per channel, wasting most of its time on
//! the column matrix.
//!
//! NHWC works a pixel at a time with the channels innermost, up to 32 of them accumulated in
//! registers over all taps, against the filters laid out tap-major once per call (compiled per
//! SIMD level). NCHW planes at least `WIDE` (16) wide, at column stride 1, work a plane at a
//! time: for each tap, whole output rows get `w * input row` added, over the output columns
//! whose input lies inside the image (`valid_range`), so the inner loop vectorizes. The other
//! NCHW planes (a row of 8 gives no vector; a strided row no contiguous one) are transposed to
//! NHWC a group of channels at a time, run as NHWC, and transposed back: 3-5x faster than the
//! plane-at-a-time loop at stride 2 (16x16 to 112x112 planes), but up to 2x slower at stride 1
//! on planes 16 or more wide. Every output is `bias + sum over taps in (kh, kw) order` on
//! every path. Planes or channel groups (NCHW) and output rows (NHWC) are shared out to the
//! team of compute threads.
//!
//! NCHW at stride 1 on rows of 16 or more goes to the few-channel direct kernel instead
//! (`conv_direct`, 1.2-3x faster there) unless `FERROCAFFE_DIRECT_CONV=0`; the plane-at-a-time
//! loop then serves stride `(>1, 1)` only.

use super::conv::Dims;
use super::conv_args::{Geometry, Order};
use super::im2col::valid_range;
use super::par::{channel_blocks, planes_per_part, ChannelBlock};
use crate::blas::{for_each_part, part_len, transpose_f32};
use crate::error::{try_vec, Result};

/// NCHW planes at least this wide, at column stride 1, run a plane at a time; the others
/// through NHWC.
pub(crate) const WIDE: usize = 16;

/// `[kh * kw, C]` (tap-major: a tap's channels side by side) from W's `[C, kh, kw, 1]`.
fn tap_major(w: &[f32], kk: usize, c: usize) -> Result<Vec<f32>> {
    let mut wt = try_vec(kk * c, 0f32, "the depthwise filter buffer")?;
    for ch in 0..c {
        for t in 0..kk {
            wt[t * c + ch] = w[ch * kk + t];
        }
    }
    Ok(wt)
}

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
        Order::Nchw if d.ow < WIDE || g.stride[1] != 1 => {
            let wt = tap_major(w, kk, d.c)?;
            let (plane_in, plane_out) = (d.h * d.w, d.oh * d.ow);
            let planes = d.n * d.c;
            let per = planes_per_part(planes, work);
            let parts: Vec<(usize, &mut [f32])> = y
                .chunks_mut(per * plane_out)
                .enumerate()
                .map(|(i, p)| (i * per, p))
                .collect();
            let wt = &wt;
            for_each_part(parts, &|(first, out)| {
                let (mut xt, mut yt, mut wg) = (Vec::new(), Vec::new(), Vec::new());
                let mut done = 0;
                let planes = out.len() / plane_out;
                while done < planes {
                    // The channels `ch..ch + cnt` of one image, as an NHWC image of `cnt`.
                    let ch = (first + done) % d.c;
                    let cnt = (d.c - ch).min(planes - done);
                    let src = &x[(first + done) * plane_in..(first + done + cnt) * plane_in];
                    xt.resize(plane_in * cnt, 0.0);
                    yt.resize(plane_out * cnt, 0.0);
                    transpose_f32(src, cnt, plane_in, &mut xt);
                    wg.clear();
                    for tap in wt.chunks_exact(d.c) {
                        wg.extend_from_slice(&tap[ch..ch + cnt]);
                    }
                    let dg = Dims { c: cnt, ..*d };
                    let bg = bias.map(|b| &b[ch..ch + cnt]);
                    for (oy, yr) in yt.chunks_exact_mut(d.ow * cnt).enumerate() {
                        row_nhwc(g, &dg, &xt, &wg, bg, 0, oy, yr);
                    }
                    let dst = &mut out[done * plane_out..(done + cnt) * plane_out];
                    transpose_f32(&yt, plane_out, cnt, dst);
                    done += cnt;
                }
            });
        }
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
            let wt = tap_major(w, kk, d.c)?;
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
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
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
    // The taps inside the image: (offset of the input row in `x`, tap index).
    let rows: Vec<(usize, usize)> = (0..d.kh)
        .filter_map(|ki| {
            let iy = (oy * sh + ki * dh) as isize - pt;
            (iy >= 0 && iy < d.h as isize).then(|| ((img * d.h + iy as usize) * d.w, ki))
        })
        .collect();
    for (ox, out) in yr.chunks_mut(c).enumerate() {
        // The filter columns whose input column lies inside the image: kj in lo..hi.
        let ix0 = (ox * sw) as isize - pl;
        let (lo, hi) = (0..d.kw)
            .filter(|&kj| (0..d.w as isize).contains(&(ix0 + (kj * dw) as isize)))
            .fold((usize::MAX, 0), |(lo, hi), kj| (lo.min(kj), hi.max(kj + 1)));
        let px = Pixel {
            x,
            wt,
            rows: &rows,
            cols: lo.min(hi)..hi,
            ix0,
            dw,
            kw: d.kw,
            c,
            bias,
        };
        channel_blocks(&px, c, out);
    }
}

/// One NHWC output pixel: its taps are the filter rows `rows` (offset of the input row in
/// `x` in pixels, filter row) by the filter columns `cols`, in (kh, kw) order; filter column
/// `kj` reads input column `ix0 + kj * dw`.
struct Pixel<'a> {
    x: &'a [f32],
    wt: &'a [f32],
    rows: &'a [(usize, usize)],
    cols: std::ops::Range<usize>,
    ix0: isize,
    dw: usize,
    kw: usize,
    c: usize,
    bias: Option<&'a [f32]>,
}

impl ChannelBlock for Pixel<'_> {
    /// Channels `c0..c0 + N`: `bias + x * w` over the taps, in an `N`-value array (registers).
    #[inline(always)]
    fn block<const N: usize>(&self, c0: usize, out: &mut [f32]) {
        let mut acc = [0f32; N];
        if let Some(b) = self.bias {
            acc.copy_from_slice(&b[c0..c0 + N]);
        }
        for &(row, ki) in self.rows {
            for kj in self.cols.clone() {
                // Inside the image (`cols`), so the column is not negative.
                let ix = (self.ix0 + (kj * self.dw) as isize) as usize;
                let xo = (row + ix) * self.c + c0;
                let wo = (ki * self.kw + kj) * self.c + c0;
                let xs = <&[f32; N]>::try_from(&self.x[xo..xo + N]);
                let ws = <&[f32; N]>::try_from(&self.wt[wo..wo + N]);
                if let (Ok(xs), Ok(ws)) = (xs, ws) {
                    for ((a, &xv), &wv) in acc.iter_mut().zip(xs).zip(ws) {
                        *a += xv * wv;
                    }
                }
            }
        }
        out[c0..c0 + N].copy_from_slice(&acc);
    }
}
