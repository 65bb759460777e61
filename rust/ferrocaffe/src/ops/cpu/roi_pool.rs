//! `RoIPool` (Fast R-CNN's region-of-interest max pooling) and `RoIPoolGradient`, NCHW only as
//! Caffe2's CPU kernel. X `[N, C, H, W]`, ROIS `[R, 5]` rows `(batch, x1, y1, x2, y2)` in
//! input-image coordinates (scaled by `spatial_scale` and rounded); each ROI is cut into
//! `pooled_h x pooled_w` bins whose maxima make Y `[R, C, pooled_h, pooled_w]`. An empty bin
//! gives 0. In training (`is_test` 0) a second output holds, per output value, the index of
//! the maximum within its `H x W` plane (int32, -1 for an empty bin), which the gradient
//! reads: `RoIPoolGradient(X, ROIS, argmaxes, dY) -> dX` adds each dY at its argmax.

use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit};
use crate::ops::registry::Registry;
use crate::tensor::DataType;
use crate::{bail, err};

/// Registers the forward and gradient kernels.
pub fn register(r: &mut Registry) {
    r.cpu("RoIPool", |init| {
        let p = Params::new(init)?;
        if (p.is_test && init.num_outputs() != 1) || (!p.is_test && init.num_outputs() != 2) {
            bail!(op = init, Schema: "Output size mismatch.");
        }
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            forward(ctx, &p)
        })))
    });
    r.cpu("RoIPoolGradient", |init| {
        let p = Params::new(init)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            backward(ctx, &p)
        })))
    });
}

struct Params {
    is_test: bool,
    pooled_h: usize,
    pooled_w: usize,
    spatial_scale: f32,
}

impl Params {
    fn new(init: &OpInit<'_>) -> Result<Self> {
        let a = &init.args;
        let is_test = a.int("is_test", 0)? != 0;
        let order = a.string("order", "NCHW")?;
        if order != "NCHW" && order != "NHWC" {
            bail!(op = init, BadArgument: "Unknown storage order: {order}");
        }
        let spatial_scale = a.float("spatial_scale", 1.0)?;
        if spatial_scale.is_nan() || spatial_scale <= 0.0 {
            bail!(op = init, BadArgument: "spatial_scale must be > 0, got {spatial_scale}");
        }
        let pooled = |name: &str| -> Result<usize> {
            let v = a.int(name, 1)?;
            if v <= 0 || i32::try_from(v).is_err() {
                bail!(op = init, BadArgument: "{name} must be > 0 (and fit an int), got {v}");
            }
            usize::try_from(v).map_err(|_| err!(op = init, BadArgument: "{name}: {v}"))
        };
        let (pooled_h, pooled_w) = (pooled("pooled_h")?, pooled("pooled_w")?);
        if order != "NCHW" {
            bail!(op = init, NotImplemented: "Only NCHW order is supported right now.");
        }
        Ok(Params {
            is_test,
            pooled_h,
            pooled_w,
            spatial_scale,
        })
    }
}

/// One ROI's batch index and its window `(start_h, start_w, height, width)` in the feature
/// map, as Caffe2 rounds it (malformed ROIs become 1 x 1).
fn roi_window(r: &[f32], batch: usize, scale: f32) -> Result<(usize, i64, i64, i64, i64)> {
    // C++ truncates the float batch index to int.
    let b = r[0] as i64;
    if b < 0 || b >= batch as i64 {
        bail!(BadArgument: "RoI batch index {b} is out of range [0, {batch})");
    }
    let at = |v: f32| (v * scale).round() as i64;
    let (w0, h0, w1, h1) = (at(r[1]), at(r[2]), at(r[3]), at(r[4]));
    let height = (h1.saturating_sub(h0).saturating_add(1)).max(1);
    let width = (w1.saturating_sub(w0).saturating_add(1)).max(1);
    Ok((b as usize, h0, w0, height, width))
}

/// The bin `[start, end)` of pooled position `p` of `pooled` over a window of `len` starting
/// at `start`, clipped to `0..size`.
fn bin(p: usize, pooled: usize, start: i64, len: i64, size: usize) -> (usize, usize) {
    let step = len as f32 / pooled as f32;
    let lo = ((p as f32 * step).floor() as i64).saturating_add(start);
    let hi = (((p + 1) as f32 * step).ceil() as i64).saturating_add(start);
    let clip = |v: i64| v.clamp(0, size as i64) as usize;
    (clip(lo), clip(hi))
}

/// `(N, C, H, W, R)` of X and ROIS, checked.
fn shapes(ctx: &OpContext<'_>) -> Result<(usize, usize, usize, usize, usize)> {
    let x = ctx.input(0)?;
    let r = ctx.input(1)?;
    if x.dtype() != DataType::Float || x.ndim() != 4 {
        bail!(
            ShapeMismatch: "X must be a 4-D float tensor (NCHW), got {} {:?}",
            x.dtype().name(),
            x.dims()
        );
    }
    if r.dtype() != DataType::Float || r.ndim() != 2 || r.dims()[1] != 5 {
        bail!(
            ShapeMismatch: "R.dim32(1) == 5: RoIs must be a float [R, 5] tensor of rows \
             (batch, x1, y1, x2, y2), got {} {:?}",
            r.dtype().name(),
            r.dims()
        );
    }
    let d = x.dims();
    Ok((d[0], d[1], d[2], d[3], r.dims()[0]))
}

fn forward(ctx: &mut OpContext<'_>, p: &Params) -> Result<()> {
    let (n, c, h, w, nr) = shapes(ctx)?;
    let (ins, mut outs) = ctx.split();
    let xs = ins.tensor(0)?.as_slice::<f32>()?;
    let rois = ins.tensor(1)?.as_slice::<f32>()?;
    let (ph, pw) = (p.pooled_h, p.pooled_w);
    let od = [nr, c, ph, pw];
    let mut ts = outs.tensors();
    let (y, mut arg) = match &mut ts[..] {
        [y] => (y.try_ensure::<f32>(&od)?, None),
        [y, a] => (y.try_ensure::<f32>(&od)?, Some(a.try_ensure::<i32>(&od)?)),
        _ => bail!(Schema: "Y and argmaxes must be two different blobs"),
    };
    let plane = h * w;
    if arg.is_some() && i32::try_from(plane).is_err() {
        bail!(ShapeMismatch: "input planes of {h} x {w} are too large for int32 argmaxes");
    }
    let bins = ph * pw;
    for (ri, roi) in rois.chunks_exact(5).enumerate() {
        let (b, h0, w0, rh, rw) = roi_window(roi, n, p.spatial_scale)?;
        for ch in 0..c {
            let src = &xs[(b * c + ch) * plane..(b * c + ch + 1) * plane];
            let base = (ri * c + ch) * bins;
            for py in 0..ph {
                let (hs, he) = bin(py, ph, h0, rh, h);
                for px in 0..pw {
                    let (ws, we) = bin(px, pw, w0, rw, w);
                    let empty = he <= hs || we <= ws;
                    let mut best = if empty { 0.0 } else { f32::MIN };
                    let mut at: i32 = -1;
                    for yy in hs..he {
                        for xx in ws..we {
                            let v = src[yy * w + xx];
                            if v > best {
                                best = v;
                                at = (yy * w + xx) as i32;
                            }
                        }
                    }
                    let o = base + py * pw + px;
                    y[o] = best;
                    if let Some(a) = arg.as_deref_mut() {
                        a[o] = at;
                    }
                }
            }
        }
    }
    Ok(())
}

fn backward(ctx: &mut OpContext<'_>, p: &Params) -> Result<()> {
    let (n, c, h, w, nr) = shapes(ctx)?;
    let (ph, pw) = (p.pooled_h, p.pooled_w);
    let want = [nr, c, ph, pw];
    let (a, g) = (ctx.input(2)?, ctx.input(3)?);
    if a.dtype() != DataType::Int32 || a.dims() != want {
        bail!(
            ShapeMismatch: "argmaxes must be int32 of shape {want:?}, got {} {:?}",
            a.dtype().name(),
            a.dims()
        );
    }
    if g.dtype() != DataType::Float || g.dims() != want {
        bail!(
            ShapeMismatch: "dY must be float of shape {want:?}, got {} {:?}",
            g.dtype().name(),
            g.dims()
        );
    }
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let rois = ins.tensor(1)?.as_slice::<f32>()?;
    let am = ins.tensor(2)?.as_slice::<i32>()?;
    let gy = ins.tensor(3)?.as_slice::<f32>()?;
    let xd = x.dims().to_vec();
    let dx = outs.tensor(0)?.try_ensure::<f32>(&xd)?;
    dx.fill(0.0);
    let plane = h * w;
    let bins = ph * pw;
    for (ri, roi) in rois.chunks_exact(5).enumerate() {
        let (b, ..) = roi_window(roi, n, p.spatial_scale)?;
        for ch in 0..c {
            let dst = &mut dx[(b * c + ch) * plane..(b * c + ch + 1) * plane];
            let base = (ri * c + ch) * bins;
            for k in base..base + bins {
                let i = am[k];
                if i < 0 {
                    continue;
                }
                let slot = dst.get_mut(i as usize).ok_or_else(
                    || err!(BadArgument: "argmax {i} is outside the {h} x {w} input plane"),
                )?;
                *slot += gy[k];
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn hostile_rois_give_clipped_or_empty_bins_and_bad_batches_an_error() {
        let ws = Workspace::new();
        let x: Vec<f32> = (0..2 * 3 * 4).map(|i| i as f32).collect();
        ws.feed("x", Tensor::from_vec(&[1, 2, 3, 4], x).unwrap());
        let rois = vec![
            0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e30,
            0.0,
            -1e30,
            -1e30,
            1e30,
            1e30,
        ];
        ws.feed("r", Tensor::from_vec(&[2, 5], rois).unwrap());
        let mut op = OperatorDef::new("RoIPool", ["x", "r"], ["y", "a"]);
        op.arg.push(Argument::int("pooled_h", 2));
        op.arg.push(Argument::int("pooled_w", 2));
        ws.run_operator_once(&op).unwrap();
        let y = ws.fetch("y").unwrap();
        assert_eq!(y.dims(), &[2, 2, 2, 2]);
        let a = ws.fetch("a").unwrap();
        // Every argmax is -1 (empty bin, value 0) or inside the 3 x 4 plane.
        for (&i, &v) in a
            .as_slice::<i32>()
            .unwrap()
            .iter()
            .zip(y.as_slice::<f32>().unwrap())
        {
            assert!((-1..12).contains(&i), "{i}");
            assert!(i >= 0 || v == 0.0);
        }
        ws.feed(
            "r",
            Tensor::from_vec(&[1, 5], vec![-1.0f32, 0.0, 0.0, 1.0, 1.0]).unwrap(),
        );
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("batch index -1"), "{e}");
    }
}
