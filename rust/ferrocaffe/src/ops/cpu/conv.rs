//! 2-d convolution (Conv, with groups, strides, padding, dilation, NCHW or NHWC) and its
//! gradient (ConvGradient), by im2col + GEMM.
//!
//! W is `[M, C/G, kH, kW]` (NCHW) or `[M, kH, kW, C/G]` (NHWC); the optional bias has M values.

use super::conv_args::{self, Geometry, Order};
use super::conv_direct;
use super::conv_nd::{ConvNd, Dispatch, NdGeometry};
use super::depthwise;
pub(crate) use super::im2col::{col2im, im2col, im2col_nhwc_rows};
use super::math::relu_in_place;
use super::winograd::{self, Mode};
use crate::bail;
use crate::blas::{for_each_part, part_len, transpose_f32, GemmContext};
use crate::error::{try_vec, Error, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Conv", |i| create(i, false));
    r.cpu("Conv2D", |i| create(i, false));
    r.cpu("ConvGradient", |i| create(i, true));
    r.cpu("Conv2DGradient", |i| create(i, true));
    r.cpu("Conv1D", |i| create(i, false));
    r.cpu("Conv1DGradient", |i| create(i, true));
    r.cpu("Conv3D", |i| create(i, false));
    r.cpu("Conv3DGradient", |i| create(i, true));
}

/// Sizes of one convolution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) m: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) group: usize,
}

impl Dims {
    fn cg(&self) -> usize {
        self.c / self.group
    }
    fn mg(&self) -> usize {
        self.m / self.group
    }
    /// Rows of the column matrix (per group).
    fn kdim(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// Output pixels per image (saturating: exact whenever an output is not empty, which
    /// is when it is used).
    fn spatial_out(&self) -> usize {
        self.oh.saturating_mul(self.ow)
    }
    /// Elements of the per-image column matrix, checked (the output size is the user's).
    fn col_len(&self) -> Result<usize> {
        self.kdim()
            .checked_mul(self.spatial_out())
            .ok_or_else(|| too_large("the column buffer", self))
    }
}

fn too_large(what: &str, d: &Dims) -> Error {
    Error::OutOfMemory(format!(
        "{what} of a convolution with output {}x{} and kernel {}x{} is too large to allocate",
        d.oh, d.ow, d.kh, d.kw
    ))
}

/// How a forward convolution runs: whether the input is its own column matrix, and the
/// buffers each part of the images needs.
struct Plan {
    /// 1x1 filters, stride 1, no padding (and, in NHWC, one group): no im2col.
    direct: bool,
    /// NHWC with one input channel (a first layer on grey images): the input is laid out as
    /// in NCHW, so the product runs NCHW-wise, `W [M, kd] x col [kd, oh*ow]` with the few
    /// filters as the short side (the small-dimension kernels), then one transpose into Y,
    /// instead of a tall `[oh*ow, kd] x [kd, M]` product with two short sides.
    single_channel: Option<Geometry>,
    col_len: usize,
    tmp_len: usize,
}

/// Column buffers of all parts together stay below this many floats (256 MiB) when images are
/// shared out; beyond it, fewer parts.
const PARALLEL_BUFFER_FLOATS: usize = 1 << 26;

/// Convolutions of fewer multiply-adds than this per image are not worth a hand-off per image.
const MIN_PARALLEL_MACS: usize = 1 << 15;

impl Plan {
    fn new(g: &Geometry, d: &Dims) -> Result<Plan> {
        let one_by_one = d.kh == 1
            && d.kw == 1
            && g.stride == [1, 1]
            && g.pad == [0, 0, 0, 0]
            && (g.order == Order::Nchw || d.group == 1);
        let col_len = if one_by_one { 0 } else { d.col_len()? };
        let single_channel = (g.order == Order::Nhwc && d.c == 1 && d.group == 1 && !one_by_one)
            .then(|| Geometry {
                order: Order::Nchw,
                ..g.clone()
            });
        let tmp_len = if g.order == Order::Nhwc && (d.group > 1 || single_channel.is_some()) {
            // so * mg <= so * m = one image of Y, which is allocated already.
            d.spatial_out() * d.mg()
        } else {
            0
        };
        Ok(Plan {
            direct: one_by_one,
            single_channel,
            col_len,
            tmp_len,
        })
    }

    /// Images per part: 1 to n.
    fn images_per_part(&self, d: &Dims) -> usize {
        let threads = crate::threads::num_threads();
        let macs = d.spatial_out().saturating_mul(d.m).saturating_mul(d.kdim());
        if d.n < 2 || threads < 2 || macs < MIN_PARALLEL_MACS {
            return d.n.max(1);
        }
        let per_buffer = (self.col_len + self.tmp_len).max(1);
        let parts =
            d.n.min(threads.saturating_mul(2))
                .min((PARALLEL_BUFFER_FLOATS / per_buffer).max(1));
        d.n.div_ceil(parts.max(1))
    }

    /// Output rows per part when an NHWC convolution (one group, more than one input
    /// channel) has fewer images than threads: each image is then cut into slices of whole
    /// output rows, one part each, so that 8 images keep 16 threads busy (a part per image
    /// left half of them idle, and one image ran its column matrix on one thread). `None`
    /// when images are parts enough, or the work too small to cut.
    fn rows_per_slice(&self, g: &Geometry, d: &Dims) -> Option<usize> {
        let threads = crate::threads::num_threads();
        if g.order != Order::Nhwc
            || d.group != 1
            || self.single_channel.is_some()
            || threads < 2
            || d.n >= threads
            || d.oh < 2
        {
            return None;
        }
        let image = d.spatial_out().saturating_mul(d.m).saturating_mul(d.kdim());
        // One slice per thread, none under MIN_PARALLEL_MACS.
        let slices = threads
            .div_ceil(d.n.max(1))
            .min(image / MIN_PARALLEL_MACS)
            .min(d.oh);
        (slices >= 2).then(|| d.oh.div_ceil(slices))
    }

    fn buffers(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        Ok((
            try_vec(self.col_len, 0f32, "the column buffer")?,
            try_vec(self.tmp_len, 0f32, "the group buffer")?,
        ))
    }
}

/// Each `rows x cols` matrix of `src` (an image, or a filter) transposed into `dst`, shared
/// out to the team.
fn transpose_images(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    let len = rows * cols;
    if len == 0 {
        return;
    }
    let n = src.len() / len;
    let per = part_len(n, src.len()) * len;
    let parts: Vec<(&[f32], &mut [f32])> = src.chunks(per).zip(dst.chunks_mut(per)).collect();
    for_each_part(parts, &|(s, d)| {
        for (a, b) in s.chunks_exact(len).zip(d.chunks_exact_mut(len)) {
            transpose_f32(a, rows, cols, b);
        }
    });
}

struct Conv {
    g: Geometry,
    group: usize,
    gradient: bool,
    no_bias: bool,
    /// Apply a following in-place Relu (see [`Operator::fuse_relu`]).
    relu: bool,
    /// Whether 3x3 filters run on the Winograd path (`FERROCAFFE_WINOGRAD` at creation).
    winograd: Mode,
    /// Which convolutions run on the few-channel direct kernel (`FERROCAFFE_DIRECT_CONV` at
    /// creation).
    direct: conv_direct::Mode,
    /// Whether an NHWC batch of fewer images than threads is cut into slices of output rows
    /// ([`Plan::rows_per_slice`]); off with `FERROCAFFE_CONV_SLICES=0` at creation, to
    /// compare.
    slices: bool,
    /// The Winograd transform of the filters, kept between runs while they are unchanged.
    filters: winograd::FilterCache,
}

impl Conv {
    fn dims(&self, xd: &[usize], wd: &[usize]) -> Result<Dims> {
        let (n, c, h, w) = self.g.nchw(xd)?;
        if wd.len() != 4 {
            bail!(ShapeMismatch: "filter must be 4-d, got {wd:?}");
        }
        let (m, wc, kh, kw) = match self.g.order {
            Order::Nchw => (wd[0], wd[1], wd[2], wd[3]),
            Order::Nhwc => (wd[0], wd[3], wd[1], wd[2]),
        };
        if c != wc * self.group {
            bail!(
                ShapeMismatch: "Convolution op: input channels does not match: # of input \
                 channels {c} is not equal to kernel channels * group: {wc}*{}",
                self.group
            );
        }
        if m % self.group != 0 {
            bail!(
                ShapeMismatch: "The number of output channels {m} is not divisible by group {}",
                self.group
            );
        }
        for (i, (&k, &gk)) in [kh, kw].iter().zip(&self.g.kernel).enumerate() {
            if gk != 0 && gk != k {
                bail!(ShapeMismatch: "kernel argument {gk} disagrees with filter dim {i}: {k}");
            }
        }
        let (oh, ow) = self.g.out_size(h, w, kh, kw)?;
        Ok(Dims {
            n,
            c,
            h,
            w,
            m,
            kh,
            kw,
            oh,
            ow,
            group: self.group,
        })
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let d = self.dims(x.dims(), w.dims())?;
        let bias = conv_args::bias(&ins, d.m)?;
        let (xs, ws) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let y_dims = self.g.dims(d.n, d.m, d.oh, d.ow);
        let y = outs.tensor(0)?.try_ensure::<f32>(&y_dims)?;
        if y.is_empty() {
            // No image, no output channel or no output pixel: an empty Y of the right shape.
            return Ok(());
        }
        // Not the convolutions that run through NHWC (unless `FERROCAFFE_DIRECT_CONV=2`):
        // there the direct kernel measured 0.6-1.3x (squeezenet's and googlenet's 7x7 and 3x3
        // layers, style transfer's strided ones), and the NHWC order of sums kept the corpus's
        // style-transfer model (whose output sits at 0.7 of the tolerance) within Caffe2's
        // recorded output, where the direct kernel's order took one value of 24576 past it.
        if (!self.runs_through_nhwc(&d)
            || self.direct == conv_direct::Mode::Force
            || conv_direct::wide_nchw(&self.g, &d))
            && conv_direct::applies(self.direct, &self.g, &d)
        {
            return conv_direct::forward(&self.g, &d, xs, ws, bias, self.relu, y);
        }
        if d.group == d.c && d.m == d.c {
            depthwise::forward(&self.g, &d, xs, ws, bias, y)?;
            if self.relu {
                relu_in_place(y);
            }
            return Ok(());
        }
        if let Some(tile) = self.winograd.choose(&self.g, &d) {
            let p = winograd::Problem {
                order: self.g.order,
                pad: [self.g.pad[0], self.g.pad[1]],
                d,
                gemm,
                x: xs,
                w: ws,
                bias,
                relu: self.relu,
                keep: Some((w, &self.filters)),
            };
            return winograd::forward(tile, &p, y);
        }
        if self.runs_through_nhwc(&d) {
            return self.forward_through_nhwc(gemm, &d, xs, ws, bias, y);
        }
        self.forward_im2col(&self.g, gemm, &d, xs, ws, bias, y)
    }

    /// Whether an NCHW convolution runs as NHWC (X, W and Y transposed around it): with 8 or
    /// more input and output channels, one group, a kernel larger than 1x1, and rows shorter
    /// than 16 outputs (32 when strided). There the NCHW column matrix is built from runs of a few
    /// values (a 7-wide row), the NHWC one from runs of `C` or more; on 2 cores this measured
    /// 1.4-2.4x faster on the corpus's shapes of that kind (`x 8x16x3x3, W 32x16x3x3`:
    /// 44 -> 18 us), and slower with 1 or 3 input channels or 3 output channels.
    fn runs_through_nhwc(&self, d: &Dims) -> bool {
        self.g.order == Order::Nchw
            && d.group == 1
            && d.c >= 8
            && d.m >= 8
            && d.kh * d.kw > 1
            && (d.ow < 16 || (self.g.stride[1] > 1 && d.ow < 32))
    }

    /// The NCHW forward pass on the NHWC kernels: X and W transposed in, Y transposed out.
    fn forward_through_nhwc(
        &self,
        gemm: GemmContext,
        d: &Dims,
        xs: &[f32],
        ws: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        let (hw, kk, so) = (d.h * d.w, d.kh * d.kw, d.spatial_out());
        // Each a copy of an input or of the output, which exist already.
        let mut xt = try_vec(xs.len(), 0f32, "the NHWC copy of X")?;
        transpose_images(xs, d.c, hw, &mut xt);
        let mut wt = try_vec(ws.len(), 0f32, "the NHWC copy of W")?;
        transpose_images(ws, d.c, kk, &mut wt);
        let mut yt = try_vec(y.len(), 0f32, "the NHWC output")?;
        let nhwc = Geometry {
            order: Order::Nhwc,
            ..self.g.clone()
        };
        self.forward_im2col(&nhwc, gemm, d, &xt, &wt, bias, &mut yt)?;
        transpose_images(&yt, so, d.m, y);
        Ok(())
    }

    /// The forward pass as im2col + GEMM per image (or a plain GEMM for 1x1 filters), in the
    /// layout `g` says (this op's, or NHWC for [`Conv::forward_through_nhwc`]).
    #[allow(clippy::too_many_arguments)]
    fn forward_im2col(
        &self,
        g: &Geometry,
        gemm: GemmContext,
        d: &Dims,
        xs: &[f32],
        ws: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        let d = *d;
        let plan = Plan::new(g, &d)?;
        if let Some(rows) = plan.rows_per_slice(g, &d).filter(|_| self.slices) {
            return self.forward_nhwc_slices(g, gemm, &d, &plan, rows, (xs, ws, bias), y);
        }
        // Images are shared out to the team of compute threads, a few consecutive images per
        // part, each part with its own buffers; the products inside a part then run on its
        // thread alone. One image (or too little work) runs here, and its products use the
        // team instead.
        let per = plan.images_per_part(&d);
        let img_out = d.m * d.spatial_out();
        let mut parts = Vec::with_capacity(d.n.div_ceil(per));
        for (i, yp) in y.chunks_mut(per * img_out).enumerate() {
            parts.push((i * per, yp, plan.buffers()?));
        }
        parts_until_error(parts, &|(first, yp, (mut col, mut tmp))| {
            for (k, yi) in yp.chunks_mut(img_out).enumerate() {
                self.image(
                    g,
                    &d,
                    &plan,
                    gemm,
                    xs,
                    ws,
                    bias,
                    first + k,
                    yi,
                    &mut col,
                    &mut tmp,
                )?;
            }
            Ok(())
        })
    }

    /// [`Conv::forward_im2col`] for NHWC with one group, in parts of `rows` output rows of
    /// one image ([`Plan::rows_per_slice`]): each part lays out the column matrix of its rows
    /// and multiplies it by the filters. A pixel's values are those of the whole-image run's.
    #[allow(clippy::too_many_arguments)]
    fn forward_nhwc_slices(
        &self,
        g: &Geometry,
        gemm: GemmContext,
        d: &Dims,
        plan: &Plan,
        rows: usize,
        (xs, ws, bias): (&[f32], &[f32], Option<&[f32]>),
        y: &mut [f32],
    ) -> Result<()> {
        let (so, kd, m) = (d.spatial_out(), d.kdim(), d.m);
        let slice = rows * d.ow * m;
        // (image, first output row, Y of those rows): an image's Y is `so * m` values.
        let mut parts = Vec::with_capacity(d.n * d.oh.div_ceil(rows));
        for (img, yi) in y.chunks_mut(so * m).enumerate() {
            for (k, ys) in yi.chunks_mut(slice).enumerate() {
                parts.push((img, k * rows, ys));
            }
        }
        parts_until_error(parts, &|(img, oy0, ys)| {
            let pixels = ys.len() / m;
            let p0 = img * so + oy0 * d.ow;
            let col;
            let cols: &[f32] = if plan.direct {
                // 1x1, stride 1, no padding: the pixels' rows of X are their column matrix.
                &xs[p0 * kd..(p0 + pixels) * kd]
            } else {
                let mut v = try_vec(pixels * kd, 0f32, "the column buffer")?;
                im2col_nhwc_rows(g, d, xs, img, 0, oy0..oy0 + pixels / d.ow, &mut v);
                col = v;
                &col
            };
            gemm.sgemm(false, true, pixels, m, kd, 1.0, cols, ws, 0.0, ys);
            self.finish(Order::Nhwc, so, bias, ys);
            Ok(())
        })
    }

    /// Y of one image: per group, the column matrix (unless the input is one already) times
    /// the group's filters, then the bias.
    #[allow(clippy::too_many_arguments)]
    fn image(
        &self,
        g: &Geometry,
        d: &Dims,
        plan: &Plan,
        gemm: GemmContext,
        xs: &[f32],
        ws: &[f32],
        bias: Option<&[f32]>,
        img: usize,
        yi: &mut [f32],
        col: &mut [f32],
        tmp: &mut [f32],
    ) -> Result<()> {
        let (kd, so, mg) = (d.kdim(), d.spatial_out(), d.mg());
        for gi in 0..d.group {
            let wg = &ws[gi * mg * kd..(gi + 1) * mg * kd];
            match g.order {
                Order::Nchw => {
                    let dst = &mut yi[gi * mg * so..(gi + 1) * mg * so];
                    if plan.direct {
                        let base = (img * d.c + gi * d.cg()) * d.h * d.w;
                        gemm.sgemm(
                            false,
                            false,
                            mg,
                            so,
                            kd,
                            1.0,
                            wg,
                            &xs[base..base + kd * so],
                            0.0,
                            dst,
                        );
                    } else {
                        im2col(g, d, xs, img, gi, col);
                        gemm.sgemm(false, false, mg, so, kd, 1.0, wg, col, 0.0, dst);
                    }
                }
                Order::Nhwc if plan.single_channel.is_some() => {
                    if let Some(g1) = &plan.single_channel {
                        im2col(g1, d, xs, img, 0, col);
                        gemm.sgemm(false, false, d.m, so, kd, 1.0, wg, col, 0.0, tmp);
                        for (p, row) in yi.chunks_mut(d.m).enumerate() {
                            for (m, v) in row.iter_mut().enumerate() {
                                *v = tmp[m * so + p];
                            }
                        }
                    }
                }
                Order::Nhwc => {
                    let cols: &[f32] = if plan.direct {
                        // 1x1, stride 1, no padding, one group: the image is its own column
                        // matrix [h*w, C].
                        &xs[img * so * kd..(img + 1) * so * kd]
                    } else {
                        im2col(g, d, xs, img, gi, col);
                        col
                    };
                    if d.group == 1 {
                        gemm.sgemm(false, true, so, d.m, kd, 1.0, cols, wg, 0.0, yi);
                    } else {
                        gemm.sgemm(false, true, so, mg, kd, 1.0, cols, wg, 0.0, tmp);
                        for p in 0..so {
                            yi[p * d.m + gi * mg..p * d.m + (gi + 1) * mg]
                                .copy_from_slice(&tmp[p * mg..(p + 1) * mg]);
                        }
                    }
                }
            }
        }
        self.finish(g.order, so, bias, yi);
        Ok(())
    }

    /// Adds the bias to `y` (whole NCHW planes of `so` values, or whole NHWC pixels of
    /// `bias.len()` channels), then applies the fused Relu.
    fn finish(&self, order: Order, so: usize, bias: Option<&[f32]>, y: &mut [f32]) {
        if let Some(b) = bias {
            match order {
                Order::Nchw => {
                    for (row, &bv) in y.chunks_mut(so).zip(b) {
                        for v in row {
                            *v += bv;
                        }
                    }
                }
                Order::Nhwc => {
                    for row in y.chunks_mut(b.len().max(1)) {
                        for (v, &bv) in row.iter_mut().zip(b) {
                            *v += bv;
                        }
                    }
                }
            }
        }
        if self.relu {
            relu_in_place(y);
        }
    }

    /// Inputs (X, W, dY); outputs (dW, db, dX) or, with no_bias, (dW, dX); dX optional.
    ///
    /// Images are shared out like the forward pass's: each part adds up its own dW and db
    /// (summed in part order afterwards) and writes dX of its own images.
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let n_out = ctx.num_outputs();
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let d = self.dims(x.dims(), w.dims())?;
        let dy = ins.tensor(2)?;
        let y_dims = self.g.dims(d.n, d.m, d.oh, d.ow);
        if dy.dims() != y_dims.as_slice() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let (xs, ws, g) = (
            x.as_slice::<f32>()?,
            w.as_slice::<f32>()?,
            dy.as_slice::<f32>()?,
        );
        let want_dx = n_out > if self.no_bias { 1 } else { 2 };
        let mut dx = if want_dx {
            try_vec(xs.len(), 0f32, "dX")?
        } else {
            Vec::new()
        };
        // No image: dW, db and dX are zeros (the column buffers would be of no use).
        let n_imgs = if g.is_empty() { 0 } else { d.n };
        let per = if n_imgs == 0 {
            1
        } else {
            Plan::new(&self.g, &d)?.images_per_part(&d)
        };
        let (col_len, gg_len) = if n_imgs == 0 {
            (0, 0)
        } else {
            (d.col_len()?, d.spatial_out() * d.mg())
        };
        let img_in = d.c * d.h * d.w;
        let n_parts = n_imgs.div_ceil(per).max(1);
        let mut parts = Vec::with_capacity(n_parts);
        let mut dx_chunks: Vec<&mut [f32]> = if want_dx && img_in > 0 {
            dx.chunks_mut(per * img_in).collect()
        } else {
            Vec::new()
        };
        dx_chunks.resize_with(n_parts, Default::default);
        for (i, dxp) in dx_chunks.into_iter().enumerate() {
            let first = i * per;
            let count = per.min(n_imgs.saturating_sub(first));
            parts.push(GradPart {
                first,
                count,
                dx: dxp,
                dw: try_vec(ws.len(), 0f32, "dW")?,
                db: try_vec(d.m, 0f32, "db")?,
                col: try_vec(col_len, 0f32, "the column buffer")?,
                gg: try_vec(gg_len, 0f32, "the group buffer")?,
            });
        }
        let done = parking_lot::Mutex::new(Vec::with_capacity(n_parts));
        for_each_part(parts, &|mut part| {
            self.grad_images(&d, gemm, xs, ws, g, want_dx, &mut part);
            done.lock().push((part.first, part.dw, part.db));
        });
        let mut done = done.into_inner();
        done.sort_by_key(|p| p.0);
        let mut sums = done.into_iter();
        let (mut dw, mut db) = match sums.next() {
            Some((_, dw, db)) => (dw, db),
            None => (try_vec(ws.len(), 0f32, "dW")?, try_vec(d.m, 0f32, "db")?),
        };
        for (_, pw, pb) in sums {
            for (a, b) in dw.iter_mut().zip(&pw) {
                *a += b;
            }
            for (a, b) in db.iter_mut().zip(&pb) {
                *a += b;
            }
        }
        let (w_dims, x_dims) = (w.dims().to_vec(), x.dims().to_vec());
        let dx = want_dx.then_some((x_dims.as_slice(), dx.as_slice()));
        write_grads(
            &mut outs,
            (&w_dims, &dw),
            (!self.no_bias).then_some(db.as_slice()),
            dx,
        )
    }

    /// dW and db of a part's images added into its own sums, and their dX written.
    #[allow(clippy::too_many_arguments)]
    fn grad_images(
        &self,
        d: &Dims,
        gemm: GemmContext,
        xs: &[f32],
        ws: &[f32],
        g: &[f32],
        want_dx: bool,
        part: &mut GradPart<'_>,
    ) {
        let (kd, so, mg) = (d.kdim(), d.spatial_out(), d.mg());
        let img_out = d.m * so;
        let (col, gg) = (&mut part.col, &mut part.gg);
        for k in 0..part.count {
            let img = part.first + k;
            let gi_all = &g[img * img_out..(img + 1) * img_out];
            for gi in 0..d.group {
                // dY of this group as [mg, so] (NCHW) or [so, mg] (NHWC).
                match self.g.order {
                    Order::Nchw => gg.copy_from_slice(&gi_all[gi * mg * so..(gi + 1) * mg * so]),
                    Order::Nhwc => {
                        for p in 0..so {
                            gg[p * mg..(p + 1) * mg].copy_from_slice(
                                &gi_all[p * d.m + gi * mg..p * d.m + (gi + 1) * mg],
                            );
                        }
                    }
                }
                im2col(&self.g, d, xs, img, gi, col);
                let dwg = &mut part.dw[gi * mg * kd..(gi + 1) * mg * kd];
                let wg = &ws[gi * mg * kd..(gi + 1) * mg * kd];
                match self.g.order {
                    Order::Nchw => {
                        gemm.sgemm(false, true, mg, kd, so, 1.0, gg, col, 1.0, dwg);
                        if want_dx {
                            gemm.sgemm(true, false, kd, so, mg, 1.0, wg, gg, 0.0, col);
                        }
                    }
                    Order::Nhwc => {
                        gemm.sgemm(true, false, mg, kd, so, 1.0, gg, col, 1.0, dwg);
                        if want_dx {
                            gemm.sgemm(false, false, so, kd, mg, 1.0, gg, wg, 0.0, col);
                        }
                    }
                }
                if want_dx {
                    // The part's dX starts at its first image.
                    col2im(&self.g, d, col, k, gi, part.dx);
                }
            }
            match self.g.order {
                Order::Nchw => {
                    for (acc, row) in part.db.iter_mut().zip(gi_all.chunks(so.max(1))) {
                        *acc += row.iter().sum::<f32>();
                    }
                }
                Order::Nhwc if d.m > 0 => {
                    for row in gi_all.chunks(d.m) {
                        for (acc, v) in part.db.iter_mut().zip(row) {
                            *acc += v;
                        }
                    }
                }
                // No output channel: no bias gradient to add up.
                Order::Nhwc => {}
            }
        }
    }
}

/// The images `first .. first + count` of a backward pass, with their own sums and buffers.
struct GradPart<'a> {
    first: usize,
    count: usize,
    dx: &'a mut [f32],
    dw: Vec<f32>,
    db: Vec<f32>,
    col: Vec<f32>,
    gg: Vec<f32>,
}

impl Operator for Conv {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            self.backward(ctx)
        } else {
            self.forward(ctx)
        }
    }

    fn fuse_relu(&mut self) -> bool {
        self.relu = !self.gradient;
        self.relu
    }
}

/// Runs `f` on each part, shared out like [`for_each_part`]; the first error any part returns
/// (a part stops at its own error, the others run on).
fn parts_until_error<T: Send>(parts: Vec<T>, f: &(dyn Fn(T) -> Result<()> + Sync)) -> Result<()> {
    let first_error = parking_lot::Mutex::new(None);
    for_each_part(parts, &|part| {
        if let Err(e) = f(part) {
            first_error.lock().get_or_insert(e);
        }
    });
    match first_error.into_inner() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A 4-d input with a 2-d geometry runs on [`Conv`], any other on [`ConvNd`].
fn create(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let nd = NdGeometry::new(init)?;
    let group = init.args.usize("group", 1)?;
    if group == 0 {
        bail!(op = init, BadArgument: "group must be positive");
    }
    let no_bias = init.args.bool("no_bias", false)?;
    let two_d: Option<Box<dyn Operator>> = if nd.fits_2d() {
        Some(Box::new(Conv {
            g: Geometry::new(init)?,
            group,
            gradient,
            no_bias,
            relu: false,
            winograd: Mode::from_env(),
            direct: conv_direct::Mode::from_env(),
            slices: std::env::var("FERROCAFFE_CONV_SLICES").as_deref() != Ok("0"),
            filters: Default::default(),
        }))
    } else {
        None
    };
    Ok(Box::new(Dispatch {
        two_d,
        nd: Box::new(ConvNd {
            g: nd,
            group,
            gradient,
            no_bias,
            relu: false,
        }),
    }))
}

/// The outputs of a convolution gradient: dW (shaped like W), db (one per output channel)
/// unless there is no bias, and dX (shaped like X) when it is wanted, in that order.
pub(crate) fn write_grads(
    outs: &mut crate::ops::operator::Outputs<'_, '_>,
    (w_dims, dw): (&[usize], &[f32]),
    db: Option<&[f32]>,
    dx: Option<(&[usize], &[f32])>,
) -> Result<()> {
    outs.tensor(0)?
        .try_ensure::<f32>(w_dims)?
        .copy_from_slice(dw);
    let mut next = 1;
    if let Some(db) = db {
        outs.tensor(1)?
            .try_ensure::<f32>(&[db.len()])?
            .copy_from_slice(db);
        next = 2;
    }
    if let Some((x_dims, dx)) = dx {
        outs.tensor(next)?
            .try_ensure::<f32>(x_dims)?
            .copy_from_slice(dx);
    }
    Ok(())
}
