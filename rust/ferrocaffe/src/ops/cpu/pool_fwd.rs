//! The forward kernels of 2-d MaxPool and AveragePool, compiled per SIMD level (chosen at run
//! time), so that every window tap is a vector max or add:
//!
//! - **NHWC**: one output pixel at a time, its `c` channels contiguous and reduced up to 32
//!   at a time in registers over all the window's taps.
//! - **NCHW**: the planes of an image (a group of channels at a time) are transposed to
//!   channels-innermost, pooled as NHWC, and transposed back. Along a row, an NCHW plane gives
//!   short vectors (7 values) and strided windows; this was 2.5-7x faster than the
//!   one-value-at-a-time loop it replaced on every plane size measured (7x7 to 112x112), and
//!   than a plane-at-a-time kernel with vectors along the rows.
//!
//! Max keeps the larger value and never a NaN (`v > m` is false for a NaN, like `f32::max`
//! skipping its NaN operand); an all-NaN or empty window gives -inf. Sums add the window's
//! rows top to bottom, then its columns left to right.

use super::par::{channel_blocks, ChannelBlock};
use super::pool::Win;
use crate::blas::transpose_f32;

/// One run's geometry, as the kernels read it.
pub(crate) struct Geo<'a> {
    /// Max pooling (else average).
    pub(crate) max: bool,
    /// Averages divide by the window's extent over the padded input (else over the input).
    pub(crate) include_pad: bool,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    /// Row and column windows (`oh` and `ow` of them).
    pub(crate) rows: &'a [Win],
    pub(crate) cols: &'a [Win],
}

/// The divisor of an average over the window `(r, c)`.
#[inline]
pub(crate) fn divisor(include_pad: bool, r: &Win, c: &Win) -> f32 {
    if include_pad {
        r.span.saturating_mul(c.span).max(1) as f32
    } else {
        ((r.end - r.start) * (c.end - c.start)).max(1) as f32
    }
}

/// `a = max(a, b)` (a NaN in `b` never wins) or `a += b`, element by element.
#[inline(always)]
fn fold_lanes(max: bool, a: &mut [f32], b: &[f32]) {
    if max {
        for (m, &v) in a.iter_mut().zip(b) {
            *m = if v > *m { v } else { *m };
        }
    } else {
        for (s, &v) in a.iter_mut().zip(b) {
            *s += v;
        }
    }
}

/// NHWC output rows `first..`: `y` holds whole rows (`ow * c` values), `x` whole images
/// (`h * w * c` values each). Each output pixel is reduced up to 32 channels at a time in
/// registers, over all the window's taps.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(crate) fn nhwc_rows<'g>(g: &Geo<'g>, c: usize, x: &[f32], first: usize, y: &mut [f32]) {
    let (row, img_len) = (g.w * c, g.h * g.w * c);
    for (k, yrow) in y.chunks_exact_mut(g.ow * c).enumerate() {
        let (img, oy) = ((first + k) / g.oh, (first + k) % g.oh);
        let r = &g.rows[oy];
        let xi = &x[img * img_len..(img + 1) * img_len];
        let win = &xi[r.start * row..r.end * row];
        for (out, col) in yrow.chunks_exact_mut(c).zip(g.cols) {
            let cols = col.start * c..col.end * c;
            if g.max {
                channel_blocks(&Taps::<true> { win, row, cols, c }, c, out);
            } else {
                channel_blocks(&Taps::<false> { win, row, cols, c }, c, out);
                let d = divisor(g.include_pad, r, col);
                for o in out.iter_mut() {
                    *o /= d;
                }
            }
        }
    }
}

/// The taps of one NHWC output pixel's window: rows of `row` values in `win`, the window's
/// columns at `cols` of each, `c` channels a pixel; their max (`MAX`) or sum.
struct Taps<'a, const MAX: bool> {
    win: &'a [f32],
    row: usize,
    cols: std::ops::Range<usize>,
    c: usize,
}

impl<const MAX: bool> ChannelBlock for Taps<'_, MAX> {
    /// Channels `c0..c0 + N` (within `c`), reduced in an `N`-value array: registers.
    #[inline(always)]
    fn block<const N: usize>(&self, c0: usize, out: &mut [f32]) {
        let mut t = [if MAX { f32::NEG_INFINITY } else { 0.0 }; N];
        // An input of no columns has empty rows (`win` is empty too): no taps.
        for xr in self.win.chunks_exact(self.row.max(1)) {
            for px in xr[self.cols.clone()].chunks_exact(self.c) {
                if let Ok(v) = <&[f32; N]>::try_from(&px[c0..c0 + N]) {
                    fold_lanes(MAX, &mut t, v);
                }
            }
        }
        out[c0..c0 + N].copy_from_slice(&t);
    }
}

/// NCHW planes `first..` through NHWC: `y` holds whole output planes. The planes of each
/// image in the part are transposed to `h * w x planes`, pooled, and transposed back.
pub(crate) fn nchw_through_nhwc(g: &Geo<'_>, c: usize, x: &[f32], first: usize, y: &mut [f32]) {
    let (hw, ohw) = (g.h * g.w, g.oh * g.ow);
    let planes = y.len() / ohw.max(1);
    let mut xt = Vec::new();
    let mut yt = Vec::new();
    let mut done = 0;
    while done < planes {
        // The planes of one image from here: channel `ch` of image `(first + done) / c`.
        let ch = (first + done) % c;
        let cnt = (c - ch).min(planes - done);
        let src = &x[(first + done) * hw..(first + done + cnt) * hw];
        xt.resize(hw * cnt, 0.0);
        yt.resize(ohw * cnt, 0.0);
        transpose_f32(src, cnt, hw, &mut xt);
        nhwc_rows(g, cnt, &xt, 0, &mut yt);
        transpose_f32(&yt, ohw, cnt, &mut y[done * ohw..(done + cnt) * ohw]);
        done += cnt;
    }
}
