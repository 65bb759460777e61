//! Column matrices of convolutions: `im2col` lays out the input windows of one image and group
//! as a matrix that one GEMM multiplies with the filters, `col2im` adds such a matrix back
//! into an image (the input gradient, ConvTranspose's output).
//!
//! Layouts: NCHW columns are `[C/G * kH * kW, oH * oW]` (one row per filter tap, one column
//! per output pixel), NHWC columns `[oH * oW, kH * kW * C/G]`.
//!
//! Each NCHW row is written a whole output row at a time: the output columns whose input
//! column lies inside the image are worked out once per tap (`valid_range`), so the inner
//! loop is a plain copy (stride 1) or a strided gather, with no bounds test per element.

use super::conv::Dims;
use super::conv_args::{Geometry, Order};

/// The output positions `o` in `0..out` whose input position `o * stride + offset` lies in
/// `0..len`: `lo..hi` (empty, `lo == hi`, when none does).
pub(crate) fn valid_range(out: usize, stride: usize, offset: isize, len: usize) -> (usize, usize) {
    let stride = stride.max(1);
    let lo = if offset >= 0 {
        0
    } else {
        offset.unsigned_abs().div_ceil(stride)
    };
    let limit = len as isize - offset;
    let hi = if limit <= 0 {
        0
    } else {
        (limit as usize).div_ceil(stride)
    };
    let lo = lo.min(out);
    (lo, hi.min(out).max(lo))
}

/// Column matrix of image `img`, group `gi` (layouts above).
pub(crate) fn im2col(g: &Geometry, d: &Dims, x: &[f32], img: usize, gi: usize, col: &mut [f32]) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    let cg = d.c / d.group;
    match g.order {
        Order::Nchw => {
            let plane = d.h * d.w;
            let base = (img * d.c + gi * cg) * plane;
            let so = d.oh * d.ow;
            for c in 0..cg {
                let xc = &x[base + c * plane..base + (c + 1) * plane];
                for ki in 0..d.kh {
                    for kj in 0..d.kw {
                        let row = ((c * d.kh + ki) * d.kw + kj) * so;
                        let off = (kj * dw) as isize - pl;
                        let (lo, hi) = valid_range(d.ow, sw, off, d.w);
                        for oy in 0..d.oh {
                            let dst = &mut col[row + oy * d.ow..row + (oy + 1) * d.ow];
                            let iy = (oy * sh + ki * dh) as isize - pt;
                            if iy < 0 || iy >= d.h as isize {
                                dst.fill(0.0);
                                continue;
                            }
                            let src = &xc[iy as usize * d.w..(iy as usize + 1) * d.w];
                            dst[..lo].fill(0.0);
                            dst[hi..].fill(0.0);
                            if lo == hi {
                                continue;
                            }
                            // lo * sw + off >= 0 by construction of the range.
                            let first = (lo as isize * sw as isize + off) as usize;
                            if sw == 1 {
                                dst[lo..hi].copy_from_slice(&src[first..first + (hi - lo)]);
                            } else {
                                for (o, s) in
                                    dst[lo..hi].iter_mut().zip(src[first..].iter().step_by(sw))
                                {
                                    *o = *s;
                                }
                            }
                        }
                    }
                }
            }
        }
        Order::Nhwc => im2col_nhwc_rows(g, d, x, img, gi, 0..d.oh, col),
    }
}

/// The NHWC column matrix's rows of output rows `oys` of image `img`, group `gi`: `col` holds
/// `oys.len() * ow` rows of `kH * kW * C/G` values (row 0 is pixel `(oys.start, 0)`).
pub(crate) fn im2col_nhwc_rows(
    g: &Geometry,
    d: &Dims,
    x: &[f32],
    img: usize,
    gi: usize,
    oys: std::ops::Range<usize>,
    col: &mut [f32],
) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    let cg = d.c / d.group;
    let kd = cg * d.kh * d.kw;
    // With one group and no dilation, the taps of one window row are one run of
    // kw * C values of the input.
    let runs = d.group == 1 && dw == 1;
    let first_row = oys.start;
    for oy in oys {
        for ox in 0..d.ow {
            let p = (oy - first_row) * d.ow + ox;
            let off = (ox * sw) as isize - pl;
            let (lo, hi) = valid_range(d.kw, dw, off, d.w);
            for ki in 0..d.kh {
                let iy = (oy * sh + ki * dh) as isize - pt;
                let dst = &mut col[p * kd + ki * d.kw * cg..p * kd + (ki + 1) * d.kw * cg];
                if iy < 0 || iy >= d.h as isize || lo == hi {
                    dst.fill(0.0);
                    continue;
                }
                dst[..lo * cg].fill(0.0);
                dst[hi * cg..].fill(0.0);
                let row = (img * d.h + iy as usize) * d.w;
                // lo * dw + off >= 0 by construction of the range.
                let first = (lo as isize * dw as isize + off) as usize;
                if runs {
                    let src = (row + first) * d.c;
                    dst[lo * cg..hi * cg].copy_from_slice(&x[src..src + (hi - lo) * d.c]);
                } else {
                    for kj in lo..hi {
                        let src = (row + first + (kj - lo) * dw) * d.c + gi * cg;
                        dst[kj * cg..(kj + 1) * cg].copy_from_slice(&x[src..src + cg]);
                    }
                }
            }
        }
    }
}

/// One filter tap's row of an NCHW column matrix: where it starts, and the input column of
/// output column 0 (`kj * dilation - pad`).
#[derive(Clone, Copy)]
struct Tap {
    row: usize,
    off: isize,
}

/// Adds tap `t` of filter row `ki` into the channel plane `xc`: output row `oy` into input
/// row `oy * sh + ki * dh - pt`, column `ox` into column `ox * sw + t.off`.
fn add_tap(g: &Geometry, d: &Dims, col: &[f32], ki: usize, t: Tap, xc: &mut [f32]) {
    let (sh, sw, dh) = (g.stride[0], g.stride[1], g.dilation[0]);
    let pt = g.pad[0] as isize;
    let (lo, hi) = valid_range(d.ow, sw, t.off, d.w);
    if lo == hi {
        return;
    }
    let first = (lo as isize * sw as isize + t.off) as usize;
    for oy in 0..d.oh {
        let iy = (oy * sh + ki * dh) as isize - pt;
        if iy < 0 || iy >= d.h as isize {
            continue;
        }
        let src = &col[t.row + oy * d.ow + lo..t.row + oy * d.ow + hi];
        let dst = &mut xc[iy as usize * d.w..(iy as usize + 1) * d.w];
        if sw == 1 {
            for (o, s) in dst[first..first + (hi - lo)].iter_mut().zip(src) {
                *o += s;
            }
        } else {
            for (o, s) in dst[first..].iter_mut().step_by(sw).zip(src) {
                *o += s;
            }
        }
    }
}

/// [`add_tap`] for two neighbouring taps `(a, b)` at column stride 2 (no dilation), whose
/// columns interleave: `a` adds into input columns `2 ox + a.off`, `b` into the next ones.
/// Where both have output column `ox`, the two values go in as one run of pairs (a loop
/// that vectorizes, where the strided loop of one tap cost ~3 cycles a value: 60% of a
/// stride-2 ConvTranspose); the columns only one of them has go in one by one. An input
/// value gets at most one term from the pair for each output row (the two taps reach
/// columns of opposite parities), so its terms still come in `add_tap`'s order, tap after
/// tap: the same sums, bit for bit.
fn add_tap_pair(
    g: &Geometry,
    d: &Dims,
    col: &[f32],
    ki: usize,
    (a, b): (Tap, Tap),
    xc: &mut [f32],
) {
    let (sh, dh) = (g.stride[0], g.dilation[0]);
    let pt = g.pad[0] as isize;
    let (la, ha) = valid_range(d.ow, 2, a.off, d.w);
    let (lb, hb) = valid_range(d.ow, 2, b.off, d.w);
    let lo = la.max(lb);
    let hi = ha.min(hb).max(lo);
    let at = |t: Tap, ox: usize| (2 * ox as isize + t.off) as usize;
    for oy in 0..d.oh {
        let iy = (oy * sh + ki * dh) as isize - pt;
        if iy < 0 || iy >= d.h as isize {
            continue;
        }
        let dst = &mut xc[iy as usize * d.w..(iy as usize + 1) * d.w];
        let (ra, rb) = (a.row + oy * d.ow, b.row + oy * d.ow);
        if lo < hi {
            // 2 lo + a.off >= 0 (lo >= la) and 2 (hi - 1) + b.off < w (hi <= hb).
            let start = at(a, lo);
            let pairs = dst[start..start + 2 * (hi - lo)].chunks_exact_mut(2);
            let vals = col[ra + lo..ra + hi].iter().zip(&col[rb + lo..rb + hi]);
            for (o, (&va, &vb)) in pairs.zip(vals) {
                o[0] += va;
                o[1] += vb;
            }
        }
        for ox in (la..ha).filter(|&ox| ox < lo || ox >= hi) {
            dst[at(a, ox)] += col[ra + ox];
        }
        for ox in (lb..hb).filter(|&ox| ox < lo || ox >= hi) {
            dst[at(b, ox)] += col[rb + ox];
        }
    }
}

/// Adds the column matrix back into image `img`, group `gi` of `dx` (the inverse of
/// [`im2col`]).
pub(crate) fn col2im(g: &Geometry, d: &Dims, col: &[f32], img: usize, gi: usize, dx: &mut [f32]) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    let cg = d.c / d.group;
    match g.order {
        Order::Nchw => {
            let plane = d.h * d.w;
            let base = (img * d.c + gi * cg) * plane;
            let so = d.oh * d.ow;
            for c in 0..cg {
                let xc = &mut dx[base + c * plane..base + (c + 1) * plane];
                for ki in 0..d.kh {
                    let tap = |kj: usize| Tap {
                        row: ((c * d.kh + ki) * d.kw + kj) * so,
                        off: (kj * dw) as isize - pl,
                    };
                    let mut kj = 0;
                    while kj < d.kw {
                        if sw == 2 && dw == 1 && kj + 1 < d.kw {
                            add_tap_pair(g, d, col, ki, (tap(kj), tap(kj + 1)), xc);
                            kj += 2;
                        } else {
                            add_tap(g, d, col, ki, tap(kj), xc);
                            kj += 1;
                        }
                    }
                }
            }
        }
        Order::Nhwc => {
            let kd = cg * d.kh * d.kw;
            let runs = d.group == 1 && dw == 1;
            for oy in 0..d.oh {
                for ox in 0..d.ow {
                    let p = oy * d.ow + ox;
                    let off = (ox * sw) as isize - pl;
                    let (lo, hi) = valid_range(d.kw, dw, off, d.w);
                    if lo == hi {
                        continue;
                    }
                    let first = (lo as isize * dw as isize + off) as usize;
                    for ki in 0..d.kh {
                        let iy = (oy * sh + ki * dh) as isize - pt;
                        if iy < 0 || iy >= d.h as isize {
                            continue;
                        }
                        let src = &col[p * kd + ki * d.kw * cg..p * kd + (ki + 1) * d.kw * cg];
                        let row = (img * d.h + iy as usize) * d.w;
                        if runs {
                            let at = (row + first) * d.c;
                            for (o, v) in dx[at..at + (hi - lo) * d.c]
                                .iter_mut()
                                .zip(&src[lo * cg..hi * cg])
                            {
                                *o += v;
                            }
                        } else {
                            for kj in lo..hi {
                                let at = (row + first + (kj - lo) * dw) * d.c + gi * cg;
                                for (o, v) in
                                    dx[at..at + cg].iter_mut().zip(&src[kj * cg..(kj + 1) * cg])
                                {
                                    *o += v;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_valid_range_is_exactly_the_positions_inside() {
        for out in 0..7 {
            for stride in 1..4 {
                for offset in -5isize..5 {
                    for len in 0..7 {
                        let (lo, hi) = valid_range(out, stride, offset, len);
                        assert!(lo <= hi && hi <= out);
                        for o in 0..out {
                            let i = o as isize * stride as isize + offset;
                            let inside = i >= 0 && i < len as isize;
                            assert_eq!(
                                inside,
                                (lo..hi).contains(&o),
                                "{out} {stride} {offset} {len} {o}"
                            );
                        }
                    }
                }
            }
        }
    }

    fn geometry(order: Order, stride: [usize; 2], pad: [usize; 4], dil: [usize; 2]) -> Geometry {
        Geometry {
            kernel: [0, 0],
            stride,
            pad,
            dilation: dil,
            order,
            global: false,
        }
    }

    /// The element of the column matrix at (tap row, output pixel) by the definition.
    fn naive_col(g: &Geometry, d: &Dims, x: &[f32], img: usize, gi: usize) -> Vec<f32> {
        let cg = d.c / d.group;
        let so = d.oh * d.ow;
        let kd = cg * d.kh * d.kw;
        let mut col = vec![0.0; kd * so];
        for c in 0..cg {
            for ki in 0..d.kh {
                for kj in 0..d.kw {
                    for oy in 0..d.oh {
                        for ox in 0..d.ow {
                            let iy = (oy * g.stride[0] + ki * g.dilation[0]) as isize
                                - g.pad[0] as isize;
                            let ix = (ox * g.stride[1] + kj * g.dilation[1]) as isize
                                - g.pad[1] as isize;
                            let v = if iy < 0 || ix < 0 || iy >= d.h as isize || ix >= d.w as isize
                            {
                                0.0
                            } else {
                                let (iy, ix) = (iy as usize, ix as usize);
                                match g.order {
                                    Order::Nchw => {
                                        x[((img * d.c + gi * cg + c) * d.h + iy) * d.w + ix]
                                    }
                                    Order::Nhwc => {
                                        x[((img * d.h + iy) * d.w + ix) * d.c + gi * cg + c]
                                    }
                                }
                            };
                            let p = oy * d.ow + ox;
                            match g.order {
                                Order::Nchw => col[((c * d.kh + ki) * d.kw + kj) * so + p] = v,
                                Order::Nhwc => col[p * kd + (ki * d.kw + kj) * cg + c] = v,
                            }
                        }
                    }
                }
            }
        }
        col
    }

    #[test]
    fn paired_taps_give_the_bits_of_one_tap_at_a_time() {
        // Stride 2 across, no dilation: kernels of 2 to 5 columns (an odd last tap), pads
        // that put taps' columns past either edge, rows of odd and even widths.
        for (kh, kw) in [(3, 3), (4, 4), (2, 5), (1, 2)] {
            for pad in [[0, 0, 0, 0], [1, 1, 1, 1], [2, 3, 1, 2], [0, 4, 0, 4]] {
                for (h, w) in [(7, 9), (8, 8), (5, 12)] {
                    let g = geometry(Order::Nchw, [2, 2], pad, [1, 1]);
                    let Ok((oh, ow)) = g.out_size(h, w, kh, kw) else {
                        continue;
                    };
                    let (n, c) = (2, 3);
                    let d = Dims {
                        n,
                        c,
                        h,
                        w,
                        m: 2,
                        kh,
                        kw,
                        oh,
                        ow,
                        group: 1,
                    };
                    // Magnitudes that make the order of additions show in the bits.
                    let col: Vec<f32> = (0..c * kh * kw * oh * ow)
                        .map(|i| (i as f32 * 0.77).sin() * 10f32.powi((i % 7) as i32 - 3))
                        .collect();
                    let start: Vec<f32> = (0..n * c * h * w).map(|i| (i as f32).cos()).collect();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    for img in 0..n {
                        let mut paired = start.clone();
                        col2im(&g, &d, &col, img, 0, &mut paired);
                        // The definition: every tap on its own, in order.
                        let mut single = start.clone();
                        let plane = h * w;
                        for ch in 0..c {
                            let at = (img * c + ch) * plane;
                            for ki in 0..kh {
                                for kj in 0..kw {
                                    let t = Tap {
                                        row: ((ch * kh + ki) * kw + kj) * oh * ow,
                                        off: kj as isize - pad[1] as isize,
                                    };
                                    add_tap(&g, &d, &col, ki, t, &mut single[at..at + plane]);
                                }
                            }
                        }
                        let what = format!("k {kh}x{kw} pad {pad:?} {h}x{w}");
                        assert_eq!(bits(&paired), bits(&single), "{what}");
                        assert_ne!(bits(&single), bits(&start), "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn im2col_and_col2im_match_the_definition_on_odd_geometries() {
        for order in [Order::Nchw, Order::Nhwc] {
            for (stride, pad, dil) in [
                ([1, 1], [0, 0, 0, 0], [1, 1]),
                ([1, 1], [1, 2, 1, 0], [1, 1]),
                ([2, 3], [1, 1, 2, 2], [1, 1]),
                ([2, 1], [2, 0, 0, 3], [2, 2]),
            ] {
                let g = geometry(order, stride, pad, dil);
                let (n, c, h, w, m, kh, kw, group) = (2, 4, 5, 7, 2, 3, 2, 2);
                let (oh, ow) = g.out_size(h, w, kh, kw).unwrap();
                let d = Dims {
                    n,
                    c,
                    h,
                    w,
                    m,
                    kh,
                    kw,
                    oh,
                    ow,
                    group,
                };
                let x: Vec<f32> = (0..n * c * h * w)
                    .map(|i| (i as f32 * 0.37).sin())
                    .collect();
                for img in 0..n {
                    for gi in 0..group {
                        let want = naive_col(&g, &d, &x, img, gi);
                        let mut col = vec![f32::NAN; want.len()];
                        im2col(&g, &d, &x, img, gi, &mut col);
                        assert_eq!(col, want, "{order:?} {stride:?} {pad:?} {dil:?}");
                        // col2im is the adjoint: <im2col(x), col> == <x, col2im(col)>.
                        let r: Vec<f32> = (0..col.len()).map(|i| (i as f32 * 0.11).cos()).collect();
                        let mut back = vec![0.0; x.len()];
                        col2im(&g, &d, &r, img, gi, &mut back);
                        let lhs: f64 = want
                            .iter()
                            .zip(&r)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        let rhs: f64 = x
                            .iter()
                            .zip(&back)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        assert!((lhs - rhs).abs() < 1e-3, "{lhs} vs {rhs}");
                    }
                }
            }
        }
    }
}
