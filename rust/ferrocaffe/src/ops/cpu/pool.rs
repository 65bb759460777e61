//! 2-d pooling: MaxPool, AveragePool (padding not counted unless `count_include_pad`),
//! `global_pooling`, NCHW or NHWC, and their gradients (inputs X, Y, dY).
//!
//! The windows along each axis are computed once per call (`axis_windows`). The forward
//! kernels are in `pool_fwd` (vectorized per SIMD level); the gradients run here,
//! NCHW one (image, channel) plane at a time, NHWC one output pixel at a time with the
//! channels innermost. Parts of the output run in parallel (forward: planes or output rows;
//! gradients: planes or images).

use super::conv_args::{Geometry, Order};
use super::conv_nd::{Dispatch, NdGeometry, PoolKind, PoolNd};
use super::par::for_each_chunk;
use super::pool_fwd;
#[cfg(target_arch = "x86_64")]
use super::pool_planes;
use crate::bail;
use crate::blas::for_each_part;
use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    for (name, max, grad) in [
        ("MaxPool", true, false),
        ("MaxPool2D", true, false),
        ("AveragePool", false, false),
        ("AveragePool2D", false, false),
        ("MaxPoolGradient", true, true),
        ("MaxPool2DGradient", true, true),
        ("AveragePoolGradient", false, true),
        ("AveragePool2DGradient", false, true),
        ("MaxPool1D", true, false),
        ("MaxPool3D", true, false),
        ("AveragePool1D", false, false),
        ("AveragePool3D", false, false),
        ("MaxPool1DGradient", true, true),
        ("MaxPool3DGradient", true, true),
        ("AveragePool1DGradient", false, true),
        ("AveragePool3DGradient", false, true),
    ] {
        let f: crate::ops::registry::Factory = match (max, grad) {
            (true, false) => |i| create(i, true, false),
            (true, true) => |i| create(i, true, true),
            (false, false) => |i| create(i, false, false),
            (false, true) => |i| create(i, false, true),
        };
        r.cpu(name, f);
    }
    r.cpu("LpPool", |i| create_lp(i, false));
    r.cpu("LpPoolGradient", |i| create_lp(i, true));
}

struct Pool {
    g: Geometry,
    max: bool,
    gradient: bool,
    include_pad: bool,
}

/// Geometry of one run: (n, c, h, w, kh, kw, oh, ow).
type Shape = (usize, usize, usize, usize, usize, usize, usize, usize);

/// The window of one output position along one axis: input indices `start..end` (clipped to
/// the input) and `span`, its extent clipped to the padded input only (for
/// `count_include_pad`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Win {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) span: i64,
}

/// The windows of the `out` output positions of an axis of `inp` values, kernel `k`, stride
/// `s`, padding `p0` before and `p1` after: output `o` covers `o * s - p0 .. o * s - p0 + k`,
/// clipped to `-p0 .. inp + p1` for the span and to `0 .. inp` for the indices.
pub(crate) fn axis_windows(
    out: usize,
    inp: usize,
    k: usize,
    s: usize,
    p0: usize,
    p1: usize,
) -> Vec<Win> {
    let big = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
    let (inp_i, k, s, p0, p1) = (big(inp), big(k), big(s), big(p0), big(p1));
    (0..out)
        .map(|o| {
            let lo = big(o).saturating_mul(s).saturating_sub(p0);
            let hi = lo.saturating_add(k).min(inp_i.saturating_add(p1));
            let clip = |v: i64| usize::try_from(v.clamp(0, inp_i)).unwrap_or(inp);
            let start = clip(lo);
            Win {
                start,
                end: clip(hi).max(start),
                span: hi.saturating_sub(lo),
            }
        })
        .collect()
}

impl Pool {
    fn shape(&self, dims: &[usize]) -> Result<Shape> {
        let (n, c, h, w) = self.g.nchw(dims)?;
        let (kh, kw) = if self.g.global {
            (h, w)
        } else {
            (self.g.kernel[0], self.g.kernel[1])
        };
        if kh == 0 || kw == 0 {
            bail!(BadArgument: "pooling needs a kernel size (or global_pooling)");
        }
        let (oh, ow) = if self.g.global {
            (1, 1)
        } else {
            self.g.out_size(h, w, kh, kw)?
        };
        Ok((n, c, h, w, kh, kw, oh, ow))
    }

    /// The row and column windows (no allocation beyond the output's extent: call only with
    /// a non-empty output or input).
    fn windows(&self, s: Shape) -> (Vec<Win>, Vec<Win>) {
        let (_, _, h, w, kh, kw, oh, ow) = s;
        if self.g.global {
            let all = |v: usize| Win {
                start: 0,
                end: v,
                span: i64::try_from(v).unwrap_or(i64::MAX),
            };
            return (vec![all(h)], vec![all(w)]);
        }
        let (st, p) = (self.g.stride, self.g.pad);
        (
            axis_windows(oh, h, kh, st[0], p[0], p[2]),
            axis_windows(ow, w, kw, st[1], p[1], p[3]),
        )
    }

    /// The forward kernels' view of a run.
    fn fwd_geo<'a>(&self, s: Shape, rows: &'a [Win], cols: &'a [Win]) -> pool_fwd::Geo<'a> {
        let (_, _, h, w, _, _, oh, ow) = s;
        pool_fwd::Geo {
            max: self.max,
            include_pad: self.include_pad,
            h,
            w,
            oh,
            ow,
            rows,
            cols,
        }
    }

    /// The divisor of an average over the window `(r, c)`.
    #[inline]
    fn divisor(&self, r: &Win, c: &Win) -> f32 {
        pool_fwd::divisor(self.include_pad, r, c)
    }
}

/// Gradient over NCHW planes: `dx` holds whole input planes starting at plane `first`. Max
/// pooling sends each output's gradient to the first (row-major) window element equal to the
/// output; average pooling spreads it evenly over the window.
#[allow(clippy::too_many_arguments)]
fn backward_nchw(
    p: &Pool,
    s: Shape,
    rows: &[Win],
    cols: &[Win],
    (x, y, g): (&[f32], &[f32], &[f32]),
    first: usize,
    dx: &mut [f32],
) {
    let (_, _, h, w, _, _, oh, ow) = s;
    dx.fill(0.0);
    for (k, dp) in dx.chunks_mut(h * w).enumerate() {
        let plane = first + k;
        let xp = &x[plane * h * w..(plane + 1) * h * w];
        let yp = &y[plane * oh * ow..(plane + 1) * oh * ow];
        let gp = &g[plane * oh * ow..(plane + 1) * oh * ow];
        for (oy, r) in rows.iter().enumerate() {
            let (yrow, grow) = (&yp[oy * ow..(oy + 1) * ow], &gp[oy * ow..(oy + 1) * ow]);
            for ((c, &yv), &gv) in cols.iter().zip(yrow).zip(grow) {
                if p.max {
                    'win: for iy in r.start..r.end {
                        for ix in c.start..c.end {
                            if xp[iy * w + ix] == yv {
                                dp[iy * w + ix] += gv;
                                break 'win;
                            }
                        }
                    }
                } else {
                    let v = gv / p.divisor(r, c);
                    for drow in dp[r.start * w..r.end * w].chunks_exact_mut(w) {
                        for d in &mut drow[c.start..c.end] {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// Gradient over NHWC images: `dx` holds whole images starting at image `first`; `pending` is
/// scratch of `c` flags (max pooling: set while a channel's gradient is still to be placed).
#[allow(clippy::too_many_arguments)]
fn backward_nhwc(
    p: &Pool,
    s: Shape,
    rows: &[Win],
    cols: &[Win],
    (x, y, g): (&[f32], &[f32], &[f32]),
    first: usize,
    dx: &mut [f32],
    pending: &mut [bool],
) {
    let (_, c, h, w, _, _, oh, ow) = s;
    dx.fill(0.0);
    let (isz, osz) = (h * w * c, oh * ow * c);
    for (k, di) in dx.chunks_mut(isz).enumerate() {
        let img = first + k;
        let xi = &x[img * isz..(img + 1) * isz];
        for (oy, r) in rows.iter().enumerate() {
            for (ox, col) in cols.iter().enumerate() {
                let o = img * osz + (oy * ow + ox) * c;
                let (yv, gv) = (&y[o..o + c], &g[o..o + c]);
                if p.max {
                    pending.fill(true);
                    for iy in r.start..r.end {
                        for ix in col.start..col.end {
                            let at = (iy * w + ix) * c;
                            let (xs, ds) = (&xi[at..at + c], &mut di[at..at + c]);
                            let it = ds
                                .iter_mut()
                                .zip(xs)
                                .zip(yv)
                                .zip(gv)
                                .zip(pending.iter_mut());
                            for ((((d, &xv), &ym), &gm), left) in it {
                                let hit = *left && xv == ym;
                                *d += if hit { gm } else { 0.0 };
                                *left &= !hit;
                            }
                        }
                    }
                } else {
                    let div = p.divisor(r, col);
                    for iy in r.start..r.end {
                        let at = (iy * w + col.start) * c;
                        let end = (iy * w + col.end) * c;
                        for ds in di[at..end].chunks_exact_mut(c) {
                            for (d, &gm) in ds.iter_mut().zip(gv) {
                                *d += gm / div;
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Operator for Pool {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let s = self.shape(x.dims())?;
        let (n, c, h, w, kh, kw, oh, ow) = s;
        let xs = x.as_slice::<f32>()?;
        let y_dims = self.g.dims(n, c, oh, ow);
        let nhwc = self.g.order == Order::Nhwc;
        // Work per output value: the window, clipped to the input.
        let win = kh.min(h).max(1).saturating_mul(kw.min(w).max(1));
        if !self.gradient {
            let y = outs.tensor(0)?.try_ensure::<f32>(&y_dims)?;
            if y.is_empty() {
                return Ok(());
            }
            let (rows, cols) = self.windows(s);
            let g = self.fwd_geo(s, &rows, &cols);
            if nhwc {
                let unit = ow * c;
                for_each_chunk(y, unit, unit.saturating_mul(win), &|first, part| {
                    pool_fwd::nhwc_rows(&g, c, xs, first, part)
                });
            } else {
                let unit = oh * ow;
                let planes = n * c;
                let per = super::par::planes_per_part(
                    planes,
                    planes.saturating_mul(unit.saturating_mul(win)),
                );
                let parts: Vec<(usize, &mut [f32])> = y
                    .chunks_mut(per * unit)
                    .enumerate()
                    .map(|(i, part)| (i * per, part))
                    .collect();
                for_each_part(parts, &|(first, part)| {
                    if !on_planes(&g, xs, first, part) {
                        pool_fwd::nchw_through_nhwc(&g, c, xs, first, part);
                    }
                });
            }
            return Ok(());
        }
        let y = ins.tensor(1)?.as_slice::<f32>()?;
        let dy = ins.tensor(2)?;
        if dy.dims() != y_dims.as_slice() || y.len() != dy.numel() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let g = dy.as_slice::<f32>()?;
        let dims = x.dims().to_vec();
        let dx = outs.tensor(0)?.ensure::<f32>(&dims);
        if dx.is_empty() || y.is_empty() {
            dx.fill(0.0);
            return Ok(());
        }
        let (rows, cols) = self.windows(s);
        let work = (oh * ow).saturating_mul(win).saturating_add(h * w);
        if nhwc {
            let unit = h * w * c;
            for_each_chunk(dx, unit, work.saturating_mul(c), &|first, part| {
                // `c` flags: the gradient of a channel is still to be placed (c <= X's size).
                let mut pending = vec![false; c];
                backward_nhwc(self, s, &rows, &cols, (xs, y, g), first, part, &mut pending)
            });
        } else {
            for_each_chunk(dx, h * w, work, &|first, part| {
                backward_nchw(self, s, &rows, &cols, (xs, y, g), first, part)
            });
        }
        Ok(())
    }
}

/// Pools NCHW planes `first..` into `y` on the plane kernel ([`pool_planes`]: x86-64 with
/// AVX-512F, the geometries it takes); false, with nothing written, where it does not run.
#[cfg(target_arch = "x86_64")]
fn on_planes(g: &pool_fwd::Geo<'_>, x: &[f32], first: usize, y: &mut [f32]) -> bool {
    pool_planes::run(g, x, first, y)
}

#[cfg(not(target_arch = "x86_64"))]
fn on_planes(_: &pool_fwd::Geo<'_>, _: &[f32], _: usize, _: &mut [f32]) -> bool {
    false
}

/// A 4-d input with a 2-d geometry runs on [`Pool`], any other on [`PoolNd`].
fn create(init: &OpInit<'_>, max: bool, gradient: bool) -> Result<Box<dyn Operator>> {
    let nd = NdGeometry::new(init)?;
    if nd.dilated() {
        bail!(op = init, NotImplemented: "Pooling op does not support dilation right now.");
    }
    let include_pad = init.args.bool("count_include_pad", false)?;
    let two_d: Option<Box<dyn Operator>> = if nd.fits_2d() {
        Some(Box::new(Pool {
            g: Geometry::new(init)?,
            max,
            gradient,
            include_pad,
        }))
    } else {
        None
    };
    let kind = if max {
        PoolKind::Max
    } else {
        PoolKind::Average
    };
    Ok(Box::new(Dispatch {
        two_d,
        nd: Box::new(PoolNd {
            g: nd,
            kind,
            gradient,
            include_pad,
        }),
    }))
}

/// `LpPool`: `(sum |x|^p)^(1/p)` over each window (argument `p`, 2 by default), any rank.
fn create_lp(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let g = NdGeometry::new(init)?;
    if g.dilated() {
        bail!(op = init, NotImplemented: "Pooling op does not support dilation right now.");
    }
    let p = init.args.float("p", 2.0)?;
    Ok(Box::new(PoolNd {
        g,
        kind: PoolKind::Lp(p),
        gradient,
        include_pad: false,
    }))
}
