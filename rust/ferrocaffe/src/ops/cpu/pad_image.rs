//! PadImage and PadImageGradient: padding around the two spatial dimensions of a 4-d image.
//!
//! Arguments are those of Caffe2's `ConvPoolOpBase` (`pad`, `pad_t`/`pad_l`/`pad_b`/`pad_r`,
//! `pads`, `order`; stride and dilation must be 1; `legacy_pad` is refused), plus `mode`
//! (`constant` with `value` (0.0), `reflect` (mirror without repeating the edge), `edge`).
//! The output is `[N, C, H + pad_t + pad_b, W + pad_l + pad_r]` (NHWC alike).
//!
//! `PadImageGradient(dY) -> dX` with the forward op's arguments sums each dY value into the
//! input position it was read from (constant padding drops the border). A reflect pad must
//! be smaller than the dimension it mirrors (Caffe2 would read out of bounds).

use super::conv_args::{Geometry, Order};
use crate::error::{try_vec, Result};
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("PadImage", |i| create(i, false));
    r.cpu("PadImageGradient", |i| create(i, true));
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Constant(f32),
    Reflect,
    Edge,
}

fn create(init: &OpInit<'_>, gradient: bool) -> Result<Box<dyn Operator>> {
    let geo = Geometry::new(init)?;
    if init.args.has("legacy_pad") && init.args.int("legacy_pad", 0)? != 0 {
        bail!(op = init, NotImplemented: "Padding layer only supports explicit pad values.");
    }
    if geo.dilation != [1, 1] {
        bail!(op = init, NotImplemented: "Pooling op does not support dilation right now.");
    }
    if !gradient && geo.stride != [1, 1] {
        bail!(op = init, NotImplemented: "Pooling op does not support stride right now.");
    }
    let mode = match init.args.string("mode", "constant")?.as_str() {
        "constant" => Mode::Constant(init.args.float("value", 0.0)?),
        "reflect" => Mode::Reflect,
        "edge" => Mode::Edge,
        other => bail!(op = init, BadArgument: "Unknown padding mode: {other}"),
    };
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        run(ctx, &geo, mode, gradient)
    })))
}

/// The source index along one dimension of size `n` of padded position `p` (pad `before`),
/// None for a constant border.
fn source(p: usize, before: usize, n: usize, mode: Mode) -> Option<i64> {
    let i = p as i64 - before as i64;
    let n = n as i64;
    match mode {
        Mode::Constant(_) => (i >= 0 && i < n).then_some(i),
        Mode::Edge => Some(i.clamp(0, n - 1)),
        Mode::Reflect => {
            let i = i.abs();
            Some(i.min(2 * n - i - 2))
        }
    }
}

/// For each padded position along one dimension, its source (checked to be in range).
fn map(
    ctx: &OpContext<'_>,
    padded: usize,
    before: usize,
    n: usize,
    mode: Mode,
) -> Result<Vec<Option<usize>>> {
    (0..padded)
        .map(|p| match source(p, before, n, mode) {
            None => Ok(None),
            Some(i) if i >= 0 && (i as usize) < n => Ok(Some(i as usize)),
            Some(_) => Err(err!(
                op = ctx,
                BadArgument: "the padding ({before} before) reaches past a dimension of size {n} \
                 in {mode:?} mode"
            )),
        })
        .collect()
}

fn run(ctx: &mut OpContext<'_>, geo: &Geometry, mode: Mode, gradient: bool) -> Result<()> {
    let in_dims = ctx.input(0)?.dims().to_vec();
    let (n, c, h_in, w_in) = geo.nchw(&in_dims)?;
    let [pt, pl, pb, pr] = geo.pad;
    // (H, W) of the image and of the padded image.
    let (h, w, ph, pw) = if gradient {
        let shrink = |d: usize, a: usize, b: usize| d.checked_sub(a)?.checked_sub(b);
        let (h, w) = (shrink(h_in, pt, pb), shrink(w_in, pl, pr));
        match (h, w) {
            (Some(h), Some(w)) => (h, w, h_in, w_in),
            _ => {
                bail!(
                    op = ctx,
                    ShapeMismatch: "dY {in_dims:?} is smaller than its padding {:?}",
                    geo.pad
                )
            }
        }
    } else {
        let grow = |d: usize, a: usize, b: usize| d.checked_add(a)?.checked_add(b);
        match (grow(h_in, pt, pb), grow(w_in, pl, pr)) {
            (Some(ph), Some(pw)) => (h_in, w_in, ph, pw),
            _ => bail!(
                op = ctx,
                OutOfMemory: "the padding {:?} of an image of shape {in_dims:?} is too large to \
                 allocate",
                geo.pad
            ),
        }
    };
    let out_dims = geo.dims(
        n,
        c,
        if gradient { h } else { ph },
        if gradient { w } else { pw },
    );
    // The padding is the user's: a buffer it sizes is allocated fallibly, before the per-row
    // and per-column maps (which are not needed when the image is empty).
    let numel = out_dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| {
            err!(
                op = ctx,
                OutOfMemory: "the padded image of shape {out_dims:?} is too large to allocate"
            )
        })?;
    let fill = match mode {
        Mode::Constant(v) if !gradient => v,
        _ => 0.0,
    };
    if (h == 0 || w == 0) && !matches!(mode, Mode::Constant(_)) && ph > 0 && pw > 0 {
        bail!(op = ctx, ShapeMismatch: "cannot reflect or extend an empty image");
    }
    let mut out = try_vec(numel, fill, "the padded image")?;
    if numel == 0 {
        ctx.output(0)?.try_ensure::<f32>(&out_dims)?;
        return Ok(());
    }
    let rows = map(ctx, ph, pt, h, mode)?;
    let cols = map(ctx, pw, pl, w, mode)?;
    // Flat offsets of (n, c, y, x) in a [N, C, Hd, Wd] image of this layout.
    let at = |ni: usize, ci: usize, y: usize, x: usize, hd: usize, wd: usize| match geo.order {
        Order::Nchw => ((ni * c + ci) * hd + y) * wd + x,
        Order::Nhwc => ((ni * hd + y) * wd + x) * c + ci,
    };
    {
        let src = ctx.input(0)?.as_slice::<f32>()?;
        for ni in 0..n {
            for ci in 0..c {
                for (y, ry) in rows.iter().enumerate() {
                    let Some(sy) = *ry else { continue };
                    for (x, rx) in cols.iter().enumerate() {
                        let Some(sx) = *rx else { continue };
                        let padded = at(ni, ci, y, x, ph, pw);
                        let image = at(ni, ci, sy, sx, h, w);
                        if gradient {
                            out[image] += src[padded];
                        } else {
                            out[padded] = src[image];
                        }
                    }
                }
            }
        }
    }
    ctx.output(0)?
        .try_ensure::<f32>(&out_dims)?
        .copy_from_slice(&out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn pad(mode: &str, args: Vec<Argument>) -> crate::Result<(Vec<usize>, Vec<f32>)> {
        let ws = Workspace::new();
        // 1 x 1 x 2 x 3: [[1, 2, 3], [4, 5, 6]]
        ws.feed(
            "X",
            Tensor::from_vec(&[1, 1, 2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
        );
        let mut op = OperatorDef::new("PadImage", ["X"], ["Y"]);
        op.arg = args;
        op.arg.push(Argument::string("mode", mode));
        ws.run_operator_once(&op)?;
        let y = ws.fetch("Y")?;
        Ok((y.dims().to_vec(), y.as_slice::<f32>()?.to_vec()))
    }

    #[test]
    fn modes() {
        let (d, y) = pad(
            "constant",
            vec![
                Argument::int("pad_t", 1),
                Argument::int("pad_l", 0),
                Argument::int("pad_b", 0),
                Argument::int("pad_r", 1),
                Argument {
                    name: Some("value".into()),
                    f: Some(-1.0),
                    ..Default::default()
                },
            ],
        )
        .unwrap();
        assert_eq!(d, vec![1, 1, 3, 4]);
        assert_eq!(
            y,
            vec![-1.0, -1.0, -1.0, -1.0, 1.0, 2.0, 3.0, -1.0, 4.0, 5.0, 6.0, -1.0]
        );
        let (d, y) = pad("reflect", vec![Argument::int("pad", 1)]).unwrap();
        assert_eq!(d, vec![1, 1, 4, 5]);
        assert_eq!(
            y,
            vec![
                5.0, 4.0, 5.0, 6.0, 5.0, //
                2.0, 1.0, 2.0, 3.0, 2.0, //
                5.0, 4.0, 5.0, 6.0, 5.0, //
                2.0, 1.0, 2.0, 3.0, 2.0,
            ]
        );
        let (_, y) = pad("edge", vec![Argument::int("pad", 1)]).unwrap();
        assert_eq!(&y[..5], &[1.0, 1.0, 2.0, 3.0, 3.0]);
        assert_eq!(&y[15..], &[4.0, 4.0, 5.0, 6.0, 6.0]);
        // A padding no buffer could hold is refused (no panic, no abort), as is one that is
        // not an int (Caffe2 read the pads as ints).
        let e = pad("constant", vec![Argument::int("pad", 1 << 24)]).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::OutOfMemory, "{e}");
        for p in [1 << 40, i64::MAX] {
            let e = pad("constant", vec![Argument::int("pad", p)]).unwrap_err();
            assert!(e.to_string().contains("cannot be represented"), "{e}");
        }
        // Reflecting farther than the image is refused, as are unknown modes and strides.
        assert!(pad("reflect", vec![Argument::int("pad", 2)]).is_err());
        assert!(pad("wrap", vec![Argument::int("pad", 1)]).is_err());
        assert!(pad(
            "edge",
            vec![Argument::int("pad", 1), Argument::int("stride", 2)]
        )
        .is_err());
    }

    #[test]
    fn nhwc_and_gradient() {
        let ws = Workspace::new();
        // NHWC 1 x 1 x 2 x 2 (two channels): pixel values (1, 10), (2, 20).
        ws.feed(
            "X",
            Tensor::from_vec(&[1, 1, 2, 2], vec![1.0f32, 10.0, 2.0, 20.0]).unwrap(),
        );
        let args = vec![
            Argument::string("order", "NHWC"),
            Argument::int("pad_t", 0),
            Argument::int("pad_l", 1),
            Argument::int("pad_b", 0),
            Argument::int("pad_r", 0),
            Argument::string("mode", "edge"),
        ];
        let mut op = OperatorDef::new("PadImage", ["X"], ["Y"]);
        op.arg = args.clone();
        ws.run_operator_once(&op).unwrap();
        let y = ws.fetch("Y").unwrap();
        assert_eq!(y.dims(), &[1, 1, 3, 2]);
        assert_eq!(
            y.as_slice::<f32>().unwrap(),
            &[1.0, 10.0, 1.0, 10.0, 2.0, 20.0]
        );
        // The gradient sums the copies: dX = [2, 2, 1, 1] for dY = 1.
        ws.feed(
            "dY",
            Tensor::from_vec(&[1, 1, 3, 2], vec![1.0f32; 6]).unwrap(),
        );
        let mut g = OperatorDef::new("PadImageGradient", ["dY"], ["dX"]);
        g.arg = args;
        ws.run_operator_once(&g).unwrap();
        let dx = ws.fetch("dX").unwrap();
        assert_eq!(dx.dims(), &[1, 1, 2, 2]);
        assert_eq!(dx.as_slice::<f32>().unwrap(), &[2.0, 2.0, 1.0, 1.0]);
    }

    #[test]
    fn reflect_gradient_folds_back() {
        let ws = Workspace::new();
        // NCHW 1 x 1 x 1 x 3 padded by 1 on each side (W only): dY of width 5.
        ws.feed(
            "dY",
            Tensor::from_vec(&[1, 1, 1, 5], vec![1.0f32, 2.0, 3.0, 4.0, 5.0]).unwrap(),
        );
        let mut g = OperatorDef::new("PadImageGradient", ["dY"], ["dX"]);
        g.arg = vec![
            Argument::int("pad_t", 0),
            Argument::int("pad_l", 1),
            Argument::int("pad_b", 0),
            Argument::int("pad_r", 1),
            Argument::string("mode", "reflect"),
        ];
        ws.run_operator_once(&g).unwrap();
        // Padded positions read x = [1, 0, 1, 2, 1].
        assert_eq!(
            ws.fetch("dX").unwrap().as_slice::<f32>().unwrap(),
            &[2.0, 1.0 + 3.0 + 5.0, 4.0]
        );
        ws.feed("dY", Tensor::from_vec(&[1, 1, 1, 1], vec![1.0f32]).unwrap());
        assert!(ws.run_operator_once(&g).is_err());
    }
}
