//! Row-wise distances and the spatial softmax loss, with their gradients:
//! CosineSimilarity, L1Distance (inputs X, Y of one shape; one value per row, a row being
//! everything past the first dimension) and SpatialSoftmaxWithLoss (a softmax over the
//! channels of every pixel of NCHW logits, the loss averaged over the labelled pixels,
//! label -1 meaning "ignore").

use crate::error::{try_vec, Result};
use crate::ops::operator::{FnOp, OpContext, Operator};
use crate::ops::registry::Registry;
use crate::{bail, ensure};

/// The norm products below this are clamped to it (Caffe2's `kEps`).
const COS_EPS: f64 = 1e-12;
/// L1Distance's gradient is zero where `|x - y|` is below this.
const L1_EPS: f32 = 1e-12;
/// The label of a pixel that has no loss.
const IGNORE_LABEL: i32 = -1;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("CosineSimilarity", |_| {
        op(|ctx| rowwise(ctx, false, Dist::Cosine))
    });
    r.cpu("CosineSimilarityGradient", |_| {
        op(|ctx| rowwise(ctx, true, Dist::Cosine))
    });
    r.cpu("L1Distance", |_| op(|ctx| rowwise(ctx, false, Dist::L1)));
    r.cpu("L1DistanceGradient", |_| {
        op(|ctx| rowwise(ctx, true, Dist::L1))
    });
    r.cpu("SpatialSoftmaxWithLoss", |i| {
        check_order(i.args.string("order", "NCHW")?, i)?;
        op(spatial_forward)
    });
    r.cpu("SpatialSoftmaxWithLossGradient", |i| {
        check_order(i.args.string("order", "NCHW")?, i)?;
        op(spatial_backward)
    });
}

fn op(f: fn(&mut OpContext<'_>) -> Result<()>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(f)))
}

fn check_order(order: String, init: &crate::ops::operator::OpInit<'_>) -> Result<()> {
    if order != "NCHW" {
        bail!(op = init, BadArgument: "Unimplemented order {order}: SpatialSoftmaxWithLoss takes NCHW");
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Dist {
    Cosine,
    L1,
}

/// (rows, row length) of X, after checking that Y has X's shape.
fn rows_of(ctx: &OpContext<'_>) -> Result<(usize, usize)> {
    let (x, y) = (ctx.input(0)?, ctx.input(1)?);
    ensure!(
        x.dims() == y.dims(),
        op = ctx,
        ShapeMismatch: "X {:?} and Y {:?} must have the same shape",
        x.dims(),
        y.dims()
    );
    let n = x.dims().first().copied().unwrap_or(1);
    let d = x.numel().checked_div(n).unwrap_or(0);
    Ok((n, d))
}

/// Forward: inputs X, Y -> one value per row. Gradient: inputs X, Y, dOut -> dX, dY.
fn rowwise(ctx: &mut OpContext<'_>, gradient: bool, dist: Dist) -> Result<()> {
    let (n, d) = rows_of(ctx)?;
    let x = ctx.input(0)?.as_slice::<f32>()?.to_vec();
    let y = ctx.input(1)?.as_slice::<f32>()?.to_vec();
    let rows = |v: &[f32]| -> Vec<Vec<f32>> {
        if d == 0 {
            vec![Vec::new(); n]
        } else {
            v.chunks(d).map(<[f32]>::to_vec).collect()
        }
    };
    let (xr, yr) = (rows(&x), rows(&y));
    if !gradient {
        let mut out = try_vec(n, 0f32, "distance output")?;
        for ((o, a), b) in out.iter_mut().zip(&xr).zip(&yr) {
            *o = match dist {
                Dist::Cosine => cosine(a, b).0 as f32,
                Dist::L1 => a.iter().zip(b).map(|(p, q)| (p - q).abs()).sum(),
            };
        }
        ctx.output(0)?.ensure::<f32>(&[n]).copy_from_slice(&out);
        return Ok(());
    }
    let g = ctx.input(2)?.as_slice::<f32>()?.to_vec();
    ensure!(
        g.len() == n,
        op = ctx,
        ShapeMismatch: "the output gradient has {} values, expected one per row ({n})",
        g.len()
    );
    let mut dx = try_vec(x.len(), 0f32, "gradient of X")?;
    let mut dy = try_vec(y.len(), 0f32, "gradient of Y")?;
    for (i, (a, b)) in xr.iter().zip(&yr).enumerate() {
        let gi = g[i];
        let (dxr, dyr) = (&mut dx[i * d..(i + 1) * d], &mut dy[i * d..(i + 1) * d]);
        match dist {
            Dist::Cosine => {
                let (_, dot, xx, yy) = cosine(a, b);
                let norm = (xx * yy).sqrt();
                let gi = f64::from(gi);
                let n3 = norm * norm * norm;
                for (((gx, gy), &p), &q) in dxr.iter_mut().zip(dyr.iter_mut()).zip(a).zip(b) {
                    let (p, q) = (f64::from(p), f64::from(q));
                    if norm > COS_EPS {
                        *gx = (gi * (q / norm - dot * yy * p / n3)) as f32;
                        *gy = (gi * (p / norm - dot * xx * q / n3)) as f32;
                    } else {
                        *gx = (gi * q / COS_EPS) as f32;
                        *gy = (gi * p / COS_EPS) as f32;
                    }
                }
            }
            Dist::L1 => {
                for (((gx, gy), &p), &q) in dxr.iter_mut().zip(dyr.iter_mut()).zip(a).zip(b) {
                    let diff = p - q;
                    let s = if diff > L1_EPS {
                        1.0
                    } else if diff < -L1_EPS {
                        -1.0
                    } else {
                        0.0
                    };
                    *gx = gi * s;
                    *gy = -gi * s;
                }
            }
        }
    }
    let dims = ctx.input(0)?.dims().to_vec();
    ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
    ctx.output(1)?.ensure::<f32>(&dims).copy_from_slice(&dy);
    Ok(())
}

/// (cosine, dot, |a|^2, |b|^2), the cosine with its norm product clamped to [`COS_EPS`].
fn cosine(a: &[f32], b: &[f32]) -> (f64, f64, f64, f64) {
    let (mut dot, mut xx, mut yy) = (0f64, 0f64, 0f64);
    for (&p, &q) in a.iter().zip(b) {
        let (p, q) = (f64::from(p), f64::from(q));
        dot += p * q;
        xx += p * p;
        yy += q * q;
    }
    (dot / (xx * yy).sqrt().max(COS_EPS), dot, xx, yy)
}

/// Shapes of the spatial loss: (N, C, H*W) from X, after checking the labels (N, H, W) and
/// the optional weights (N, H, W).
fn spatial_dims(ctx: &OpContext<'_>, weights: Option<usize>) -> Result<(usize, usize, usize)> {
    let x = ctx.input(0)?;
    ensure!(
        x.dims().len() == 4,
        op = ctx,
        ShapeMismatch: "SpatialSoftmaxWithLoss needs 4-d NCHW logits, got {:?}",
        x.dims()
    );
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let hw = x.dims()[2] * x.dims()[3];
    let want = [n, x.dims()[2], x.dims()[3]];
    let t = ctx.input(1)?;
    ensure!(
        t.dims() == want,
        op = ctx,
        ShapeMismatch: "labels {:?} must have the shape (N, H, W) = {want:?}",
        t.dims()
    );
    t.as_slice::<i32>()?;
    if let Some(wi) = weights {
        let w = ctx.input(wi)?;
        ensure!(
            w.dims() == want,
            op = ctx,
            ShapeMismatch: "weights {:?} must have the shape (N, H, W) = {want:?}",
            w.dims()
        );
    }
    Ok((n, c, hw))
}

/// Softmax over the channels of every pixel of `x` (N, C, HW) into `p`.
fn channel_softmax(x: &[f32], p: &mut [f32], c: usize, hw: usize) {
    if c == 0 || hw == 0 {
        return;
    }
    for (xi, pi) in x.chunks(c * hw).zip(p.chunks_mut(c * hw)) {
        for s in 0..hw {
            let mut m = f32::NEG_INFINITY;
            for k in 0..c {
                m = m.max(xi[k * hw + s]);
            }
            let mut sum = 0f32;
            for k in 0..c {
                let e = (xi[k * hw + s] - m).exp();
                pi[k * hw + s] = e;
                sum += e;
            }
            for k in 0..c {
                pi[k * hw + s] /= sum;
            }
        }
    }
}

/// The label of pixel `s` of example `i`, checked against the channel count (None: ignored).
fn label_at(ctx: &OpContext<'_>, labels: &[i32], idx: usize, c: usize) -> Result<Option<usize>> {
    let l = labels[idx];
    if l == IGNORE_LABEL {
        return Ok(None);
    }
    match usize::try_from(l) {
        Ok(v) if v < c => Ok(Some(v)),
        _ => bail!(
            op = ctx,
            BadArgument: "Label seems incorrect: label value {l} is not -1 (ignore) nor in [0, {c})"
        ),
    }
}

/// Inputs X (N, C, H, W), labels (N, H, W) int32, optional weights (N, H, W); outputs the
/// probabilities and the weighted mean loss over the pixels whose label is not -1.
fn spatial_forward(ctx: &mut OpContext<'_>) -> Result<()> {
    let weighted = ctx.num_inputs() == 3;
    let (n, c, hw) = spatial_dims(ctx, weighted.then_some(2))?;
    let dims = ctx.input(0)?.dims().to_vec();
    let x = ctx.input(0)?.as_slice::<f32>()?;
    let mut p = try_vec(x.len(), 0f32, "SpatialSoftmaxWithLoss probabilities")?;
    channel_softmax(x, &mut p, c, hw);
    let labels = ctx.input(1)?.as_slice::<i32>()?;
    let weights = if weighted {
        Some(ctx.input(2)?.as_slice::<f32>()?)
    } else {
        None
    };
    let (mut loss, mut total) = (0f64, 0f64);
    for i in 0..n {
        for s in 0..hw {
            let idx = i * hw + s;
            if let Some(l) = label_at(ctx, labels, idx, c)? {
                let w = weights.map_or(1.0, |w| f64::from(w[idx]));
                let prob = p[(i * c + l) * hw + s].max(1e-20);
                loss -= f64::from(prob).ln() * w;
                total += w;
            }
        }
    }
    let avg = if total != 0.0 { loss / total } else { 0.0 };
    ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&p);
    ctx.output(1)?.ensure::<f32>(&[])[0] = avg as f32;
    Ok(())
}

/// Inputs X, labels, optional weights, P, d_avg_loss; output dX.
fn spatial_backward(ctx: &mut OpContext<'_>) -> Result<()> {
    let weighted = ctx.num_inputs() == 5;
    let (n, c, hw) = spatial_dims(ctx, weighted.then_some(2))?;
    let pi = if weighted { 3 } else { 2 };
    let dims = ctx.input(0)?.dims().to_vec();
    ensure!(
        ctx.input(pi)?.dims() == dims.as_slice(),
        op = ctx,
        ShapeMismatch: "probabilities {:?} must have the shape of X {dims:?}",
        ctx.input(pi)?.dims()
    );
    let dl = ctx.input(pi + 1)?.as_slice::<f32>()?;
    ensure!(
        dl.len() == 1,
        op = ctx,
        ShapeMismatch: "the loss gradient must hold one value, got {}",
        dl.len()
    );
    let dl = dl[0];
    let mut dx = ctx.input(pi)?.as_slice::<f32>()?.to_vec();
    let labels = ctx.input(1)?.as_slice::<i32>()?;
    let weights = if weighted {
        Some(ctx.input(2)?.as_slice::<f32>()?)
    } else {
        None
    };
    let mut total = 0f32;
    for i in 0..n {
        for s in 0..hw {
            let idx = i * hw + s;
            let at = |k: usize| (i * c + k) * hw + s;
            match label_at(ctx, labels, idx, c)? {
                Some(l) => {
                    let w = weights.map_or(1.0, |w| w[idx]);
                    dx[at(l)] -= 1.0;
                    for k in 0..c {
                        dx[at(k)] *= w;
                    }
                    total += w;
                }
                None => {
                    for k in 0..c {
                        dx[at(k)] = 0.0;
                    }
                }
            }
        }
    }
    if total != 0.0 {
        let scale = dl / total;
        for v in &mut dx {
            *v *= scale;
        }
    }
    ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn feed(ws: &Workspace, name: &str, dims: &[usize], v: Vec<f32>) {
        ws.feed(name, Tensor::from_vec(dims, v).unwrap());
    }

    fn fetch(ws: &Workspace, name: &str) -> Vec<f32> {
        ws.fetch(name).unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    #[test]
    fn cosine_and_l1_per_row() {
        let ws = Workspace::new();
        feed(&ws, "X", &[2, 2], vec![1.0, 0.0, 3.0, 4.0]);
        feed(&ws, "Y", &[2, 2], vec![0.0, 2.0, 3.0, 4.0]);
        ws.run_operator_once(&OperatorDef::new("CosineSimilarity", ["X", "Y"], ["C"]))
            .unwrap();
        let c = fetch(&ws, "C");
        assert!(c[0].abs() < 1e-6 && (c[1] - 1.0).abs() < 1e-6, "{c:?}");
        ws.run_operator_once(&OperatorDef::new("L1Distance", ["X", "Y"], ["D"]))
            .unwrap();
        assert_eq!(fetch(&ws, "D"), vec![3.0, 0.0]);
        feed(&ws, "G", &[2], vec![2.0, 1.0]);
        ws.run_operator_once(&OperatorDef::new(
            "L1DistanceGradient",
            ["X", "Y", "G"],
            ["dX", "dY"],
        ))
        .unwrap();
        assert_eq!(fetch(&ws, "dX"), vec![2.0, -2.0, 0.0, 0.0]);
        assert_eq!(fetch(&ws, "dY"), vec![-2.0, 2.0, 0.0, 0.0]);
        feed(&ws, "Z", &[3], vec![1.0, 2.0, 3.0]);
        let e = ws
            .run_operator_once(&OperatorDef::new("L1Distance", ["X", "Z"], ["D"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("same shape"), "{e}");
    }

    #[test]
    fn spatial_loss_ignores_minus_one_and_rejects_bad_labels() {
        let ws = Workspace::new();
        // N=1, C=2, H=1, W=2: pixel 0 labelled 1, pixel 1 ignored.
        feed(&ws, "X", &[1, 2, 1, 2], vec![0.0, 5.0, 0.0, -5.0]);
        ws.feed("L", Tensor::from_vec(&[1, 1, 2], vec![1i32, -1]).unwrap());
        ws.run_operator_once(&OperatorDef::new(
            "SpatialSoftmaxWithLoss",
            ["X", "L"],
            ["P", "loss"],
        ))
        .unwrap();
        let loss = fetch(&ws, "loss")[0];
        assert!((loss - 2f32.ln()).abs() < 1e-6, "{loss}");
        ws.feed("L2", Tensor::from_vec(&[1, 1, 2], vec![2i32, -1]).unwrap());
        let e = ws
            .run_operator_once(&OperatorDef::new(
                "SpatialSoftmaxWithLoss",
                ["X", "L2"],
                ["P", "loss"],
            ))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Label seems incorrect"), "{e}");
    }
}
