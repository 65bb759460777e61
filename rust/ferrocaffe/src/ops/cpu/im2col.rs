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
                    for kj in 0..d.kw {
                        let row = ((c * d.kh + ki) * d.kw + kj) * so;
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
                            let src = &col[row + oy * d.ow + lo..row + oy * d.ow + hi];
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
