//! Normalisation: SpatialBN (inference with `is_test`, and training with running statistics)
//! and its gradient, LRN (cross-channel) — NCHW or NHWC.

use crate::error::{Error, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("SpatialBN", |i| create_bn(i, false));
    r.cpu("SpatialBNGradient", |i| create_bn(i, true));
    r.cpu("LRN", create_lrn);
}

fn rt(msg: impl std::fmt::Display) -> Error {
    Error::Runtime(msg.to_string())
}

/// (n, c, inner) and whether channels are last.
fn layout(dims: &[usize], nhwc: bool) -> Result<(usize, usize, usize)> {
    if dims.len() < 2 {
        return Err(rt(format!("expected at least 2 dimensions, got {dims:?}")));
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
    eps: f32,
    momentum: f32,
    is_test: bool,
    nhwc: bool,
    gradient: bool,
}

fn channel_vec(ctx: &OpContext<'_>, i: usize, c: usize) -> Result<Vec<f32>> {
    let v = ctx.input(i)?.as_slice::<f32>()?;
    if v.len() != c {
        return Err(rt(format!(
            "input {i} ('{}') has {} values, expected C = {c}",
            ctx.input_name(i),
            v.len()
        )));
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
                return Err(rt("SpatialBN in training mode needs 5 outputs"));
            }
            let mut rm = channel_vec(ctx, 3, c)?;
            let mut rv = channel_vec(ctx, 4, c)?;
            for ch in 0..c {
                rm[ch] = rm[ch] * self.momentum + mean[ch] * (1.0 - self.momentum);
                rv[ch] = rv[ch] * self.momentum + var[ch] * (1.0 - self.momentum);
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
            return Err(rt("dY must have the shape of X"));
        }
        let m = (n * inner) as f32;
        let mut dscale = vec![0f32; c];
        let mut dbias = vec![0f32; c];
        for img in 0..n {
            for ch in 0..c {
                for s in 0..inner {
                    let k = at(self.nhwc, c, inner, img, ch, s);
                    dbias[ch] += g[k];
                    dscale[ch] += g[k] * (x[k] - mean[ch]) * inv[ch];
                }
            }
        }
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
        ctx.output(1)?.ensure::<f32>(&[c]).copy_from_slice(&dscale);
        ctx.output(2)?.ensure::<f32>(&[c]).copy_from_slice(&dbias);
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
        other => Err(init.err(format!("Unknown storage order: {other}"))),
    }
}

fn create_bn(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    if init.args.int("num_batches", 1)? != 1 {
        return Err(init.err("SpatialBN with num_batches != 1 is not supported"));
    }
    Ok(Box::new(SpatialBn {
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

impl Operator for Lrn {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dims = ctx.input(0)?.dims().to_vec();
        let (n, c, inner) = layout(&dims, self.nhwc)?;
        let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
        let pre = (self.size - 1) / 2;
        let a = self.alpha / self.size as f32;
        let mut scale = vec![0f32; x.len()];
        for img in 0..n {
            for s in 0..inner {
                for ch in 0..c {
                    let lo = ch.saturating_sub(pre);
                    let hi = (ch + self.size - pre).min(c);
                    let sum: f32 = (lo..hi)
                        .map(|j| {
                            let v = x[at(self.nhwc, c, inner, img, j, s)];
                            v * v
                        })
                        .sum();
                    scale[at(self.nhwc, c, inner, img, ch, s)] = self.bias + a * sum;
                }
            }
        }
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
}

fn create_lrn(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let size = init.args.usize("size", 0)?;
    if size == 0 || size % 2 == 0 {
        return Err(init.err(format!("LRN size must be odd and positive, got {size}")));
    }
    Ok(Box::new(Lrn {
        size,
        alpha: init.args.float("alpha", 0.0)?,
        beta: init.args.float("beta", 0.0)?,
        bias: init.args.float("bias", 1.0)?,
        nhwc: nhwc(init)?,
    }))
}
