//! `Im2Col` and `Col2Im` as operators (Caffe2's test-only pair, Col2Im being Im2Col's
//! gradient): `Im2Col` turns a 4-d image into its column matrices, NCHW `[N, C * kh * kw, oh,
//! ow]` or NHWC `[N, oh, ow, kh * kw * C]`; `Col2Im(col, like)` adds such columns back into an
//! image shaped like its second input. Arguments as Caffe2 read them: `kernel` (or
//! `kernel_h`/`kernel_w`), `stride`(`_h`/`_w`), `dilation`(`_h`/`_w`), one `pad` for every
//! side, `order`. The column layouts are those of [`super::im2col`], whose code runs both.

use super::conv::Dims;
use super::conv_args::{out_extent, Geometry, Order};
use super::im2col::{col2im, im2col};
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit};
use crate::ops::registry::Registry;
use crate::tensor::DataType;
use crate::{bail, err};

/// Registers `Im2Col` and `Col2Im`.
pub fn register(r: &mut Registry) {
    r.cpu("Im2Col", |init| {
        let g = geometry(init)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            run_im2col(ctx, &g)
        })))
    });
    r.cpu("Col2Im", |init| {
        let g = geometry(init)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            run_col2im(ctx, &g)
        })))
    });
}

/// A geometry argument read as Caffe2's Im2Col read it: `name_h` (or `name_w`) when given,
/// else `name`, else `default`; positive (`pad`: non-negative).
fn arg(init: &OpInit<'_>, name: &str, side: &str, default: i64) -> Result<usize> {
    let a = &init.args;
    let specific = format!("{name}_{side}");
    let v = if a.has(&specific) {
        a.int(&specific, default)?
    } else {
        a.int(name, default)?
    };
    let min = i64::from(name != "pad");
    if v < min || i32::try_from(v).is_err() {
        let what = if side.is_empty() {
            name.to_string()
        } else {
            specific
        };
        let rel = if min == 0 { ">= 0" } else { "> 0" };
        bail!(op = init, BadArgument: "{what} must be {rel} (and fit an int), got {v}");
    }
    usize::try_from(v).map_err(|_| err!(op = init, BadArgument: "{name} out of range: {v}"))
}

fn geometry(init: &OpInit<'_>) -> Result<Geometry> {
    let order = match init.args.string("order", "NCHW")?.as_str() {
        "NCHW" => Order::Nchw,
        "NHWC" => Order::Nhwc,
        other => bail!(op = init, BadArgument: "Unknown storage order: {other}"),
    };
    let pad = arg(init, "pad", "", 0)?;
    Ok(Geometry {
        kernel: [arg(init, "kernel", "h", 0)?, arg(init, "kernel", "w", 0)?],
        stride: [arg(init, "stride", "h", 1)?, arg(init, "stride", "w", 1)?],
        pad: [pad; 4],
        dilation: [
            arg(init, "dilation", "h", 1)?,
            arg(init, "dilation", "w", 1)?,
        ],
        order,
        global: false,
    })
}

/// The dims of one image `[N, C, H, W]` (in `g`'s order) and its column matrix.
fn dims_of(g: &Geometry, image: &[usize]) -> Result<Dims> {
    let (n, c, h, w) = g.nchw(image)?;
    let [kh, kw] = g.kernel;
    for (size, k, d, what) in [(h, kh, g.dilation[0], "H"), (w, kw, g.dilation[1], "W")] {
        // Caffe2 asks the unpadded image to hold the dilated kernel.
        let dk = d
            .checked_mul(k - 1)
            .and_then(|v| v.checked_add(1))
            .ok_or_else(|| err!(BadArgument: "dilated kernel extent overflows"))?;
        if size < dk {
            bail!(ShapeMismatch: "{what} >= dkernel: the image's {what} is {size}, the dilated \
                   kernel {dk}");
        }
    }
    let oh = out_extent(h, kh, g.dilation[0], g.pad[0], g.pad[2], g.stride[0])?;
    let ow = out_extent(w, kw, g.dilation[1], g.pad[1], g.pad[3], g.stride[1])?;
    Ok(Dims {
        n,
        c,
        h,
        w,
        m: 0,
        kh,
        kw,
        oh,
        ow,
        group: 1,
    })
}

/// Elements of one image's column matrix.
fn col_len(d: &Dims) -> Result<usize> {
    [d.kh, d.kw, d.oh, d.ow]
        .iter()
        .try_fold(d.c, |acc, &v| acc.checked_mul(v))
        .ok_or_else(|| err!(BadArgument: "column matrix too large"))
}

fn col_dims(g: &Geometry, d: &Dims) -> Vec<usize> {
    let k = d.c * d.kh * d.kw;
    match g.order {
        Order::Nchw => vec![d.n, k, d.oh, d.ow],
        Order::Nhwc => vec![d.n, d.oh, d.ow, k],
    }
}

fn run_im2col(ctx: &mut OpContext<'_>, g: &Geometry) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    if x.dtype() != DataType::Float {
        bail!(DtypeMismatch: "X must be float, got {}", x.dtype().name());
    }
    let d = dims_of(g, x.dims())?;
    let per = col_len(&d)?;
    let od = col_dims(g, &d);
    let xs = x.as_slice::<f32>()?;
    let y = outs.tensor(0)?.try_ensure::<f32>(&od)?;
    for (img, col) in y.chunks_mut(per.max(1)).enumerate().take(d.n) {
        im2col(g, &d, xs, img, 0, col);
    }
    Ok(())
}

fn run_col2im(ctx: &mut OpContext<'_>, g: &Geometry) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let col = ins.tensor(0)?;
    let like = ins.tensor(1)?;
    if col.dtype() != DataType::Float {
        bail!(DtypeMismatch: "the columns must be float, got {}", col.dtype().name());
    }
    let d = dims_of(g, like.dims())?;
    let per = col_len(&d)?;
    if Some(col.numel()) != per.checked_mul(d.n) {
        bail!(
            ShapeMismatch: "X.numel() == N * kernel_h * kernel_w * C * out_h * out_w: the \
             columns {:?} do not fit an image of shape {:?}",
            col.dims(),
            like.dims()
        );
    }
    let cs = col.as_slice::<f32>()?;
    let dims = like.dims().to_vec();
    let y = outs.tensor(0)?.try_ensure::<f32>(&dims)?;
    y.fill(0.0);
    for (img, c) in cs.chunks(per.max(1)).enumerate().take(d.n) {
        col2im(g, &d, c, img, 0, y);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn an_empty_batch_and_a_one_by_one_kernel() {
        let ws = Workspace::new();
        ws.feed(
            "x",
            Tensor::from_vec(&[0, 2, 3, 3], Vec::<f32>::new()).unwrap(),
        );
        let mut op = OperatorDef::new("Im2Col", ["x"], ["y"]);
        op.arg.push(Argument::int("kernel", 2));
        ws.run_operator_once(&op).unwrap();
        assert_eq!(ws.fetch("y").unwrap().dims(), &[0, 8, 2, 2]);
        // A 1 x 1 kernel, stride 1: the columns are the image itself.
        let x: Vec<f32> = (0..6).map(|i| i as f32).collect();
        ws.feed("x", Tensor::from_vec(&[1, 2, 1, 3], x.clone()).unwrap());
        let mut op = OperatorDef::new("Im2Col", ["x"], ["y"]);
        op.arg.push(Argument::int("kernel", 1));
        ws.run_operator_once(&op).unwrap();
        assert_eq!(ws.fetch("y").unwrap().as_slice::<f32>().unwrap(), &x[..]);
    }
}
