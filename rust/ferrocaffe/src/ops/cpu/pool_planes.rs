//! NCHW pooling one plane at a time on AVX-512F, for planes 16 to 32 wide with at most 16
//! output columns: an output row is one 16-lane vector, lane `ox` its output column.
//!
//! The input rows of the row's window are loaded whole (one or two masked vectors), and each
//! window column `j` is brought under the output lanes by a permute (lane `ox` takes column
//! `cols[ox].start + j`). The taps are folded in the window's row-major order, as
//! [`super::pool_fwd`]'s NHWC kernel folds them, so both give the same bits: a NaN never wins a
//! max, and of equal maxima the first stays (each window row is folded on its own, then into
//! the rows before it, which keeps that order); sums add row by row, left to right, a lane
//! whose window has fewer columns skipping the missing taps (masked adds).
//!
//! The other way to vectorize NCHW, transposing the planes to NHWC and back, costs two passes
//! of shuffles over the data. Measured one op at a time on one core of a Xeon (AVX-512),
//! against that path: `8x16x32x32` 3x3 stride 2 took 64 -> 24-28 us, `8x8x16x16` 2x2 stride 2
//! 7.4 -> 3.2 us; but planes narrower than 16 lost (`8x32x15x15` 3x3 stride 2: 17.8 -> 19.6 us,
//! 7x7 planes 1.7-2.3x slower): there the transposes are short, and each tap's permute and mask
//! move share one port, so those stay on the NHWC path ([`fits`]).

use std::arch::x86_64::*;

use super::pool::Win;
use super::pool_fwd::{divisor, Geo};
use crate::blas::mask16;

/// Lanes of a vector: the most output columns.
const LANES: usize = 16;

/// Whether planes of this geometry run here: AVX-512F, a plane with pixels, input rows of 16
/// to 32 values (narrower ones measured faster through NHWC, see the module docs) and 2 to 16
/// output columns (a single one, global pooling, would use one lane of each vector; the NHWC
/// path folds 16 planes at once there), and no column window wholly in the padding (a lane
/// past its window's end rereads the window's first column).
fn fits(g: &Geo<'_>) -> bool {
    g.h > 0
        && (LANES..=2 * LANES).contains(&g.w)
        && (2..=LANES).contains(&g.ow)
        && g.cols.len() == g.ow
        && g.cols.iter().all(|c| c.start < c.end)
        && std::arch::is_x86_feature_detected!("avx512f")
}

/// Window column `j` of every output column: the input column each lane reads and the lanes
/// whose window has a column `j`.
struct Tap {
    idx: [i32; LANES],
    mask: __mmask16,
}

/// The taps of the column windows, `0..` the widest window.
fn taps(cols: &[Win]) -> Vec<Tap> {
    let widest = cols.iter().map(|c| c.end - c.start).max().unwrap_or(0);
    (0..widest)
        .map(|j| {
            let mut t = Tap {
                idx: [0; LANES],
                mask: 0,
            };
            for (ox, c) in cols.iter().enumerate() {
                // < w <= 32: fits an i32 and a permute index. A lane past its window's end
                // reads the window's first column (for a max, a tap already folded).
                if c.start + j < c.end {
                    t.idx[ox] = (c.start + j) as i32;
                    t.mask |= 1 << ox;
                } else {
                    t.idx[ox] = c.start as i32;
                }
            }
            t
        })
        .collect()
}

/// Pools planes `first..` of `x` (NCHW, whole `h x w` planes) into `y` (whole output planes)
/// where [`fits`] takes the geometry; false, with nothing written, where it does not.
///
/// # Panics
/// When `x` lacks a plane `y` asks for.
pub(crate) fn run(g: &Geo<'_>, x: &[f32], first: usize, y: &mut [f32]) -> bool {
    if !fits(g) {
        return false;
    }
    let (hw, ohw) = (g.h * g.w, g.oh * g.ow);
    let planes = y.len() / ohw.max(1);
    let x = &x[first * hw..(first + planes) * hw];
    assert!(g.rows.iter().all(|r| r.start <= r.end && r.end <= g.h));
    let taps = taps(g.cols);
    // Each output row's divisors (averages only): one lane per output column.
    let divisors: Vec<[f32; LANES]> = if g.max {
        Vec::new()
    } else {
        g.rows
            .iter()
            .map(|r| {
                let mut d = [1.0; LANES];
                for (v, c) in d.iter_mut().zip(g.cols) {
                    *v = divisor(g.include_pad, r, c);
                }
                d
            })
            .collect()
    };
    for (xp, yp) in x.chunks_exact(hw).zip(y.chunks_exact_mut(ohw)) {
        // SAFETY: AVX-512F is available (`fits`); every row read lies in `xp` (window rows
        // below `h`, asserted above; lanes from `w` on are masked off), every store in `yp`'s
        // row of `ow` values (lanes from `ow` on masked off).
        unsafe {
            if g.max {
                plane::<true>(g, &taps, &divisors, xp, yp);
            } else {
                plane::<false>(g, &taps, &divisors, xp, yp);
            }
        }
    }
    true
}

/// One plane: `xp` is `h x w`, `yp` is `oh x ow`.
///
/// # Safety
/// AVX-512F is available; `xp` and `yp` hold the plane and its output, every window row is
/// below `h`, `w <= 32`, `ow <= 16`, and `divisors` has a row per output row when `!MAX`.
#[target_feature(enable = "avx512f")]
unsafe fn plane<const MAX: bool>(
    g: &Geo<'_>,
    taps: &[Tap],
    divisors: &[[f32; LANES]],
    xp: &[f32],
    yp: &mut [f32],
) {
    let (w, ow) = (g.w, g.ow);
    let (lo_mask, hi_mask) = (mask16(w), mask16(w.saturating_sub(LANES)));
    let wide = w > LANES;
    let out_mask = mask16(ow);
    let start = if MAX {
        _mm512_set1_ps(f32::NEG_INFINITY)
    } else {
        _mm512_setzero_ps()
    };
    for (oy, r) in g.rows.iter().enumerate() {
        let mut acc = start;
        for row in r.start..r.end {
            // SAFETY: row < h, so `row * w + w <= xp.len()`; lanes at or past `w` are
            // masked off and not read.
            let (lo, hi) = unsafe {
                let p = xp.as_ptr().add(row * w);
                let lo = _mm512_maskz_loadu_ps(lo_mask, p);
                let hi = if wide {
                    _mm512_maskz_loadu_ps(hi_mask, p.add(LANES))
                } else {
                    _mm512_setzero_ps()
                };
                (lo, hi)
            };
            // A max folds the row into its own accumulator, then that into `acc`: `r > acc ?
            // r : acc` keeps the earlier of equal maxima, as folding tap by tap would, and the
            // rows' chains run side by side.
            let mut racc = start;
            for t in taps {
                // SAFETY: reads 16 i32 from an array of 16.
                let ix = unsafe { _mm512_loadu_si512(t.idx.as_ptr().cast()) };
                let v = if wide {
                    _mm512_permutex2var_ps(lo, ix, hi)
                } else {
                    _mm512_permutexvar_ps(ix, lo)
                };
                if MAX {
                    // `v > racc ? v : racc` (vmaxps returns its second operand when either is
                    // a NaN). Unmasked: a lane past its window's end reads the window's first
                    // column again ([`taps`]), which cannot change its max.
                    racc = _mm512_max_ps(v, racc);
                } else {
                    acc = _mm512_mask_add_ps(acc, t.mask, acc, v);
                }
            }
            if MAX {
                acc = _mm512_max_ps(racc, acc);
            }
        }
        if !MAX {
            // SAFETY: reads 16 f32 from an array of 16.
            let d = unsafe { _mm512_loadu_ps(divisors[oy].as_ptr()) };
            acc = _mm512_div_ps(acc, d);
        }
        // SAFETY: `oy * ow + ow <= yp.len()`; lanes at or past `ow` are masked off.
        unsafe { _mm512_mask_storeu_ps(yp.as_mut_ptr().add(oy * ow), out_mask, acc) };
    }
}
