//! The forward kernels of 2-d MaxPool and AveragePool, compiled per SIMD level (chosen at run
//! time), so that every window tap is a vector max or add:
//!
//! - **NHWC**: one output pixel at a time, its `c` channels contiguous; each tap is an
//!   element-wise max or add of `c` values.
//! - **NCHW, planes at least [`WIDE`] values wide**: one plane at a time. Each output row
//!   reduces its window's input rows into a row padded with the reduction's identity on both
//!   sides; each column window is then a reduction of that row at a fixed offset, done for
//!   every offset at once (vectors along the row) and read at the stride.
//! - **NCHW, narrower planes** (a 7-wide plane gives no vector along a row): the planes of an
//!   image are transposed to channels-innermost, pooled as NHWC, and transposed back. On the
//!   corpus's `8 x 32 x 15 x 15` 3x3 max pooling this was several times faster than the
//!   one-value-at-a-time loop it replaced.
//!
//! Max keeps the larger value and never a NaN (`v > m` is false for a NaN, like `f32::max`
//! skipping its NaN operand); an all-NaN or empty window gives -inf. Sums add the window's
//! rows top to bottom, then its columns left to right.

use super::pool::Win;
use crate::blas::transpose_f32;

/// NCHW planes at least this wide run one plane at a time, narrower ones through NHWC.
pub(crate) const WIDE: usize = 32;

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
    /// Column kernel, stride and padding before the first column.
    pub(crate) kw: usize,
    pub(crate) sw: usize,
    pub(crate) pw: usize,
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

impl Geo<'_> {
    fn identity(&self) -> f32 {
        if self.max {
            f32::NEG_INFINITY
        } else {
            0.0
        }
    }

    /// The padded row of the per-plane NCHW kernel: column windows start at multiples of the
    /// stride in it, the input at `pw`. `None` when it would be much longer than a row (a
    /// padding far larger than the input), which the caller leaves to the plain loop.
    pub(crate) fn padded_len(&self) -> Option<usize> {
        let len = self
            .ow
            .checked_sub(1)?
            .checked_mul(self.sw)?
            .checked_add(self.kw)?;
        (len <= self.w.saturating_mul(4).saturating_add(64)).then_some(len)
    }
}

/// Values reduced at once: a vector of `f32` on AVX2.
const LANES: usize = 8;

/// `a = a max b` (a NaN in `b` never wins) or `a = a + b`, element by element over the
/// shorter of the two.
#[inline(always)]
fn fold(max: bool, a: &mut [f32], b: &[f32]) {
    let n = a.len().min(b.len());
    let (a, b) = (&mut a[..n], &b[..n]);
    let mut ac = a.chunks_exact_mut(LANES);
    let mut bc = b.chunks_exact(LANES);
    for (x, y) in (&mut ac).zip(&mut bc) {
        // Reduced in a local array (registers), not in place: LLVM turns an in-place
        // `if v > *m { *m = v }` into masked stores, several times slower.
        let mut t = [0f32; LANES];
        t.copy_from_slice(x);
        fold_lanes(max, &mut t, y);
        x.copy_from_slice(&t);
    }
    fold_lanes(max, ac.into_remainder(), bc.remainder());
}

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
            let taps = Taps {
                win,
                row,
                cols: col.start * c..col.end * c,
                c,
            };
            if g.max {
                taps.reduce::<true>(out);
            } else {
                taps.reduce::<false>(out);
                let d = divisor(g.include_pad, r, col);
                for o in out.iter_mut() {
                    *o /= d;
                }
            }
        }
    }
}

/// The taps of one NHWC output pixel's window: rows of `row` values in `win`, the window's
/// columns at `cols` of each, `c` channels a pixel.
struct Taps<'a> {
    win: &'a [f32],
    row: usize,
    cols: std::ops::Range<usize>,
    c: usize,
}

impl Taps<'_> {
    /// `out[..c]` = the max (`MAX`) or sum of the taps, channel by channel.
    #[inline(always)]
    fn reduce<const MAX: bool>(&self, out: &mut [f32]) {
        let mut c0 = 0;
        while c0 + 32 <= self.c {
            self.block::<32, MAX>(c0, out);
            c0 += 32;
        }
        while c0 + LANES <= self.c {
            self.block::<LANES, MAX>(c0, out);
            c0 += LANES;
        }
        if c0 < self.c && self.c >= LANES {
            // The last channels as one more vector, overlapping the previous one: the
            // channels computed twice get the same values.
            self.block::<LANES, MAX>(self.c - LANES, out);
        } else {
            while c0 < self.c {
                self.block::<1, MAX>(c0, out);
                c0 += 1;
            }
        }
    }

    /// Channels `c0..c0 + N` (within `c`), reduced in an `N`-value array: registers.
    #[inline(always)]
    fn block<const N: usize, const MAX: bool>(&self, c0: usize, out: &mut [f32]) {
        let mut t = [if MAX { f32::NEG_INFINITY } else { 0.0 }; N];
        for xr in self.win.chunks_exact(self.row) {
            for px in xr[self.cols.clone()].chunks_exact(self.c) {
                if let Ok(v) = <&[f32; N]>::try_from(&px[c0..c0 + N]) {
                    fold_lanes(MAX, &mut t, v);
                }
            }
        }
        out[c0..c0 + N].copy_from_slice(&t);
    }
}

/// NCHW planes `first..`, one at a time: `y` holds whole output planes; `acc` is scratch of
/// [`Geo::padded_len`] values, `hm` of `(ow - 1) * sw + 1`.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(crate) fn nchw_planes<'g>(
    g: &Geo<'g>,
    x: &[f32],
    first: usize,
    y: &mut [f32],
    acc: &mut [f32],
    hm: &mut [f32],
) {
    let (h, w, ow) = (g.h, g.w, g.ow);
    // The input's columns that some window reaches, at `pw..pw + used` of `acc`.
    let used = w.min(acc.len().saturating_sub(g.pw));
    for (k, yp) in y.chunks_exact_mut(g.oh * ow).enumerate() {
        let xp = &x[(first + k) * h * w..(first + k + 1) * h * w];
        for (r, yrow) in g.rows.iter().zip(yp.chunks_exact_mut(ow)) {
            // Everything is reduced from the identity (never a copied value), so that a NaN
            // never wins a max.
            acc.fill(g.identity());
            if used > 0 {
                for xr in xp[r.start * w..r.end * w].chunks_exact(w) {
                    fold(g.max, &mut acc[g.pw..g.pw + used], &xr[..used]);
                }
            }
            // hm[i] = the reduction of acc[i..i + kw]: the window of column i / sw.
            hm.fill(g.identity());
            for j in 0..g.kw {
                fold(g.max, hm, &acc[j..]);
            }
            for ((o, col), &v) in yrow.iter_mut().zip(g.cols).zip(hm.iter().step_by(g.sw)) {
                *o = if g.max {
                    v
                } else {
                    v / divisor(g.include_pad, r, col)
                };
            }
        }
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
