//! Softmax, losses and Dropout: Softmax, SoftmaxWithLoss, LabelCrossEntropy, CrossEntropy,
//! AveragedLoss, Accuracy, Dropout, and their gradient ops.

use super::rng::Rng;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::Tensor;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Softmax", |i| {
        let axis = i.args.int("axis", 1)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            softmax_op(ctx, axis)
        })))
    });
    r.cpu("SoftmaxGradient", |i| {
        let axis = i.args.int("axis", 1)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            softmax_grad(ctx, axis)
        })))
    });
    r.cpu("SoftmaxWithLoss", |i| create_swl(i, false));
    r.cpu("SoftmaxWithLossGradient", |i| create_swl(i, true));
    r.cpu("LabelCrossEntropy", |_| Ok(Box::new(FnOp(label_xent))));
    r.cpu("LabelCrossEntropyGradient", |_| {
        Ok(Box::new(FnOp(label_xent_grad)))
    });
    r.cpu("CrossEntropy", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| xent(c, false))))
    });
    r.cpu("CrossEntropyGradient", |_| {
        Ok(Box::new(FnOp(|c: &mut OpContext<'_>| xent(c, true))))
    });
    r.cpu("AveragedLoss", |_| Ok(Box::new(FnOp(averaged_loss))));
    r.cpu("AveragedLossGradient", |_| {
        Ok(Box::new(FnOp(averaged_loss_grad)))
    });
    r.cpu("Accuracy", |i| {
        let k = i.args.usize("top_k", 1)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            accuracy(ctx, k)
        })))
    });
    r.cpu("Dropout", create_dropout);
    r.cpu("DropoutGrad", create_dropout_grad);
}

const LOG_THRESHOLD: f32 = 1e-20;

/// (N, D) of `t` flattened at `axis`.
fn flat2(t: &Tensor, axis: i64) -> Result<(usize, usize)> {
    let nd = t.ndim() as i64;
    let a = if axis < 0 { axis + nd } else { axis };
    if a < 0 || a >= nd.max(1) {
        bail!(BadArgument: "axis_index < ndims: axis {axis} for a tensor of {nd} dimensions");
    }
    Ok((t.size_to_dim(a as usize), t.size_from_dim(a as usize)))
}

/// Lanes of the row sweeps below (a vector of f32 on AVX2).
const LANES: usize = 8;

/// `y = softmax(x)` over each row of `d` values: `e^(x - max)` through the polynomial
/// [`super::rnn_units::exp`] (within 2 ulp; 0 below `e^-87`, where libm gives a subnormal),
/// over the sum of the row's values taken in 8 interleaved partial sums. Compiled per SIMD
/// level: the rows vectorize, where `f32::exp` is a library call per value (a 64-value row
/// took 3.5 us).
///
/// Rows of at most [`SHORT`] values (a batch of class scores) go [`LANES`] at a time with
/// one row per lane: along a row of 8 the work is a chain of dependent steps in one vector
/// (the max, the exponential's polynomial, the sum), about 100 cycles a row; across rows the
/// lanes are independent. Both ways compute the same steps in the same order, so a row gets
/// the same bits whichever way it goes.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn softmax_rows(x: &[f32], y: &mut [f32], d: usize) {
    let d = d.max(1);
    let mut done = 0;
    if d <= SHORT {
        let group = LANES * d;
        for (xg, yg) in x.chunks_exact(group).zip(y.chunks_exact_mut(group)) {
            softmax_group(xg, yg, d);
        }
        done = x.len() / group * group;
    }
    for (xr, yr) in x[done..].chunks(d).zip(y[done..].chunks_mut(d)) {
        softmax_row(xr, yr);
    }
}

/// The longest rows [`softmax_rows`] takes [`LANES`] at a time.
const SHORT: usize = 2 * LANES;

/// `e^(v - m)`, 0 below `e^-87`.
#[inline(always)]
fn exp_shifted(v: f32, m: f32) -> f32 {
    let t = v - m;
    let e = super::rnn_units::exp(t);
    if t < -87.0 {
        0.0
    } else {
        e
    }
}

/// One row of [`softmax_rows`].
#[inline(always)]
fn softmax_row(xr: &[f32], yr: &mut [f32]) {
    // The largest value (NaNs skipped, as f32::max does), lane by lane.
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut vals = xr.chunks_exact(LANES);
    for c in &mut vals {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = if v > *l { v } else { *l };
        }
    }
    let m = vals
        .remainder()
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for (o, &v) in yr.iter_mut().zip(xr) {
        *o = exp_shifted(v, m);
    }
    let mut sums = [0f32; LANES];
    let mut outs = yr.chunks_exact(LANES);
    for c in &mut outs {
        for (s, &v) in sums.iter_mut().zip(c) {
            *s += v;
        }
    }
    let s = outs.remainder().iter().sum::<f32>() + sums.iter().sum::<f32>();
    for o in yr.iter_mut() {
        *o /= s;
    }
}

/// [`LANES`] rows of `d <= SHORT` values (`x` and `y` hold `LANES * d`), one row per lane,
/// with [`softmax_row`]'s steps in its order: the max, the exponentials, the sum of the
/// values past the last whole vector, plus the sum of the 8 partial sums (value `j` of a row
/// goes to partial sum `j % 8`).
#[inline(always)]
fn softmax_group(x: &[f32], y: &mut [f32], d: usize) {
    // t[j][r]: value j of row r.
    let mut t = [[0f32; LANES]; SHORT];
    for (r, xr) in x.chunks_exact(d).enumerate() {
        for (j, &v) in xr.iter().enumerate() {
            t[j][r] = v;
        }
    }
    let whole = d / LANES * LANES;
    let mut m = [f32::NEG_INFINITY; LANES];
    for tj in &t[..d] {
        for r in 0..LANES {
            m[r] = if tj[r] > m[r] { tj[r] } else { m[r] };
        }
    }
    for tj in t[..d].iter_mut() {
        for r in 0..LANES {
            tj[r] = exp_shifted(tj[r], m[r]);
        }
    }
    // The partial sums of the whole vectors (one when d >= 8, at most two vectors deep).
    let mut sums = [[0f32; LANES]; LANES];
    for (j, tj) in t[..whole].iter().enumerate() {
        for r in 0..LANES {
            sums[j % LANES][r] += tj[r];
        }
    }
    let mut s = [0f32; LANES];
    for tj in &t[whole..d] {
        for r in 0..LANES {
            s[r] += tj[r];
        }
    }
    let mut total = [0f32; LANES];
    if whole > 0 {
        for sj in &sums {
            for r in 0..LANES {
                total[r] += sj[r];
            }
        }
    }
    for r in 0..LANES {
        s[r] += total[r];
    }
    for tj in t[..d].iter_mut() {
        for r in 0..LANES {
            tj[r] /= s[r];
        }
    }
    for (r, yr) in y.chunks_exact_mut(d).enumerate() {
        for (j, o) in yr.iter_mut().enumerate() {
            *o = t[j][r];
        }
    }
}

fn softmax_op(ctx: &mut OpContext<'_>, axis: i64) -> Result<()> {
    if ctx.is_inplace(0, 0) {
        let t = ctx.output(0)?;
        let (_, d) = flat2(t, axis)?;
        let x = t.as_slice::<f32>()?.to_vec();
        softmax_rows(&x, t.as_mut_slice::<f32>()?, d);
        return Ok(());
    }
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let (_, d) = flat2(x, axis)?;
    let dims = x.dims().to_vec();
    softmax_rows(
        x.as_slice::<f32>()?,
        outs.tensor(0)?.ensure::<f32>(&dims),
        d,
    );
    Ok(())
}

fn softmax_grad(ctx: &mut OpContext<'_>, axis: i64) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let y = ins.tensor(0)?;
    let dy = ins.tensor(1)?;
    if y.dims() != dy.dims() {
        bail!(ShapeMismatch: "Y and dY must have the same shape");
    }
    let (_, d) = flat2(y, axis)?;
    let dims = y.dims().to_vec();
    let (ys, dys) = (y.as_slice::<f32>()?, dy.as_slice::<f32>()?);
    let dx = outs.tensor(0)?.ensure::<f32>(&dims);
    for ((yr, gr), xr) in ys
        .chunks(d.max(1))
        .zip(dys.chunks(d.max(1)))
        .zip(dx.chunks_mut(d.max(1)))
    {
        let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
        for ((o, &yv), &gv) in xr.iter_mut().zip(yr).zip(gr) {
            *o = yv * (gv - dot);
        }
    }
    Ok(())
}

fn labels(t: &Tensor, n: usize, d: usize) -> Result<Vec<usize>> {
    let v = t.to_i64_vec()?;
    if v.len() != n {
        bail!(ShapeMismatch: "label has {} values, expected N = {n}", v.len());
    }
    v.into_iter()
        .map(|l| {
            usize::try_from(l).ok().filter(|&u| u < d).ok_or_else(|| {
                err!(
                    BadArgument: "Label seems to be outside of supported range. Supported labels \
                     are in range [0,{d}), got {l}"
                )
            })
        })
        .collect()
}

struct SoftmaxWithLoss {
    scale: f32,
    label_prob: bool,
    axis: i64,
    gradient: bool,
}

impl SoftmaxWithLoss {
    fn weights(
        &self,
        ins: &crate::ops::operator::Inputs<'_, '_>,
        n: usize,
        has_w: bool,
    ) -> Result<Vec<f32>> {
        if !has_w {
            return Ok(vec![1.0; n]);
        }
        let w = ins.tensor(2)?.as_slice::<f32>()?;
        if w.len() != n {
            bail!(ShapeMismatch: "weights have {} values, expected {n}", w.len());
        }
        Ok(w.to_vec())
    }
}

impl Operator for SoftmaxWithLoss {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let n_in = ctx.num_inputs();
        let has_w = if self.gradient { n_in == 5 } else { n_in == 3 };
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let (n, d) = flat2(x, self.axis)?;
        let w = self.weights(&ins, n, has_w)?;
        let lab = ins.tensor(1)?;
        let probs_target: Option<Vec<f32>> = if self.label_prob {
            let l = lab.as_slice::<f32>()?;
            if l.len() != n * d {
                bail!(ShapeMismatch: "label_prob labels must have the shape of X");
            }
            Some(l.to_vec())
        } else {
            None
        };
        let idx = if self.label_prob {
            Vec::new()
        } else {
            labels(lab, n, d)?
        };
        let total_w: f32 = w.iter().sum();
        if self.gradient {
            let p_i = if has_w { 3 } else { 2 };
            let p = ins.tensor(p_i)?.as_slice::<f32>()?;
            if p.len() != n * d {
                bail!(ShapeMismatch: "P has {} values, expected {}", p.len(), n * d);
            }
            let dl = ins.tensor(p_i + 1)?.get_f64(0)? as f32;
            let dims = x.dims().to_vec();
            let dx = outs.tensor(0)?.ensure::<f32>(&dims);
            dx.copy_from_slice(&p[..n * d]);
            for i in 0..n {
                let row = &mut dx[i * d..(i + 1) * d];
                match &probs_target {
                    Some(t) => row
                        .iter_mut()
                        .zip(&t[i * d..(i + 1) * d])
                        .for_each(|(o, &q)| *o -= q),
                    None => row[idx[i]] -= 1.0,
                }
                for o in row.iter_mut() {
                    *o *= w[i];
                }
            }
            let s = if total_w > 0.0 {
                self.scale * dl / total_w
            } else {
                0.0
            };
            for o in dx.iter_mut() {
                *o *= s;
            }
            return Ok(());
        }
        let dims = x.dims().to_vec();
        let xs = x.as_slice::<f32>()?;
        let mut loss = 0.0f32;
        {
            let p = outs.tensor(0)?.ensure::<f32>(&dims);
            softmax_rows(xs, p, d);
            for i in 0..n {
                let row = &p[i * d..(i + 1) * d];
                let l = match &probs_target {
                    Some(t) => -row
                        .iter()
                        .zip(&t[i * d..(i + 1) * d])
                        .map(|(&pv, &q)| q * pv.max(LOG_THRESHOLD).ln())
                        .sum::<f32>(),
                    None => -row[idx[i]].max(LOG_THRESHOLD).ln(),
                };
                loss += w[i] * l;
            }
        }
        let avg = if total_w > 0.0 {
            loss * self.scale / total_w
        } else {
            0.0
        };
        outs.tensor(1)?.ensure::<f32>(&[])[0] = avg;
        Ok(())
    }
}

fn create_swl(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    if init.args.bool("spatial", false)? {
        bail!(op = init, NotImplemented: "SoftmaxWithLoss with spatial=1 is not supported");
    }
    Ok(Box::new(SoftmaxWithLoss {
        scale: init.args.float("scale", 1.0)?,
        label_prob: init.args.bool("label_prob", false)?,
        axis: init.args.int("axis", 1)?,
        gradient,
    }))
}

fn nd_of(x: &Tensor) -> (usize, usize) {
    if x.ndim() == 1 {
        (1, x.numel())
    } else {
        let n = x.dims().first().copied().unwrap_or(1);
        (n, x.numel().checked_div(n).unwrap_or(0))
    }
}

fn label_xent(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let (n, d) = nd_of(x);
    let idx = labels(ins.tensor(1)?, n, d)?;
    let xs = x.as_slice::<f32>()?;
    let y = outs.tensor(0)?.ensure::<f32>(&[n]);
    for i in 0..n {
        y[i] = -xs[i * d + idx[i]].max(LOG_THRESHOLD).ln();
    }
    Ok(())
}

fn label_xent_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let (n, d) = nd_of(x);
    let idx = labels(ins.tensor(1)?, n, d)?;
    let dy = ins.tensor(2)?.as_slice::<f32>()?;
    if dy.len() != n {
        bail!(ShapeMismatch: "dY has {} values, expected {n}", dy.len());
    }
    let xs = x.as_slice::<f32>()?;
    let dims = x.dims().to_vec();
    let dx = outs.tensor(0)?.ensure::<f32>(&dims);
    dx.fill(0.0);
    for i in 0..n {
        let k = i * d + idx[i];
        dx[k] = -dy[i] / xs[k].max(LOG_THRESHOLD);
    }
    Ok(())
}

fn xent(ctx: &mut OpContext<'_>, gradient: bool) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let lab = ins.tensor(1)?;
    if lab.dims() != x.dims() {
        bail!(ShapeMismatch: "label {:?} must have the shape of X {:?}", lab.dims(), x.dims());
    }
    let (n, d) = nd_of(x);
    let (xs, ls) = (x.as_slice::<f32>()?, lab.as_slice::<f32>()?);
    if gradient {
        let dy = ins.tensor(2)?.as_slice::<f32>()?;
        if dy.len() != n {
            bail!(ShapeMismatch: "dY has {} values, expected {n}", dy.len());
        }
        let dims = x.dims().to_vec();
        let dx = outs.tensor(0)?.ensure::<f32>(&dims);
        for (k, o) in dx.iter_mut().enumerate() {
            *o = -dy[k / d.max(1)] * ls[k] / xs[k].max(LOG_THRESHOLD);
        }
        return Ok(());
    }
    let y = outs.tensor(0)?.ensure::<f32>(&[n]);
    for (i, o) in y.iter_mut().enumerate() {
        *o = -(i * d..(i + 1) * d)
            .map(|k| ls[k] * xs[k].max(LOG_THRESHOLD).ln())
            .sum::<f32>();
    }
    Ok(())
}

/// The sum of `x` in 16 interleaved partial sums (element `i` goes to sum `i % 16`), added up
/// in order at the end: a fixed order (the same bits on every machine) that vectorizes, and
/// rounds less than one running sum over many values.
fn lane_sum(x: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0f32; L];
    let chunks = x.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a += v;
    }
    acc.iter().sum()
}

fn averaged_loss(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?.as_slice::<f32>()?;
    let s = lane_sum(x);
    outs.tensor(0)?.ensure::<f32>(&[])[0] = if x.is_empty() {
        0.0
    } else {
        s / x.len() as f32
    };
    Ok(())
}

fn averaged_loss_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let g = ins.tensor(1)?.get_f64(0)? as f32;
    let dims = x.dims().to_vec();
    let n = x.numel().max(1) as f32;
    outs.tensor(0)?.ensure::<f32>(&dims).fill(g / n);
    Ok(())
}

fn accuracy(ctx: &mut OpContext<'_>, top_k: usize) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let p = ins.tensor(0)?;
    if p.ndim() != 2 {
        bail!(ShapeMismatch: "Accuracy expects 2-d predictions, got {:?}", p.dims());
    }
    let (n, d) = (p.dims()[0], p.dims()[1]);
    let idx = labels(ins.tensor(1)?, n, d)?;
    let ps = p.as_slice::<f32>()?;
    let mut correct = 0usize;
    for i in 0..n {
        let row = &ps[i * d..(i + 1) * d];
        let lp = row[idx[i]];
        let mut ngt = 1;
        for (j, &v) in row.iter().enumerate() {
            if v > lp || (v == lp && j < idx[i]) {
                ngt += 1;
                if ngt > top_k {
                    break;
                }
            }
        }
        if ngt <= top_k {
            correct += 1;
        }
    }
    outs.tensor(0)?.ensure::<f32>(&[])[0] = if n == 0 {
        0.0
    } else {
        correct as f32 / n as f32
    };
    Ok(())
}

struct Dropout {
    ratio: f32,
    is_test: bool,
    rng: Rng,
}

impl Operator for Dropout {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.is_test {
            if !ctx.is_inplace(0, 0) {
                let (ins, mut outs) = ctx.split();
                let x = ins.tensor(0)?;
                outs.tensor(0)?.copy_from(x);
            }
            return Ok(());
        }
        let scale = if self.ratio < 1.0 {
            1.0 / (1.0 - self.ratio)
        } else {
            0.0
        };
        let dims = ctx.input(0)?.dims().to_vec();
        let n: usize = dims.iter().product();
        let keep: Vec<bool> = (0..n)
            .map(|_| self.rng.uniform01() as f32 >= self.ratio)
            .collect();
        if ctx.num_outputs() > 1 {
            ctx.output(1)?.ensure::<bool>(&dims).copy_from_slice(&keep);
        }
        if !ctx.is_inplace(0, 0) {
            let (ins, mut outs) = ctx.split();
            let x = ins.tensor(0)?;
            outs.tensor(0)?.copy_from(x);
        }
        let y = ctx.output(0)?.as_mut_slice::<f32>()?;
        for (v, &k) in y.iter_mut().zip(&keep) {
            *v = if k { *v * scale } else { 0.0 };
        }
        Ok(())
    }
}

fn create_dropout(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let ratio = init.args.float("ratio", 0.5)?;
    if !(0.0..1.0).contains(&ratio) && ratio != 1.0 {
        bail!(op = init, BadArgument: "ratio must be in [0, 1], got {ratio}");
    }
    Ok(Box::new(Dropout {
        ratio,
        is_test: init.args.bool("is_test", false)?,
        rng: Rng::from_option(init.random_seed()),
    }))
}

fn create_dropout_grad(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let ratio = init.args.float("ratio", 0.5)?;
    let is_test = init.args.bool("is_test", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let scale = if ratio < 1.0 {
            1.0 / (1.0 - ratio)
        } else {
            0.0
        };
        if ctx.is_inplace(0, 0) {
            // dX is dY's blob: scale it where it is.
            if is_test {
                return Ok(());
            }
            let (ins, mut outs) = ctx.split();
            let mask = ins.tensor(1)?.as_slice::<bool>()?;
            let dx = outs.tensor(0)?.as_mut_slice::<f32>()?;
            if mask.len() != dx.len() {
                bail!(ShapeMismatch: "mask must have the shape of dY");
            }
            for (o, &k) in dx.iter_mut().zip(mask) {
                *o = if k { *o * scale } else { 0.0 };
            }
            return Ok(());
        }
        let (ins, mut outs) = ctx.split();
        let dy = ins.tensor(0)?;
        let dims = dy.dims().to_vec();
        let g = dy.as_slice::<f32>()?;
        if is_test {
            outs.tensor(0)?.ensure::<f32>(&dims).copy_from_slice(g);
            return Ok(());
        }
        let mask = ins.tensor(1)?.as_slice::<bool>()?;
        if mask.len() != g.len() {
            bail!(ShapeMismatch: "mask must have the shape of dY");
        }
        let dx = outs.tensor(0)?.ensure::<f32>(&dims);
        for ((o, &v), &k) in dx.iter_mut().zip(g).zip(mask) {
            *o = if k { v * scale } else { 0.0 };
        }
        Ok(())
    })))
}

#[cfg(test)]
mod tests {
    use super::lane_sum;

    #[test]
    fn lane_sum_adds_lanes_then_lane_totals_in_order() {
        assert_eq!(lane_sum(&[]), 0.0);
        // Up to 16 values: one per lane, so the plain sum in order.
        let few = [0.1f32, 1e8, -1e8, 0.3, 7.0];
        assert_eq!(lane_sum(&few), few.iter().sum::<f32>());
        // Element i goes to lane i % 16: 1e8 and -1e8 in one lane cancel exactly there.
        let mut x = vec![1.0f32; 40];
        x[3] = 1e8;
        x[19] = -1e8;
        assert_eq!(lane_sum(&x), 38.0);
        let many: Vec<f32> = (0..100_003)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
            .collect();
        let exact: f64 = many.iter().map(|&v| v as f64).sum();
        assert!((lane_sum(&many) as f64 - exact).abs() < 1e-6 * exact);
    }
}
