//! Normalisation: SpatialBN (inference with `is_test`, and training with running statistics)
//! and its gradient, LRN (cross-channel) and its gradient, InstanceNorm and its gradient,
//! LayerNorm and its gradient — NCHW or NHWC where it applies.

use super::par::{copy_if_inplace, for_each_chunk};
use super::sums::{channel_sums, dot_sum_f64, sums_f64};
use crate::blas::{for_each_part, part_len};
use crate::error::{try_vec, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("SpatialBN", |i| create_bn(i, false));
    r.cpu("ChannelStats", |i| {
        let nhwc = nhwc(i)?;
        Ok(Box::new(crate::ops::operator::FnOp(
            move |ctx: &mut OpContext<'_>| channel_stats(ctx, nhwc),
        )))
    });
    r.cpu("ChannelBackpropStats", |i| {
        let nhwc = nhwc(i)?;
        Ok(Box::new(crate::ops::operator::FnOp(
            move |ctx: &mut OpContext<'_>| channel_backprop_stats(ctx, nhwc),
        )))
    });
    r.cpu("SpatialBNGradient", |i| create_bn(i, true));
    r.cpu("LRN", |i| create_lrn(i, false));
    r.cpu("LRNGradient", |i| create_lrn(i, true));
    r.cpu("InstanceNorm", create_instance_norm);
    r.cpu("InstanceNormGradient", create_instance_norm_gradient);
    r.cpu("LayerNorm", |i| create_layer_norm(i, false));
    r.cpu("LayerNormGradient", |i| create_layer_norm(i, true));
    // Caffe2's c10 export of the same kernel.
    r.cpu("C10LayerNorm_DontUseThisOpYet", |i| {
        create_layer_norm(i, false)
    });
}

/// (n, c, inner) and whether channels are last.
fn layout(dims: &[usize], nhwc: bool) -> Result<(usize, usize, usize)> {
    if dims.len() < 2 {
        bail!(ShapeMismatch: "expected at least 2 dimensions, got {dims:?}");
    }
    let n = dims[0];
    let c = if nhwc { dims[dims.len() - 1] } else { dims[1] };
    let total: usize = dims.iter().product();
    Ok((n, c, total.checked_div(n * c).unwrap_or(0)))
}

/// Index of (image, channel, spatial position).
#[inline]
fn at(nhwc: bool, c: usize, inner: usize, img: usize, ch: usize, s: usize) -> usize {
    if nhwc {
        (img * inner + s) * c + ch
    } else {
        (img * c + ch) * inner + s
    }
}

struct SpatialBn {
    num_batches: usize,
    eps: f32,
    momentum: f32,
    is_test: bool,
    nhwc: bool,
    gradient: bool,
    /// An in-place Relu on Y folded into this op ([`Operator::fuse_relu`]).
    relu: bool,
}

fn channel_vec(ctx: &OpContext<'_>, i: usize, c: usize) -> Result<Vec<f32>> {
    let v = ctx.input(i)?.as_slice::<f32>()?;
    if v.len() != c {
        bail!(
            ShapeMismatch: "input {i} ('{}') has {} values, expected C = {c}",
            ctx.input_name(i),
            v.len()
        );
    }
    Ok(v.to_vec())
}

/// A running statistic (input `i`, aliased with its output): Caffe2 starts one that has not
/// been initialised to C values from zeros.
fn running_vec(ctx: &OpContext<'_>, i: usize, c: usize) -> Result<Vec<f32>> {
    let v = ctx.input(i)?.as_slice::<f32>()?;
    if v.len() == c {
        Ok(v.to_vec())
    } else {
        try_vec(c, 0.0, "a running statistic")
    }
}

impl SpatialBn {
    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, self.nhwc)?;
        let scale = channel_vec(ctx, 1, c)?;
        let bias = channel_vec(ctx, 2, c)?;
        let m = (n * inner) as f32;
        let copy = copy_if_inplace(ctx, 0)?;
        if copy.is_none() {
            // X must hold floats whatever the mode.
            ctx.input(0)?.as_slice::<f32>()?;
        }
        if n == 0 {
            return self.forward_empty(ctx, &dims, c);
        }
        let (mean, var) = if self.is_test {
            (channel_vec(ctx, 3, c)?, channel_vec(ctx, 4, c)?)
        } else if self.num_batches > 1 {
            // Sums over every batch (device) of the step, from ChannelStats.
            if ctx.num_inputs() < 7 {
                bail!(Schema: "SpatialBN with num_batches > 1 needs the sums and sumsq inputs");
            }
            let sums = channel_vec(ctx, 5, c)?;
            let sumsq = channel_vec(ctx, 6, c)?;
            let total = (self.num_batches * n * inner).max(1) as f32;
            let mean: Vec<f32> = sums.iter().map(|v| v / total).collect();
            let var = sumsq
                .iter()
                .zip(&mean)
                .map(|(q, mu)| (q / total - mu * mu).max(0.0))
                .collect();
            (mean, var)
        } else {
            let x = match &copy {
                Some(v) => v.as_slice(),
                None => ctx.input(0)?.as_slice::<f32>()?,
            };
            let (s1, s2) = channel_sums(x, x, (n, c, inner), self.nhwc, true)?;
            let mean: Vec<f32> = s1.iter().map(|s| (s / m.max(1.0) as f64) as f32).collect();
            let var: Vec<f32> = s2
                .iter()
                .zip(&mean)
                .map(|(s, &mu)| ((s / m.max(1.0) as f64) as f32 - mu * mu).max(0.0))
                .collect();
            (mean, var)
        };
        let inv: Vec<f32> = var.iter().map(|v| 1.0 / (v + self.eps).sqrt()).collect();
        {
            let a: Vec<f32> = (0..c).map(|ch| scale[ch] * inv[ch]).collect();
            let b: Vec<f32> = (0..c)
                .map(|ch| bias[ch] - mean[ch] * scale[ch] * inv[ch])
                .collect();
            let (ins, mut outs) = ctx.split();
            let x = match &copy {
                Some(v) => v.as_slice(),
                None => ins.tensor(0)?.as_slice::<f32>()?,
            };
            let y = outs.tensor(0)?.ensure::<f32>(&dims);
            channel_affine(x, y, &a, &b, (c, inner), self.nhwc, self.relu)?;
        }
        if !self.is_test {
            if ctx.num_outputs() < 5 {
                bail!(Schema: "SpatialBN in training mode needs 5 outputs");
            }
            let mut rm = running_vec(ctx, 3, c)?;
            let mut rv = running_vec(ctx, 4, c)?;
            // The running variance is unbiased (reduce size / (reduce size - 1)).
            let size = (self.num_batches * n * inner) as f32;
            let unbias = if size > 1.0 {
                size / (size - 1.0)
            } else {
                f32::INFINITY
            };
            for ch in 0..c {
                rm[ch] = rm[ch] * self.momentum + mean[ch] * (1.0 - self.momentum);
                rv[ch] = rv[ch] * self.momentum + var[ch] * unbias * (1.0 - self.momentum);
            }
            ctx.output(1)?.ensure::<f32>(&[c]).copy_from_slice(&rm);
            ctx.output(2)?.ensure::<f32>(&[c]).copy_from_slice(&rv);
            ctx.output(3)?.ensure::<f32>(&[c]).copy_from_slice(&mean);
            ctx.output(4)?.ensure::<f32>(&[c]).copy_from_slice(&inv);
        }
        Ok(())
    }

    /// An empty batch (N = 0): Y is empty; in training the running statistics stay as they
    /// are (zeros where they were never initialised) and the saved mean and inverse std are
    /// zeros, as no statistic was measured.
    fn forward_empty(&self, ctx: &mut OpContext<'_>, dims: &[usize], c: usize) -> Result<()> {
        ctx.output(0)?.ensure::<f32>(dims);
        if self.is_test {
            return Ok(());
        }
        if ctx.num_outputs() < 5 {
            bail!(Schema: "SpatialBN in training mode needs 5 outputs");
        }
        let rm = running_vec(ctx, 3, c)?;
        let rv = running_vec(ctx, 4, c)?;
        ctx.output(1)?.ensure::<f32>(&[c]).copy_from_slice(&rm);
        ctx.output(2)?.ensure::<f32>(&[c]).copy_from_slice(&rv);
        ctx.output(3)?.ensure::<f32>(&[c]).fill(0.0);
        ctx.output(4)?.ensure::<f32>(&[c]).fill(0.0);
        Ok(())
    }

    /// Inputs (X, scale, dY, saved_mean, saved_inv_std[, dscale_sum, dbias_sum]); outputs
    /// (dX, dscale, dbias).
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, self.nhwc)?;
        let scale = channel_vec(ctx, 1, c)?;
        let mean = channel_vec(ctx, 3, c)?;
        let inv = channel_vec(ctx, 4, c)?;
        let xlen = ctx.input(0)?.as_slice::<f32>()?.len();
        if ctx.input(2)?.as_slice::<f32>()?.len() != xlen {
            bail!(ShapeMismatch: "dY must have the shape of X");
        }
        if n == 0 {
            // Nothing was normalised: an empty dX and zero parameter gradients (also with
            // several batches, whatever the summed gradients say).
            ctx.output(0)?.ensure::<f32>(&dims);
            ctx.output(1)?.ensure::<f32>(&[c]).fill(0.0);
            ctx.output(2)?.ensure::<f32>(&[c]).fill(0.0);
            return Ok(());
        }
        let (cx, cg) = (copy_if_inplace(ctx, 0)?, copy_if_inplace(ctx, 2)?);
        let m = (self.num_batches * n * inner) as f32;
        let (dscale, dbias) = if self.num_batches > 1 {
            // Gradients of scale and bias summed over every batch (ChannelBackpropStats).
            if ctx.num_inputs() < 7 {
                bail!(
                    Schema: "SpatialBNGradient with num_batches > 1 needs the scale and bias \
                     gradient inputs"
                );
            }
            (channel_vec(ctx, 5, c)?, channel_vec(ctx, 6, c)?)
        } else {
            let x = match &cx {
                Some(v) => v.as_slice(),
                None => ctx.input(0)?.as_slice::<f32>()?,
            };
            let g = match &cg {
                Some(v) => v.as_slice(),
                None => ctx.input(2)?.as_slice::<f32>()?,
            };
            backprop_stats(x, g, &mean, &inv, (n, c, inner), self.nhwc)?
        };
        {
            let f: Vec<f32> = (0..c).map(|ch| scale[ch] * inv[ch] / m.max(1.0)).collect();
            let (ins, mut outs) = ctx.split();
            let x = match &cx {
                Some(v) => v.as_slice(),
                None => ins.tensor(0)?.as_slice::<f32>()?,
            };
            let g = match &cg {
                Some(v) => v.as_slice(),
                None => ins.tensor(2)?.as_slice::<f32>()?,
            };
            let dx = outs.tensor(0)?.ensure::<f32>(&dims);
            let (mean, inv, dscale, dbias, f) = (&mean, &inv, &dscale, &dbias, &f);
            // dX = f * (m dY - dbias - x_hat dscale), x_hat = (X - mean) inv_std.
            if self.nhwc {
                for_each_chunk(dx, c, c.saturating_mul(3), &|first, part| {
                    let span = first * c..first * c + part.len();
                    let (xs, gs) = (&x[span.clone()], &g[span]);
                    let px = part.chunks_mut(c).zip(xs.chunks(c)).zip(gs.chunks(c));
                    for ((dp, xp), gp) in px {
                        let it = dp.iter_mut().zip(xp).zip(gp).zip(mean).zip(inv);
                        for (((((d, &xv), &gv), &mu), &iv), ((&fc, &db), &ds)) in
                            it.zip(f.iter().zip(dbias).zip(dscale))
                        {
                            let xhat = (xv - mu) * iv;
                            *d = fc * (m * gv - db - xhat * ds);
                        }
                    }
                });
            } else {
                for_each_chunk(dx, inner, inner.saturating_mul(3), &|first, part| {
                    let span = first * inner..first * inner + part.len();
                    let (xs, gs) = (&x[span.clone()], &g[span]);
                    let planes = part
                        .chunks_mut(inner)
                        .zip(xs.chunks(inner))
                        .zip(gs.chunks(inner));
                    for (k, ((dp, xp), gp)) in planes.enumerate() {
                        let ch = (first + k) % c;
                        let (mu, iv, fc, db, ds) =
                            (mean[ch], inv[ch], f[ch], dbias[ch], dscale[ch]);
                        for ((d, &xv), &gv) in dp.iter_mut().zip(xp).zip(gp) {
                            let xhat = (xv - mu) * iv;
                            *d = fc * (m * gv - db - xhat * ds);
                        }
                    }
                });
            }
        }
        // With several batches, each one reports its share of the combined gradients (they are
        // summed again across batches with the other parameter gradients).
        let share = 1.0 / self.num_batches as f32;
        let ds: Vec<f32> = dscale.iter().map(|v| v * share).collect();
        let db: Vec<f32> = dbias.iter().map(|v| v * share).collect();
        ctx.output(1)?.ensure::<f32>(&[c]).copy_from_slice(&ds);
        ctx.output(2)?.ensure::<f32>(&[c]).copy_from_slice(&db);
        Ok(())
    }
}

impl Operator for SpatialBn {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            self.backward(ctx)
        } else {
            self.forward(ctx)
        }
    }

    /// Y gets the Relu as it is written (Conv -> SpatialBN -> Relu: one pass over Y fewer).
    fn fuse_relu(&mut self) -> bool {
        self.relu = !self.gradient;
        self.relu
    }
}

fn nhwc(init: &OpInit<'_>) -> Result<bool> {
    match init.args.string("order", "NCHW")?.as_str() {
        "NCHW" => Ok(false),
        "NHWC" => Ok(true),
        other => Err(err!(op = init, BadArgument: "Unknown storage order: {other}")),
    }
}

fn create_bn(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let num_batches = init.args.usize("num_batches", 1)?.max(1);
    Ok(Box::new(SpatialBn {
        num_batches,
        eps: init.args.float("epsilon", 1e-5)?,
        momentum: init.args.float("momentum", 0.9)?,
        is_test: init.args.bool("is_test", false)?,
        nhwc: nhwc(init)?,
        gradient,
        relu: false,
    }))
}

/// [`super::math::relu`] of `v` when `on`, else `v`.
#[inline(always)]
fn relu_if(on: bool, v: f32) -> f32 {
    if on {
        super::math::relu(v)
    } else {
        v
    }
}

struct Lrn {
    size: usize,
    alpha: f32,
    beta: f32,
    bias: f32,
    nhwc: bool,
}

/// `s^-beta` for the common betas without `powf` (within a few ulp of it).
#[derive(Clone, Copy)]
enum Beta {
    Zero,
    Half,
    ThreeQuarters,
    One,
    Other(f32),
}

/// Runs `$body` with `$p` bound to the function `s -> s^-beta` of `$beta`, monomorphized per
/// case so the loops in `$body` vectorize. (`sqrt(s) + 0.0` turns `sqrt(-0.0) = -0.0` into
/// `+0.0`, as `powf(-0.0, -beta)` is `+inf` for these betas.)
macro_rules! with_neg_pow {
    ($beta:expr, $p:ident => $body:expr) => {
        match $beta {
            Beta::Zero => {
                let $p = |_: f32| 1.0f32;
                $body
            }
            Beta::Half => {
                let $p = |s: f32| 1.0 / (s.sqrt() + 0.0);
                $body
            }
            Beta::ThreeQuarters => {
                let $p = |s: f32| {
                    let r = s.sqrt() + 0.0;
                    1.0 / (r * r.sqrt())
                };
                $body
            }
            Beta::One => {
                let $p = |s: f32| 1.0 / s;
                $body
            }
            Beta::Other(b) => {
                let $p = |s: f32| s.powf(-b);
                $body
            }
        }
    };
}

/// `finish(first unit, window sums, output)` of the LRN window sums: `output` (and the sums)
/// are one NCHW plane, or a block of consecutive NHWC pixels.
type Finish<'a> = dyn Fn(usize, &[f32], &mut [f32]) + Sync + 'a;

/// Windows longer than this sum as a running sum (in f64) instead of term by term.
const LRN_DIRECT_MAX: usize = 9;

/// `sums[i] = padded[i] + padded[i + 1] + .. + padded[i + terms - 1]`, in that order
/// (compiled per SIMD level, chosen at run time).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn term_sums(padded: &[f32], terms: usize, sums: &mut [f32]) {
    sums.fill(0.0);
    for t in 0..terms {
        for (s, &v) in sums.iter_mut().zip(&padded[t..]) {
            *s += v;
        }
    }
}

/// `sums += plane^2` (`square`) or `sums += plane` (compiled per SIMD level).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn add_plane(square: bool, sums: &mut [f32], plane: &[f32]) {
    if square {
        for (s, &v) in sums.iter_mut().zip(plane) {
            *s += v * v;
        }
    } else {
        for (s, &v) in sums.iter_mut().zip(plane) {
            *s += v;
        }
    }
}

/// `o = x * (bias + a * sums)^-beta`, element by element (compiled per SIMD level).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn lrn_out(beta: Beta, (a, bias): (f32, f32), x: &[f32], sums: &[f32], o: &mut [f32]) {
    with_neg_pow!(beta, p => {
        for ((o, &s), &v) in o.iter_mut().zip(sums).zip(x) {
            *o = v * p(bias + a * s);
        }
    });
}

/// `o = dy * scale^-beta - k * x * sums`, element by element: the LRN gradient's last step
/// (compiled per SIMD level).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn lrn_grad_out(
    beta: Beta,
    k: f32,
    (x, dy, scale): (&[f32], &[f32], &[f32]),
    sums: &[f32],
    o: &mut [f32],
) {
    with_neg_pow!(beta, p => {
        let it = o.iter_mut().zip(sums).zip(x).zip(dy).zip(scale);
        for ((((o, &acc), &xv), &g), &s) in it {
            *o = g * p(s) - k * xv * acc;
        }
    });
}

/// The channel-window sums of `f(src)` (`f` the square when `SQUARE`, else the identity) for
/// the NCHW planes `first..` (of `c` channels of `inner` values each), one plane at a time:
/// `finish(plane, sums, out_plane)` gets the sums of each plane. The window of channel `ch`
/// spans `ch - pre ..= ch + pre`, clipped (`pre` <= c). `acc` is scratch of `inner` values.
#[allow(clippy::too_many_arguments)]
fn lrn_planes<const SQUARE: bool>(
    src: &[f32],
    (c, inner, pre): (usize, usize, usize),
    first: usize,
    out: &mut [f32],
    sums: &mut [f32],
    acc: &mut [f64],
    finish: &Finish<'_>,
) {
    let f = |v: f32| if SQUARE { v * v } else { v };
    let running = 2 * pre + 1 > LRN_DIRECT_MAX;
    for (k, op) in out.chunks_mut(inner).enumerate() {
        let plane = first + k;
        let (img, ch) = (plane / c, plane % c);
        let base = img * c * inner;
        let src_plane = |j: usize| &src[base + j * inner..base + (j + 1) * inner];
        let (lo, hi) = (ch.saturating_sub(pre), (ch + pre + 1).min(c));
        if !running {
            sums.fill(0.0);
            for j in lo..hi {
                add_plane(SQUARE, sums, src_plane(j));
            }
        } else {
            if k == 0 || ch == 0 {
                acc.fill(0.0);
                for j in lo..hi {
                    for (a, &v) in acc.iter_mut().zip(src_plane(j)) {
                        *a += f64::from(f(v));
                    }
                }
            } else {
                // The window moved by one channel: it gained `ch + pre` and lost `ch - pre - 1`.
                if ch + pre < c {
                    for (a, &v) in acc.iter_mut().zip(src_plane(ch + pre)) {
                        *a += f64::from(f(v));
                    }
                }
                if ch > pre {
                    for (a, &v) in acc.iter_mut().zip(src_plane(ch - pre - 1)) {
                        *a -= f64::from(f(v));
                    }
                }
            }
            for (s, &a) in sums.iter_mut().zip(acc.iter()) {
                *s = a as f32;
            }
        }
        finish(plane, sums, op);
    }
}

/// Pixels per block of the NHWC window sums: about 256 values' worth.
fn block_pixels(c: usize) -> usize {
    (256 / c.max(1)).max(1)
}

/// As [`lrn_planes`] for NHWC pixels `first..` of `c` channels, a block of pixels at a time:
/// `padded` is scratch of `block_pixels(c) * (c + 2 pre)` values (each pixel's `f(src)`
/// between `2 pre` zeros, zero initially), `sums` of as many, `packed` of
/// `block_pixels(c) * c`; `finish` gets a block's pixels at once.
fn lrn_pixels<const SQUARE: bool>(
    src: &[f32],
    (c, pre): (usize, usize),
    first: usize,
    out: &mut [f32],
    (padded, sums, packed): (&mut [f32], &mut [f32], &mut [f32]),
    finish: &Finish<'_>,
) {
    let running = 2 * pre + 1 > LRN_DIRECT_MAX;
    let stride = c + 2 * pre;
    let block = block_pixels(c);
    for (b, ob) in out.chunks_mut(block * c).enumerate() {
        let px0 = first + b * block;
        let count = ob.len() / c.max(1);
        for (p, xs) in src[px0 * c..(px0 + count) * c].chunks_exact(c).enumerate() {
            let row = &mut padded[p * stride + pre..p * stride + pre + c];
            for (d, &v) in row.iter_mut().zip(xs) {
                *d = if SQUARE { v * v } else { v };
            }
        }
        if !running {
            // Term by term in channel order (the zeros between pixels add nothing): one sweep
            // over the block, whose positions between pixels are not used.
            let n = count * stride - 2 * pre;
            term_sums(&padded[..count * stride], 2 * pre + 1, &mut sums[..n]);
            for (p, dst) in packed[..count * c].chunks_exact_mut(c).enumerate() {
                dst.copy_from_slice(&sums[p * stride..p * stride + c]);
            }
        } else {
            for (p, dst) in packed[..count * c].chunks_exact_mut(c).enumerate() {
                let pad = &padded[p * stride..(p + 1) * stride];
                let mut a: f64 = pad[..2 * pre].iter().map(|&v| f64::from(v)).sum();
                for (ch, s) in dst.iter_mut().enumerate() {
                    // Window of channel ch: pad[ch ..= ch + 2 pre].
                    a += f64::from(pad[ch + 2 * pre]);
                    *s = a as f32;
                    a -= f64::from(pad[ch]);
                }
            }
        }
        finish(px0, &packed[..count * c], ob);
    }
}

impl Lrn {
    fn kind(&self) -> Beta {
        let b = self.beta;
        if b == 0.0 {
            Beta::Zero
        } else if b == 0.5 {
            Beta::Half
        } else if b == 0.75 {
            Beta::ThreeQuarters
        } else if b == 1.0 {
            Beta::One
        } else {
            Beta::Other(b)
        }
    }

    /// Fills `out` (X's shape) with `finish(unit, window sums, output)` per plane (NCHW) or
    /// block of pixels (NHWC), the sums over the channel window of `src^2` (`square`) or `src`.
    fn windows(
        &self,
        src: &[f32],
        (_, c, inner): (usize, usize, usize),
        square: bool,
        out: &mut [f32],
        finish: &Finish<'_>,
    ) {
        // A window reaching past every channel is the same as one reaching just past them.
        let pre = ((self.size - 1) / 2).min(c);
        let terms = (2 * pre + 1).min(LRN_DIRECT_MAX + 2);
        if self.nhwc {
            for_each_chunk(out, c, c.saturating_mul(terms + 4), &|first, part| {
                // Scratch of a block of pixels (about 256 values, plus 2 pre per pixel; pre
                // <= C).
                let len = block_pixels(c) * (c + 2 * pre);
                let mut padded = vec![0f32; len];
                let mut sums = vec![0f32; len];
                let mut packed = vec![0f32; block_pixels(c) * c];
                let io = (
                    padded.as_mut_slice(),
                    sums.as_mut_slice(),
                    packed.as_mut_slice(),
                );
                if square {
                    lrn_pixels::<true>(src, (c, pre), first, part, io, finish)
                } else {
                    lrn_pixels::<false>(src, (c, pre), first, part, io, finish)
                }
            });
        } else {
            for_each_chunk(
                out,
                inner,
                inner.saturating_mul(terms + 4),
                &|first, part| {
                    // Scratch of one plane (inner <= X's size).
                    let mut sums = vec![0f32; inner];
                    let mut acc = if 2 * pre + 1 > LRN_DIRECT_MAX {
                        vec![0f64; inner]
                    } else {
                        Vec::new()
                    };
                    let geo = (c, inner, pre);
                    if square {
                        lrn_planes::<true>(src, geo, first, part, &mut sums, &mut acc, finish)
                    } else {
                        lrn_planes::<false>(src, geo, first, part, &mut sums, &mut acc, finish)
                    }
                },
            );
        }
    }

    /// Writes the scale `bias + alpha / size * (sum of squares over the channel window)`.
    fn scale(&self, x: &[f32], shape: (usize, usize, usize), out: &mut [f32]) {
        let (a, bias) = (self.alpha / self.size as f32, self.bias);
        self.windows(x, shape, true, out, &|_, sums, o| {
            for (o, &s) in o.iter_mut().zip(sums) {
                *o = bias + a * s;
            }
        });
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let shape = layout(&dims, self.nhwc)?;
        let copy = copy_if_inplace(ctx, 0)?;
        let want_scale = ctx.num_outputs() > 1;
        let (ins, mut outs) = ctx.split();
        let x = match &copy {
            Some(v) => v.as_slice(),
            None => ins.tensor(0)?.as_slice::<f32>()?,
        };
        let unit = if self.nhwc { shape.1 } else { shape.2 };
        let (a, bias) = (self.alpha / self.size as f32, self.bias);
        {
            let y = outs.tensor(0)?.ensure::<f32>(&dims);
            let beta = self.kind();
            self.windows(x, shape, true, y, &|u, sums, o| {
                lrn_out(beta, (a, bias), &x[u * unit..u * unit + o.len()], sums, o)
            });
        }
        if want_scale {
            let s = outs.tensor(1)?.ensure::<f32>(&dims);
            self.scale(x, shape, s);
        }
        Ok(())
    }

    /// Inputs X, Y, dY; output dX. With `s` the scale, `Y = X s^-beta` gives
    /// `dX_c = dY_c s_c^-beta - 2 alpha beta / size * X_c * sum_{j in window(c)} dY_j Y_j / s_j`
    /// (the windows are symmetric, so c is in window(j) exactly when j is in window(c)).
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let shape = layout(&dims, self.nhwc)?;
        for i in 1..3 {
            if ctx.input(i)?.dims() != dims.as_slice() {
                bail!(
                    ShapeMismatch: "input {i} ('{}') has shape {:?}, expected the shape of X \
                     {dims:?}",
                    ctx.input_name(i),
                    ctx.input(i)?.dims()
                );
            }
        }
        let x = ctx.input(0)?.as_slice::<f32>()?;
        let total = x.len();
        let mut scale = try_vec(total, 0f32, "LRNGradient scale")?;
        self.scale(x, shape, &mut scale);
        let mut ratio = try_vec(total, 0f32, "LRNGradient ratio")?;
        {
            let y = ctx.input(1)?.as_slice::<f32>()?;
            let dy = ctx.input(2)?.as_slice::<f32>()?;
            let scale = scale.as_slice();
            for_each_chunk(&mut ratio, 1 << 12, 1 << 14, &|first, part| {
                let k = first << 12;
                let it = part.iter_mut().zip(&dy[k..]).zip(&y[k..]).zip(&scale[k..]);
                for (((r, &g), &yv), &s) in it {
                    *r = g * yv / s;
                }
            });
        }
        let mut dx = try_vec(total, 0f32, "LRNGradient dX")?;
        {
            let dy = ctx.input(2)?.as_slice::<f32>()?;
            let unit = if self.nhwc { shape.1 } else { shape.2 };
            let cache_ratio = 2.0 * self.alpha * self.beta / self.size as f32;
            let scale = scale.as_slice();
            let beta = self.kind();
            self.windows(&ratio, shape, false, &mut dx, &|u, sums, o| {
                let r = u * unit..u * unit + o.len();
                let io = (&x[r.clone()], &dy[r.clone()], &scale[r]);
                lrn_grad_out(beta, cache_ratio, io, sums, o)
            });
        }
        ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
        Ok(())
    }
}

struct LrnOp {
    lrn: Lrn,
    gradient: bool,
}

impl Operator for LrnOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            self.lrn.backward(ctx)
        } else {
            self.lrn.forward(ctx)
        }
    }
}

fn create_lrn(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let size = init.args.usize("size", 0)?;
    if size == 0 || size % 2 == 0 {
        bail!(op = init, BadArgument: "LRN size must be odd and positive, got {size}");
    }
    Ok(Box::new(LrnOp {
        lrn: Lrn {
            size,
            alpha: init.args.float("alpha", 0.0)?,
            beta: init.args.float("beta", 0.0)?,
            bias: init.args.float("bias", 1.0)?,
            nhwc: nhwc(init)?,
        },
        gradient,
    }))
}

struct InstanceNorm {
    eps: f32,
    nhwc: bool,
    /// An in-place Relu on Y folded into this op ([`Operator::fuse_relu`]).
    relu: bool,
}

/// `(mean, 1 / sqrt(var + eps))` from a sum and a sum of squares over `m` values.
fn moments(s1: f64, s2: f64, m: usize, eps: f32) -> (f32, f32) {
    let m = m.max(1) as f64;
    let mean = (s1 / m) as f32;
    let var = ((s2 / m) as f32 - mean * mean).max(0.0);
    (mean, 1.0 / (var + eps).sqrt())
}

/// The statistics of the instances (image, channel) of the images or planes in `xs` (NCHW:
/// `xs` holds planes `first..`; NHWC: images `first..`), written to `stats` (one per plane,
/// or `c` per image).
fn instance_stats_part(
    xs: &[f32],
    (c, inner): (usize, usize),
    nhwc: bool,
    eps: f32,
    stats: &mut [(f32, f32)],
) {
    if !nhwc {
        for (st, xp) in stats.iter_mut().zip(xs.chunks_exact(inner)) {
            let (s1, s2) = sums_f64(xp);
            *st = moments(s1, s2, inner, eps);
        }
        return;
    }
    // Channels innermost: per-channel sums over the pixels (C <= X's size).
    let mut s1 = vec![0f64; c];
    let mut s2 = vec![0f64; c];
    for (st, xi) in stats.chunks_mut(c).zip(xs.chunks_exact(inner * c)) {
        s1.fill(0.0);
        s2.fill(0.0);
        for px in xi.chunks_exact(c) {
            for ((a, b), &v) in s1.iter_mut().zip(s2.iter_mut()).zip(px) {
                let v = f64::from(v);
                *a += v;
                *b += v * v;
            }
        }
        for ((st, &a), &b) in st.iter_mut().zip(&s1).zip(&s2) {
            *st = moments(a, b, inner, eps);
        }
    }
}

/// `y = (x - mean) * inv * scale + bias` (then Relu when `relu`), element by element
/// (compiled per SIMD level).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn normalize_plane(
    x: &[f32],
    (mean, inv, scale, bias): (f32, f32, f32, f32),
    relu: bool,
    y: &mut [f32],
) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = relu_if(relu, (v - mean) * inv * scale + bias);
    }
}

/// Mean and inverse standard deviation of every (image, channel) of `x`, in parallel over
/// planes (NCHW) or images (NHWC).
fn instance_stats(
    x: &[f32],
    (n, c, inner): (usize, usize, usize),
    nhwc: bool,
    eps: f32,
) -> Result<Vec<(f32, f32)>> {
    let mut stats = try_vec(
        n * c,
        moments(0.0, 0.0, inner, eps),
        "InstanceNorm statistics",
    )?;
    if inner == 0 {
        return Ok(stats);
    }
    let (unit, sunit) = if nhwc { (inner * c, c) } else { (inner, 1) };
    if unit == 0 {
        return Ok(stats);
    }
    for_each_chunk(&mut stats, sunit, unit.saturating_mul(2), &|first, part| {
        let first_group = first;
        let xs = &x[first_group * unit..(first_group + part.len() / sunit) * unit];
        instance_stats_part(xs, (c, inner), nhwc, eps, part)
    });
    Ok(stats)
}

impl Operator for InstanceNorm {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let shape = layout(&dims, self.nhwc)?;
        let (n, c, inner) = shape;
        let scale = channel_vec(ctx, 1, c)?;
        let bias = channel_vec(ctx, 2, c)?;
        let copy = copy_if_inplace(ctx, 0)?;
        let stats = {
            let x = match &copy {
                Some(v) => v.as_slice(),
                None => ctx.input(0)?.as_slice::<f32>()?,
            };
            instance_stats(x, shape, self.nhwc, self.eps)?
        };
        {
            let (ins, mut outs) = ctx.split();
            let x = match &copy {
                Some(v) => v.as_slice(),
                None => ins.tensor(0)?.as_slice::<f32>()?,
            };
            let y = outs.tensor(0)?.ensure::<f32>(&dims);
            if self.nhwc {
                for_each_chunk(y, c, c.saturating_mul(2), &|first, part| {
                    let xs = &x[first * c..first * c + part.len()];
                    for (k, (yp, xp)) in part.chunks_mut(c).zip(xs.chunks(c)).enumerate() {
                        let img = (first + k) / inner.max(1);
                        let st = &stats[img * c..(img + 1) * c];
                        let it = yp.iter_mut().zip(xp).zip(st).zip(&scale).zip(&bias);
                        for ((((o, &v), &(mean, inv)), &sc), &b) in it {
                            *o = relu_if(self.relu, (v - mean) * inv * sc + b);
                        }
                    }
                });
            } else {
                for_each_chunk(y, inner, inner.saturating_mul(2), &|first, part| {
                    let xs = &x[first * inner..first * inner + part.len()];
                    for (k, (yp, xp)) in part.chunks_mut(inner).zip(xs.chunks(inner)).enumerate() {
                        let plane = first + k;
                        let (mean, inv) = stats[plane];
                        let (sc, b) = (scale[plane % c], bias[plane % c]);
                        normalize_plane(xp, (mean, inv, sc, b), self.relu, yp);
                    }
                });
            }
        }
        if ctx.num_outputs() > 1 {
            let means: Vec<f32> = stats.iter().map(|s| s.0).collect();
            ctx.output(1)?
                .ensure::<f32>(&[n, c])
                .copy_from_slice(&means);
        }
        if ctx.num_outputs() > 2 {
            let invs: Vec<f32> = stats.iter().map(|s| s.1).collect();
            ctx.output(2)?.ensure::<f32>(&[n, c]).copy_from_slice(&invs);
        }
        Ok(())
    }

    /// Y gets the Relu as it is written (style transfer's InstanceNorm -> Relu).
    fn fuse_relu(&mut self) -> bool {
        self.relu = true;
        true
    }
}

fn create_instance_norm(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(InstanceNorm {
        eps: init.args.float("epsilon", 1e-5)?,
        nhwc: nhwc(init)?,
        relu: false,
    }))
}

/// InstanceNormGradient: inputs X, scale, bias, dY and, when all six are given, the saved
/// mean and inverse std (`[N, C]`; otherwise recomputed from X with `epsilon`); outputs dX,
/// dscale, dbias.
struct InstanceNormGradient {
    eps: f32,
    nhwc: bool,
}

/// The coefficients of `dX = c1 dY + c2 X + c3` of one instance, and its contributions to
/// dscale and dbias, from `ds = sum(dY X)`, `db = sum(dY)` over its `m` values.
fn instance_grad_coefs(ds: f64, db: f64, mean: f32, rstd: f32, scale: f32, m: f32) -> [f32; 5] {
    let (ds, db) = (ds as f32, db as f32);
    // Sum of dY * x_hat over the instance.
    let dxhat = (ds - mean * db) * rstd;
    let c1 = scale * rstd;
    let c2 = -c1 * rstd * dxhat / m;
    let c3 = -c2 * mean - c1 * db / m;
    [c1, c2, c3, dxhat, db]
}

impl Operator for InstanceNormGradient {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let shape = layout(&dims, self.nhwc)?;
        let (n, c, inner) = shape;
        let scale = channel_vec(ctx, 1, c)?;
        channel_vec(ctx, 2, c)?;
        let dy_dims = ctx.input(3)?.dims();
        if dy_dims != dims.as_slice() {
            bail!(ShapeMismatch: "dY has shape {dy_dims:?}, expected X's shape {dims:?}");
        }
        let x = ctx.input(0)?.as_slice::<f32>()?;
        let dy = ctx.input(3)?.as_slice::<f32>()?;
        let stats = if ctx.num_inputs() >= 6 {
            let saved = |i: usize| -> Result<&[f32]> {
                let v = ctx.input(i)?.as_slice::<f32>()?;
                if v.len() != n * c {
                    bail!(
                        ShapeMismatch: "input {i} ('{}') has {} values, expected N * C = {}",
                        ctx.input_name(i),
                        v.len(),
                        n * c
                    );
                }
                Ok(v)
            };
            let (means, invs) = (saved(4)?, saved(5)?);
            let mut out = try_vec(n * c, (0f32, 0f32), "InstanceNorm statistics")?;
            for ((o, &m), &i) in out.iter_mut().zip(means).zip(invs) {
                *o = (m, i);
            }
            out
        } else {
            instance_stats(x, shape, self.nhwc, self.eps)?
        };
        let mut dx = try_vec(x.len(), 0f32, "InstanceNormGradient dX")?;
        // Per instance: (sum of dY * x_hat, sum of dY), summed over the images below.
        let mut parts = try_vec(n * c, (0f32, 0f32), "InstanceNormGradient sums")?;
        let m = inner.max(1) as f32;
        let (unit, sunit) = if self.nhwc {
            (inner * c, c)
        } else {
            (inner, 1)
        };
        if unit > 0 && !dx.is_empty() {
            let groups = dx.len() / unit;
            let per = part_len(groups, dx.len().saturating_mul(3));
            let items: Vec<_> = dx
                .chunks_mut(per * unit)
                .zip(parts.chunks_mut(per * sunit))
                .enumerate()
                .collect();
            let nhwc = self.nhwc;
            for_each_part(items, &|(i, (dxc, pc))| {
                let first = i * per;
                let span = first * unit..first * unit + dxc.len();
                let (xs, gs) = (&x[span.clone()], &dy[span]);
                if !nhwc {
                    let it = dxc
                        .chunks_mut(inner)
                        .zip(xs.chunks(inner))
                        .zip(gs.chunks(inner));
                    for (k, ((dp, xp), gp)) in it.enumerate() {
                        let plane = first + k;
                        let (ds, db) = dot_sum_f64(xp, gp);
                        let (mean, rstd) = stats[plane];
                        let [c1, c2, c3, dxhat, db] =
                            instance_grad_coefs(ds, db, mean, rstd, scale[plane % c], m);
                        pc[k] = (dxhat, db);
                        for ((d, &g), &v) in dp.iter_mut().zip(gp).zip(xp) {
                            *d = c1 * g + c2 * v + c3;
                        }
                    }
                    return;
                }
                // C <= X's size.
                let mut s1 = vec![0f64; c];
                let mut s2 = vec![0f64; c];
                let mut coefs = vec![[0f32; 3]; c];
                let it = dxc
                    .chunks_mut(unit)
                    .zip(xs.chunks(unit))
                    .zip(gs.chunks(unit));
                for (k, ((di, xi), gi)) in it.enumerate() {
                    let img = first + k;
                    s1.fill(0.0);
                    s2.fill(0.0);
                    for (xp, gp) in xi.chunks_exact(c).zip(gi.chunks_exact(c)) {
                        let it = s1.iter_mut().zip(s2.iter_mut()).zip(xp).zip(gp);
                        for (((a, b), &v), &g) in it {
                            let g = f64::from(g);
                            *a += g * f64::from(v);
                            *b += g;
                        }
                    }
                    for ch in 0..c {
                        let (mean, rstd) = stats[img * c + ch];
                        let [c1, c2, c3, dxhat, db] =
                            instance_grad_coefs(s1[ch], s2[ch], mean, rstd, scale[ch], m);
                        coefs[ch] = [c1, c2, c3];
                        pc[k * c + ch] = (dxhat, db);
                    }
                    let px = di
                        .chunks_exact_mut(c)
                        .zip(xi.chunks_exact(c))
                        .zip(gi.chunks_exact(c));
                    for ((dp, xp), gp) in px {
                        for (((d, &v), &g), cf) in dp.iter_mut().zip(xp).zip(gp).zip(&coefs) {
                            *d = cf[0] * g + cf[1] * v + cf[2];
                        }
                    }
                }
            });
        } else {
            // No values: every instance has zero sums.
            for (img_ch, p) in parts.iter_mut().enumerate() {
                let (mean, rstd) = stats[img_ch];
                let [_, _, _, dxhat, db] =
                    instance_grad_coefs(0.0, 0.0, mean, rstd, scale[img_ch % c.max(1)], m);
                *p = (dxhat, db);
            }
        }
        let mut dscale = try_vec(c, 0f32, "InstanceNormGradient dscale")?;
        let mut dbias = try_vec(c, 0f32, "InstanceNormGradient dbias")?;
        for img in parts.chunks(c.max(1)) {
            for ((s, b), &(dxhat, db)) in dscale.iter_mut().zip(dbias.iter_mut()).zip(img) {
                *s += dxhat;
                *b += db;
            }
        }
        ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
        ctx.output(1)?.ensure::<f32>(&[c]).copy_from_slice(&dscale);
        ctx.output(2)?.ensure::<f32>(&[c]).copy_from_slice(&dbias);
        Ok(())
    }
}

fn create_instance_norm_gradient(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(InstanceNormGradient {
        eps: init.args.float("epsilon", 1e-5)?,
        nhwc: nhwc(init)?,
    }))
}

struct LayerNorm {
    axis: i64,
    eps: f32,
    affine: bool,
    gradient: bool,
}

impl LayerNorm {
    /// (rows, cols, stat dims) for X's dims.
    fn split(&self, dims: &[usize]) -> Result<(usize, usize, Vec<usize>)> {
        let nd = dims.len() as i64;
        let a = if self.axis < 0 {
            self.axis + nd
        } else {
            self.axis
        };
        if a < 0 || a > nd {
            bail!(BadArgument: "axis {} out of range for {dims:?}", self.axis);
        }
        let a = a as usize;
        let rows: usize = dims[..a].iter().product();
        let cols: usize = dims[a..].iter().product();
        let mut stat = dims[..a].to_vec();
        stat.push(1);
        Ok((rows, cols, stat))
    }

    fn affine_params(
        &self,
        ctx: &OpContext<'_>,
        first: usize,
        cols: usize,
    ) -> Result<Option<(Vec<f32>, Vec<f32>)>> {
        if !self.affine {
            return Ok(None);
        }
        let g = ctx.input(first)?.as_slice::<f32>()?.to_vec();
        let b = if self.gradient {
            vec![0.0; cols]
        } else {
            ctx.input(first + 1)?.as_slice::<f32>()?.to_vec()
        };
        if g.len() != cols || b.len() != cols {
            bail!(ShapeMismatch: "gamma and beta must hold {cols} values");
        }
        Ok(Some((g, b)))
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (rows, cols, stat) = self.split(&dims)?;
        let aff = self.affine_params(ctx, 1, cols)?;
        let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
        let mut means = vec![0f32; rows];
        let mut stds = vec![0f32; rows];
        {
            let y = ctx.output(0)?.ensure::<f32>(&dims);
            for r in 0..rows {
                let row = &x[r * cols..(r + 1) * cols];
                // The moments in f64: a long row summed in f32 drifts by more than 1e-5.
                let (s1, s2) = sums_f64(row);
                let m = cols.max(1) as f64;
                let mean64 = s1 / m;
                let var = (s2 / m - mean64 * mean64).max(0.0);
                let (mean, std) = (mean64 as f32, (var + f64::from(self.eps)).sqrt() as f32);
                means[r] = mean;
                stds[r] = std;
                for (j, o) in y[r * cols..(r + 1) * cols].iter_mut().enumerate() {
                    let v = (row[j] - mean) / std;
                    *o = match &aff {
                        Some((g, b)) => v * g[j] + b[j],
                        None => v,
                    };
                }
            }
        }
        if ctx.num_outputs() > 1 {
            ctx.output(1)?.ensure::<f32>(&stat).copy_from_slice(&means);
        }
        if ctx.num_outputs() > 2 {
            ctx.output(2)?.ensure::<f32>(&stat).copy_from_slice(&stds);
        }
        Ok(())
    }

    /// Inputs (dY, Y, mean, std, X[, gamma]); outputs (dX[, dgamma, dbeta]).
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(4)?.dims().to_vec();
        let (rows, cols, _) = self.split(&dims)?;
        let aff = self.affine_params(ctx, 5, cols)?;
        let g = ctx.input(0)?.as_slice::<f32>()?.to_vec();
        let x = ctx.input(4)?.as_slice::<f32>()?.to_vec();
        let mean = ctx.input(2)?.as_slice::<f32>()?.to_vec();
        let std = ctx.input(3)?.as_slice::<f32>()?.to_vec();
        if g.len() != x.len() || mean.len() != rows || std.len() != rows {
            bail!(ShapeMismatch: "LayerNormGradient: inputs disagree on shapes");
        }
        // In f64: the row sums cancel almost exactly (dX is tiny when dY is close to Y), so
        // f32 rounding would show against the result.
        let mut dx = try_vec(x.len(), 0f32, "dX")?;
        let mut dgamma = try_vec(cols, 0f64, "dgamma")?;
        let mut dbeta = try_vec(cols, 0f64, "dbeta")?;
        let mut dxhat = try_vec(cols, 0f64, "a row of dX")?;
        let m = cols.max(1) as f64;
        for r in 0..rows {
            let (mu, sd) = (f64::from(mean[r]), f64::from(std[r]));
            let mut s1 = 0.0;
            let mut s2 = 0.0;
            for j in 0..cols {
                let k = r * cols + j;
                let xhat = (f64::from(x[k]) - mu) / sd;
                let gk = f64::from(g[k]);
                dxhat[j] = match &aff {
                    Some((gm, _)) => gk * f64::from(gm[j]),
                    None => gk,
                };
                dgamma[j] += gk * xhat;
                dbeta[j] += gk;
                s1 += dxhat[j];
                s2 += dxhat[j] * xhat;
            }
            for (j, &dh) in dxhat.iter().enumerate() {
                let k = r * cols + j;
                let xhat = (f64::from(x[k]) - mu) / sd;
                dx[k] = ((dh - s1 / m - xhat * s2 / m) / sd) as f32;
            }
        }
        ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
        if aff.is_some() && ctx.num_outputs() > 2 {
            let gdims = ctx.input(5)?.dims().to_vec();
            let out = ctx.output(1)?.ensure::<f32>(&gdims);
            out.iter_mut()
                .zip(&dgamma)
                .for_each(|(o, &v)| *o = v as f32);
            let out = ctx.output(2)?.ensure::<f32>(&gdims);
            out.iter_mut().zip(&dbeta).for_each(|(o, &v)| *o = v as f32);
        }
        Ok(())
    }
}

impl Operator for LayerNorm {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            self.backward(ctx)
        } else {
            self.forward(ctx)
        }
    }
}

fn create_layer_norm(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    Ok(Box::new(LayerNorm {
        axis: init.args.int("axis", 1)?,
        eps: init.args.float("epsilon", 1e-5)?,
        affine: init.args.bool("elementwise_affine", false)?,
        gradient,
    }))
}

/// `(dscale, dbias)` of SpatialBN's gradient: per channel, `sum(dY * (X - mean)) * inv_std`
/// and `sum(dY)`, summed in f64 ([`channel_sums`]).
fn backprop_stats(
    x: &[f32],
    g: &[f32],
    mean: &[f32],
    inv: &[f32],
    dims: (usize, usize, usize),
    nhwc: bool,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (sgx, sg) = channel_sums(x, g, dims, nhwc, false)?;
    let dscale = (0..dims.1)
        .map(|ch| ((sgx[ch] - f64::from(mean[ch]) * sg[ch]) * f64::from(inv[ch])) as f32)
        .collect();
    let dbias = sg.iter().map(|&v| v as f32).collect();
    Ok((dscale, dbias))
}

/// `y = x * a[channel] + b[channel]` over the whole tensor, in parallel parts.
fn channel_affine(
    x: &[f32],
    y: &mut [f32],
    a: &[f32],
    b: &[f32],
    (c, inner): (usize, usize),
    nhwc: bool,
    relu: bool,
) -> Result<()> {
    if nhwc {
        if c == 0 {
            return Ok(());
        }
        // The scales and shifts repeated over whole pixels, 64 values or more, so the loop
        // over a run of pixels is long enough to vectorize (per pixel, 16 channels cost more
        // in loop overhead than in arithmetic).
        let span = c * 64usize.div_ceil(c);
        let mut ab = try_vec(2 * span, 0f32, "SpatialBN's repeated scales")?;
        let (ar, br) = ab.split_at_mut(span);
        for (k, (av, bv)) in ar.iter_mut().zip(br.iter_mut()).enumerate() {
            (*av, *bv) = (a[k % c], b[k % c]);
        }
        let (ar, br) = (&*ar, &*br);
        for_each_chunk(y, c, c.saturating_mul(2), &|first, part| {
            let xs = &x[first * c..first * c + part.len()];
            for (yp, xp) in part.chunks_mut(span).zip(xs.chunks(span)) {
                affine_run(xp, yp, ar, br, relu);
            }
        });
        return Ok(());
    }
    {
        for_each_chunk(y, inner, inner.saturating_mul(2), &|first, part| {
            let xs = &x[first * inner..first * inner + part.len()];
            for (k, (yp, xp)) in part.chunks_mut(inner).zip(xs.chunks(inner)).enumerate() {
                let ch = (first + k) % c;
                affine_plane(xp, yp, a[ch], b[ch], relu);
            }
        });
    }
    Ok(())
}

/// `y = x * a + b` (then Relu) over one NCHW plane, compiled per SIMD level (the baseline
/// x86-64 build has SSE2 only: 4 lanes).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn affine_plane(x: &[f32], y: &mut [f32], a: f32, b: f32, relu: bool) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = relu_if(relu, v * a + b);
    }
}

/// `y[i] = x[i] * a[i] + b[i]` (then Relu), compiled per SIMD level.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn affine_run(x: &[f32], y: &mut [f32], a: &[f32], b: &[f32], relu: bool) {
    for (((o, &v), &a), &b) in y.iter_mut().zip(x).zip(a).zip(b) {
        *o = relu_if(relu, v * a + b);
    }
}

/// ChannelStats: X -> (per-channel sum, per-channel sum of squares).
fn channel_stats(ctx: &mut OpContext<'_>, nhwc: bool) -> Result<()> {
    let dims = ctx.input(0)?.dims().to_vec();
    let (n, c, inner) = layout(&dims, nhwc)?;
    let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
    let mut s1 = vec![0f32; c];
    let mut s2 = vec![0f32; c];
    for img in 0..n {
        for ch in 0..c {
            for s in 0..inner {
                let v = x[at(nhwc, c, inner, img, ch, s)];
                s1[ch] += v;
                s2[ch] += v * v;
            }
        }
    }
    ctx.output(0)?.ensure::<f32>(&[c]).copy_from_slice(&s1);
    ctx.output(1)?.ensure::<f32>(&[c]).copy_from_slice(&s2);
    Ok(())
}

/// ChannelBackpropStats: (X, saved_mean, saved_inv_std, dY) -> (dscale, dbias).
fn channel_backprop_stats(ctx: &mut OpContext<'_>, nhwc: bool) -> Result<()> {
    let dims = ctx.input(0)?.dims().to_vec();
    let (n, c, inner) = layout(&dims, nhwc)?;
    let mean = channel_vec(ctx, 1, c)?;
    let inv = channel_vec(ctx, 2, c)?;
    let x = ctx.input(0)?.as_slice::<f32>()?;
    let g = ctx.input(3)?.as_slice::<f32>()?;
    if g.len() != x.len() {
        bail!(ShapeMismatch: "dY must have the shape of X");
    }
    let (ds, db) = backprop_stats(x, g, &mean, &inv, (n, c, inner), nhwc)?;
    ctx.output(0)?.ensure::<f32>(&[c]).copy_from_slice(&ds);
    ctx.output(1)?.ensure::<f32>(&[c]).copy_from_slice(&db);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn lrn_op(ty: &str, ins: &[&str], outs: &[&str], order: &str) -> OperatorDef {
        let mut op = OperatorDef::new(ty, ins.iter().copied(), outs.iter().copied());
        let arg = |name: &str| Argument {
            name: Some(name.into()),
            ..Default::default()
        };
        op.arg.push(Argument {
            i: Some(3),
            ..arg("size")
        });
        op.arg.push(Argument {
            f: Some(3.0),
            ..arg("alpha")
        });
        op.arg.push(Argument {
            f: Some(1.0),
            ..arg("beta")
        });
        op.arg.push(Argument {
            s: Some(order.as_bytes().to_vec()),
            ..arg("order")
        });
        op
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    /// size 3, alpha / size = 1, beta 1, bias 1 and X = [1, 2, 0] over three channels: the
    /// scales are 1 + [1 + 4, 1 + 4 + 0, 4 + 0] = [6, 6, 5]; with dY = 1 the derivative of
    /// sum(Y) = 1/6 + 2/6 + 0 works out by hand to [0, -1/6, 1/5].
    #[test]
    fn lrn_gradient_matches_hand_derivative() {
        for (order, dims) in [("NCHW", [1usize, 3, 1, 1]), ("NHWC", [1, 1, 1, 3])] {
            let ws = Workspace::new();
            ws.feed(
                "X",
                Tensor::from_vec(&dims, vec![1.0f32, 2.0, 0.0]).unwrap(),
            );
            ws.run_operator_once(&lrn_op("LRN", &["X"], &["Y", "S"], order))
                .unwrap();
            let y = ws.fetch("Y").unwrap();
            close(y.as_slice::<f32>().unwrap(), &[1.0 / 6.0, 2.0 / 6.0, 0.0]);
            close(
                ws.fetch("S").unwrap().as_slice::<f32>().unwrap(),
                &[6.0, 6.0, 5.0],
            );
            ws.feed("dY", Tensor::from_vec(&dims, vec![1.0f32; 3]).unwrap());
            let g = lrn_op("LRNGradient", &["X", "Y", "dY"], &["dX"], order);
            ws.run_operator_once(&g).unwrap();
            let dx = ws.fetch("dX").unwrap();
            assert_eq!(dx.dims(), &dims);
            close(dx.as_slice::<f32>().unwrap(), &[0.0, -1.0 / 6.0, 0.2]);
        }
    }

    #[test]
    fn lrn_gradient_checks_shapes() {
        let ws = Workspace::new();
        ws.feed(
            "X",
            Tensor::from_vec(&[1, 3, 1, 1], vec![1.0f32; 3]).unwrap(),
        );
        ws.feed(
            "dY",
            Tensor::from_vec(&[1, 2, 1, 1], vec![1.0f32; 2]).unwrap(),
        );
        let g = lrn_op("LRNGradient", &["X", "X", "dY"], &["dX"], "NCHW");
        let e = ws.run_operator_once(&g).unwrap_err().to_string();
        assert!(e.contains("'dY'"), "{e}");
    }
}
