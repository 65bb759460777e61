//! Normalisation: SpatialBN (inference with `is_test`, and training with running statistics)
//! and its gradient, LRN (cross-channel) and its gradient, InstanceNorm and its gradient,
//! LayerNorm and its gradient — NCHW or NHWC where it applies.

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

impl SpatialBn {
    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, self.nhwc)?;
        let scale = channel_vec(ctx, 1, c)?;
        let bias = channel_vec(ctx, 2, c)?;
        let m = (n * inner) as f32;
        let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
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
            let mut mean = vec![0f64; c];
            let mut sq = vec![0f64; c];
            for img in 0..n {
                for ch in 0..c {
                    for s in 0..inner {
                        let v = x[at(self.nhwc, c, inner, img, ch, s)] as f64;
                        mean[ch] += v;
                        sq[ch] += v * v;
                    }
                }
            }
            let mean: Vec<f32> = mean
                .iter()
                .map(|s| (s / m.max(1.0) as f64) as f32)
                .collect();
            let var: Vec<f32> = sq
                .iter()
                .zip(&mean)
                .map(|(s, &mu)| ((s / m.max(1.0) as f64) as f32 - mu * mu).max(0.0))
                .collect();
            (mean, var)
        };
        let inv: Vec<f32> = var.iter().map(|v| 1.0 / (v + self.eps).sqrt()).collect();
        {
            let y = ctx.output(0)?.ensure::<f32>(&dims);
            for img in 0..n {
                for ch in 0..c {
                    let (a, b) = (
                        scale[ch] * inv[ch],
                        bias[ch] - mean[ch] * scale[ch] * inv[ch],
                    );
                    for s in 0..inner {
                        let k = at(self.nhwc, c, inner, img, ch, s);
                        y[k] = x[k] * a + b;
                    }
                }
            }
        }
        if !self.is_test {
            if ctx.num_outputs() < 5 {
                bail!(Schema: "SpatialBN in training mode needs 5 outputs");
            }
            let mut rm = channel_vec(ctx, 3, c)?;
            let mut rv = channel_vec(ctx, 4, c)?;
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

    /// Inputs (X, scale, dY, saved_mean, saved_inv_std); outputs (dX, dscale, dbias).
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, self.nhwc)?;
        let scale = channel_vec(ctx, 1, c)?;
        let mean = channel_vec(ctx, 3, c)?;
        let inv = channel_vec(ctx, 4, c)?;
        let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
        let g = ctx.input(2)?.as_slice::<f32>()?.to_vec();
        if g.len() != x.len() {
            bail!(ShapeMismatch: "dY must have the shape of X");
        }
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
            backprop_stats(&x, &g, &mean, &inv, n, c, inner, self.nhwc)
        };
        {
            let dx = ctx.output(0)?.ensure::<f32>(&dims);
            for img in 0..n {
                for ch in 0..c {
                    let f = scale[ch] * inv[ch] / m.max(1.0);
                    for s in 0..inner {
                        let k = at(self.nhwc, c, inner, img, ch, s);
                        let xhat = (x[k] - mean[ch]) * inv[ch];
                        dx[k] = f * (m * g[k] - dbias[ch] - xhat * dscale[ch]);
                    }
                }
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
    }))
}

struct Lrn {
    size: usize,
    alpha: f32,
    beta: f32,
    bias: f32,
    nhwc: bool,
}

impl Lrn {
    /// `bias + alpha / size * (sum of squares over the channel window)` at every element.
    fn scale(&self, x: &[f32], n: usize, c: usize, inner: usize) -> Vec<f32> {
        let a = self.alpha / self.size as f32;
        let mut scale = vec![0f32; x.len()];
        self.for_windows(n, c, inner, |k, window| {
            let sum: f32 = window.map(|j| x[j] * x[j]).sum();
            scale[k] = self.bias + a * sum;
        });
        scale
    }

    /// Calls `f(element, indices of its channel window)` for every element: the window of
    /// channel `ch` spans channels `ch - (size - 1) / 2 ..= ch + (size - 1) / 2`, clipped.
    fn for_windows(
        &self,
        n: usize,
        c: usize,
        inner: usize,
        mut f: impl FnMut(usize, &mut dyn Iterator<Item = usize>),
    ) {
        let pre = (self.size - 1) / 2;
        for img in 0..n {
            for s in 0..inner {
                for ch in 0..c {
                    let lo = ch.saturating_sub(pre);
                    let hi = (ch + self.size - pre).min(c);
                    let mut window = (lo..hi).map(|j| at(self.nhwc, c, inner, img, j, s));
                    f(at(self.nhwc, c, inner, img, ch, s), &mut window);
                }
            }
        }
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, self.nhwc)?;
        let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
        let scale = self.scale(&x, n, c, inner);
        {
            let y = ctx.output(0)?.ensure::<f32>(&dims);
            for ((o, &v), &sc) in y.iter_mut().zip(&x).zip(&scale) {
                *o = v * sc.powf(-self.beta);
            }
        }
        if ctx.num_outputs() > 1 {
            ctx.output(1)?.ensure::<f32>(&dims).copy_from_slice(&scale);
        }
        Ok(())
    }

    /// Inputs X, Y, dY; output dX. With `s` the scale, `Y = X s^-beta` gives
    /// `dX_c = dY_c s_c^-beta - 2 alpha beta / size * X_c * sum_{j in window(c)} dY_j Y_j / s_j`
    /// (the windows are symmetric, so c is in window(j) exactly when j is in window(c)).
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, self.nhwc)?;
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
        let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
        let scale = self.scale(&x, n, c, inner);
        let ratio: Vec<f32> = {
            let y = ctx.input(1)?.as_slice::<f32>()?;
            let dy = ctx.input(2)?.as_slice::<f32>()?;
            (0..x.len()).map(|k| dy[k] * y[k] / scale[k]).collect()
        };
        let dy = ctx.input(2)?.as_slice::<f32>()?.to_vec();
        let cache_ratio = 2.0 * self.alpha * self.beta / self.size as f32;
        let mut dx = vec![0f32; x.len()];
        self.for_windows(n, c, inner, |k, window| {
            let acc: f32 = window.map(|j| ratio[j]).sum();
            dx[k] = dy[k] * scale[k].powf(-self.beta) - cache_ratio * x[k] * acc;
        });
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
}

impl Operator for InstanceNorm {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, self.nhwc)?;
        let scale = channel_vec(ctx, 1, c)?;
        let bias = channel_vec(ctx, 2, c)?;
        let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
        let mut means = vec![0f32; n * c];
        let mut invs = vec![0f32; n * c];
        {
            let y = ctx.output(0)?.ensure::<f32>(&dims);
            for img in 0..n {
                for ch in 0..c {
                    let (mut s1, mut s2) = (0f64, 0f64);
                    for s in 0..inner {
                        let v = x[at(self.nhwc, c, inner, img, ch, s)] as f64;
                        s1 += v;
                        s2 += v * v;
                    }
                    let m = inner.max(1) as f64;
                    let mean = (s1 / m) as f32;
                    let var = ((s2 / m) as f32 - mean * mean).max(0.0);
                    let inv = 1.0 / (var + self.eps).sqrt();
                    means[img * c + ch] = mean;
                    invs[img * c + ch] = inv;
                    for s in 0..inner {
                        let k = at(self.nhwc, c, inner, img, ch, s);
                        y[k] = (x[k] - mean) * inv * scale[ch] + bias[ch];
                    }
                }
            }
        }
        if ctx.num_outputs() > 1 {
            ctx.output(1)?
                .ensure::<f32>(&[n, c])
                .copy_from_slice(&means);
        }
        if ctx.num_outputs() > 2 {
            ctx.output(2)?.ensure::<f32>(&[n, c]).copy_from_slice(&invs);
        }
        Ok(())
    }
}

fn create_instance_norm(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(InstanceNorm {
        eps: init.args.float("epsilon", 1e-5)?,
        nhwc: nhwc(init)?,
    }))
}

/// Mean and inverse standard deviation of every (image, channel) of `x`, as InstanceNorm
/// computes them.
fn instance_moments(
    x: &[f32],
    (n, c, inner): (usize, usize, usize),
    nhwc: bool,
    eps: f32,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut means = try_vec(n * c, 0f32, "InstanceNorm means")?;
    let mut invs = try_vec(n * c, 0f32, "InstanceNorm inverse std")?;
    for img in 0..n {
        for ch in 0..c {
            let (mut s1, mut s2) = (0f64, 0f64);
            for s in 0..inner {
                let v = x[at(nhwc, c, inner, img, ch, s)] as f64;
                s1 += v;
                s2 += v * v;
            }
            let m = inner.max(1) as f64;
            let mean = (s1 / m) as f32;
            let var = ((s2 / m) as f32 - mean * mean).max(0.0);
            means[img * c + ch] = mean;
            invs[img * c + ch] = 1.0 / (var + eps).sqrt();
        }
    }
    Ok((means, invs))
}

/// InstanceNormGradient: inputs X, scale, bias, dY and, when all six are given, the saved
/// mean and inverse std (`[N, C]`; otherwise recomputed from X with `epsilon`); outputs dX,
/// dscale, dbias.
struct InstanceNormGradient {
    eps: f32,
    nhwc: bool,
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
        let (means, invs) = if ctx.num_inputs() >= 6 {
            let saved = |i: usize| -> Result<Vec<f32>> {
                let v = ctx.input(i)?.as_slice::<f32>()?;
                if v.len() != n * c {
                    bail!(
                        ShapeMismatch: "input {i} ('{}') has {} values, expected N * C = {}",
                        ctx.input_name(i),
                        v.len(),
                        n * c
                    );
                }
                let mut out = try_vec(v.len(), 0f32, "InstanceNorm statistics")?;
                out.copy_from_slice(v);
                Ok(out)
            };
            (saved(4)?, saved(5)?)
        } else {
            instance_moments(x, shape, self.nhwc, self.eps)?
        };
        let mut dx = try_vec(x.len(), 0f32, "InstanceNormGradient dX")?;
        let mut dscale = try_vec(c, 0f32, "InstanceNormGradient dscale")?;
        let mut dbias = try_vec(c, 0f32, "InstanceNormGradient dbias")?;
        let m = inner.max(1) as f32;
        for img in 0..n {
            for ch in 0..c {
                let (mut ds, mut db) = (0f64, 0f64);
                for s in 0..inner {
                    let k = at(self.nhwc, c, inner, img, ch, s);
                    ds += f64::from(dy[k]) * f64::from(x[k]);
                    db += f64::from(dy[k]);
                }
                let (ds, db) = (ds as f32, db as f32);
                let (mean, rstd) = (means[img * c + ch], invs[img * c + ch]);
                // Sum of dY * x_hat over the plane.
                let dxhat = (ds - mean * db) * rstd;
                dscale[ch] += dxhat;
                dbias[ch] += db;
                let c1 = scale[ch] * rstd;
                let c2 = -c1 * rstd * dxhat / m;
                let c3 = -c2 * mean - c1 * db / m;
                for s in 0..inner {
                    let k = at(self.nhwc, c, inner, img, ch, s);
                    dx[k] = c1 * dy[k] + c2 * x[k] + c3;
                }
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
                let m = cols.max(1) as f32;
                let mean = row.iter().sum::<f32>() / m;
                let var = (row.iter().map(|v| v * v).sum::<f32>() / m - mean * mean).max(0.0);
                let std = (var + self.eps).sqrt();
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
        let mut dx = vec![0f32; x.len()];
        let mut dgamma = vec![0f32; cols];
        let mut dbeta = vec![0f32; cols];
        let m = cols.max(1) as f32;
        for r in 0..rows {
            let (mu, sd) = (mean[r], std[r]);
            let mut s1 = 0.0;
            let mut s2 = 0.0;
            let mut dxhat = vec![0f32; cols];
            for j in 0..cols {
                let k = r * cols + j;
                let xhat = (x[k] - mu) / sd;
                dxhat[j] = match &aff {
                    Some((gm, _)) => g[k] * gm[j],
                    None => g[k],
                };
                dgamma[j] += g[k] * xhat;
                dbeta[j] += g[k];
                s1 += dxhat[j];
                s2 += dxhat[j] * xhat;
            }
            for (j, &dh) in dxhat.iter().enumerate() {
                let k = r * cols + j;
                let xhat = (x[k] - mu) / sd;
                dx[k] = (dh - s1 / m - xhat * s2 / m) / sd;
            }
        }
        ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
        if aff.is_some() && ctx.num_outputs() > 2 {
            let gdims = ctx.input(5)?.dims().to_vec();
            ctx.output(1)?
                .ensure::<f32>(&gdims)
                .copy_from_slice(&dgamma);
            ctx.output(2)?.ensure::<f32>(&gdims).copy_from_slice(&dbeta);
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

/// Per-channel `(sum(dY * (X - mean) * inv_std), sum(dY))`.
#[allow(clippy::too_many_arguments)]
fn backprop_stats(
    x: &[f32],
    g: &[f32],
    mean: &[f32],
    inv: &[f32],
    n: usize,
    c: usize,
    inner: usize,
    nhwc: bool,
) -> (Vec<f32>, Vec<f32>) {
    let mut dscale = vec![0f32; c];
    let mut dbias = vec![0f32; c];
    for img in 0..n {
        for ch in 0..c {
            for s in 0..inner {
                let k = at(nhwc, c, inner, img, ch, s);
                dbias[ch] += g[k];
                dscale[ch] += g[k] * (x[k] - mean[ch]) * inv[ch];
            }
        }
    }
    (dscale, dbias)
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
    let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
    let g = ctx.input(3)?.as_slice::<f32>()?.to_vec();
    if g.len() != x.len() {
        bail!(ShapeMismatch: "dY must have the shape of X");
    }
    let (ds, db) = backprop_stats(&x, &g, &mean, &inv, n, c, inner, nhwc);
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
