//! The geometry arguments shared by convolution and pooling ops (Caffe2's `ConvPoolOpBase`):
//! `kernel`/`kernel_h`/`kernel_w`/`kernels`, `stride(s)`, `pad`/`pad_t`/`pad_l`/`pad_b`/`pad_r`/
//! `pads`, `dilation(s)`, `order`, `global_pooling`, for 2-d spatial data.

use crate::error::Result;
use crate::ops::operator::{Inputs, OpInit};
use crate::{bail, err};

/// Memory layout of image tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `[N, C, H, W]`
    Nchw,
    /// `[N, H, W, C]`
    Nhwc,
}

/// 2-d window geometry.
#[derive(Clone, Debug)]
pub struct Geometry {
    /// Kernel (h, w); zero when taken from the input (global pooling, or from W for Conv).
    pub kernel: [usize; 2],
    /// Strides (h, w).
    pub stride: [usize; 2],
    /// Padding (top, left, bottom, right).
    pub pad: [usize; 4],
    /// Dilation (h, w).
    pub dilation: [usize; 2],
    /// Layout.
    pub order: Order,
    /// Pool over the whole image.
    pub global: bool,
}

fn pair(
    init: &OpInit<'_>,
    one: &str,
    h: &str,
    w: &str,
    list: &str,
    default: i64,
) -> Result<[i64; 2]> {
    let a = &init.args;
    let l = a.ints(list);
    if !l.is_empty() {
        if l.len() != 2 {
            bail!(op = init, BadArgument: "{list} must have 2 values (2-d ops only), got {l:?}");
        }
        return Ok([l[0], l[1]]);
    }
    if a.has(h) || a.has(w) {
        return Ok([a.int(h, default)?, a.int(w, default)?]);
    }
    let v = a.int(one, default)?;
    Ok([v, v])
}

/// A geometry value: non-negative, and an `int` as Caffe2 read it (`GetSingleArgument<int>`
/// refused larger values), which also keeps the window arithmetic far from overflowing.
fn non_negative(init: &OpInit<'_>, what: &str, v: i64) -> Result<usize> {
    if v < 0 {
        bail!(op = init, BadArgument: "{what} must not be negative, got {v}");
    }
    if i32::try_from(v).is_err() {
        bail!(
            op = init,
            BadArgument: "Value {v} of argument {what} cannot be represented correctly in a \
             target type (int)"
        );
    }
    usize::try_from(v).map_err(|_| err!(op = init, BadArgument: "{what} out of range: {v}"))
}

impl Geometry {
    /// Reads the arguments of `init`.
    pub fn new(init: &OpInit<'_>) -> Result<Self> {
        let a = &init.args;
        let order = match a.string("order", "NCHW")?.as_str() {
            "NCHW" => Order::Nchw,
            "NHWC" => Order::Nhwc,
            other => bail!(op = init, BadArgument: "Unknown storage order: {other}"),
        };
        let global = a.bool("global_pooling", false)?;
        let k = pair(init, "kernel", "kernel_h", "kernel_w", "kernels", 0)?;
        let s = pair(init, "stride", "stride_h", "stride_w", "strides", 1)?;
        let d = pair(init, "dilation", "dilation_h", "dilation_w", "dilations", 1)?;
        let pads = a.ints("pads");
        let pad = if !pads.is_empty() {
            if pads.len() != 4 {
                bail!(op = init, BadArgument: "pads must have 4 values, got {pads:?}");
            }
            [pads[0], pads[1], pads[2], pads[3]]
        } else if ["pad_t", "pad_l", "pad_b", "pad_r"]
            .iter()
            .any(|n| a.has(n))
        {
            [
                a.int("pad_t", 0)?,
                a.int("pad_l", 0)?,
                a.int("pad_b", 0)?,
                a.int("pad_r", 0)?,
            ]
        } else {
            let p = a.int("pad", 0)?;
            [p, p, p, p]
        };
        let g = Geometry {
            kernel: [
                non_negative(init, "kernel", k[0])?,
                non_negative(init, "kernel", k[1])?,
            ],
            stride: [
                non_negative(init, "stride", s[0])?,
                non_negative(init, "stride", s[1])?,
            ],
            pad: [
                non_negative(init, "pad", pad[0])?,
                non_negative(init, "pad", pad[1])?,
                non_negative(init, "pad", pad[2])?,
                non_negative(init, "pad", pad[3])?,
            ],
            dilation: [
                non_negative(init, "dilation", d[0])?,
                non_negative(init, "dilation", d[1])?,
            ],
            order,
            global,
        };
        if g.stride.contains(&0) || g.dilation.contains(&0) {
            bail!(op = init, BadArgument: "stride and dilation must be positive");
        }
        Ok(g)
    }

    /// `(N, C, H, W)` of an image tensor in this layout.
    pub fn nchw(&self, dims: &[usize]) -> Result<(usize, usize, usize, usize)> {
        if dims.len() != 4 {
            bail!(
                ShapeMismatch: "expected a 4-d image tensor (2-d spatial ops only), got shape \
                 {dims:?}"
            );
        }
        Ok(match self.order {
            Order::Nchw => (dims[0], dims[1], dims[2], dims[3]),
            Order::Nhwc => (dims[0], dims[3], dims[1], dims[2]),
        })
    }

    /// Output spatial size for input (h, w) and kernel (kh, kw).
    pub fn out_size(&self, h: usize, w: usize, kh: usize, kw: usize) -> Result<(usize, usize)> {
        Ok((
            out_extent(
                h,
                kh,
                self.dilation[0],
                self.pad[0],
                self.pad[2],
                self.stride[0],
            )?,
            out_extent(
                w,
                kw,
                self.dilation[1],
                self.pad[1],
                self.pad[3],
                self.stride[1],
            )?,
        ))
    }

    /// Dims of an image tensor in this layout.
    pub fn dims(&self, n: usize, c: usize, h: usize, w: usize) -> Vec<usize> {
        match self.order {
            Order::Nchw => vec![n, c, h, w],
            Order::Nhwc => vec![n, h, w, c],
        }
    }
}

/// The output extent of a window of `k` taps dilated by `d` sliding with stride `s` over `inp`
/// values padded by `p0` and `p1`: `(inp + p0 + p1 - (d * (k - 1) + 1)) / s + 1`, all in checked
/// arithmetic (an error, never a wrapped size).
pub fn out_extent(inp: usize, k: usize, d: usize, p0: usize, p1: usize, s: usize) -> Result<usize> {
    let dk = d
        .checked_mul(k.max(1) - 1)
        .and_then(|v| v.checked_add(1))
        .ok_or_else(|| err!(BadArgument: "dilated kernel extent {d} * ({k} - 1) + 1 overflows"))?;
    let padded = inp
        .checked_add(p0)
        .and_then(|v| v.checked_add(p1))
        .ok_or_else(|| err!(BadArgument: "padded input {inp} + {p0} + {p1} overflows"))?;
    if s == 0 {
        bail!(BadArgument: "stride must be positive");
    }
    if padded < dk {
        // Caffe2 enforces `in_size + pad_head + pad_tail >= dkernel`. An empty axis whose
        // kernel overhangs by at most one stride gives an empty output here instead (an empty
        // input with a 1-wide kernel, say), as the truncating formula would.
        if inp == 0 && dk - padded <= s {
            return Ok(0);
        }
        bail!(
            ShapeMismatch: "in_size + pad_head + pad_tail >= dkernel: the kernel of extent {dk} \
             does not fit the padded input of size {padded}"
        );
    }
    (padded - dk)
        .checked_div(s)
        .and_then(|v| v.checked_add(1))
        .ok_or_else(|| err!(BadArgument: "output size overflows"))
}

/// A convolution's optional bias (input 2), which must hold one value per output channel (`m`).
pub fn bias<'s>(ins: &'s Inputs<'_, '_>, m: usize) -> Result<Option<&'s [f32]>> {
    if ins.len() <= 2 {
        return Ok(None);
    }
    let b = ins.tensor(2)?.as_slice::<f32>()?;
    if b.len() != m {
        bail!(ShapeMismatch: "bias has {} values, expected {m}", b.len());
    }
    Ok(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn out_extent_follows_caffe2_and_refuses_overflow() {
        // (5 + 1 + 1 - (2 * (3 - 1) + 1)) / 2 + 1 = 2
        assert_eq!(out_extent(5, 3, 2, 1, 1, 2).unwrap(), 2);
        assert_eq!(out_extent(0, 1, 1, 1, 0, 1).unwrap(), 1);
        // An empty input, a 1-wide kernel: an empty output, as Caffe2 computes it.
        assert_eq!(out_extent(0, 1, 1, 0, 0, 1).unwrap(), 0);
        // A kernel that overhangs a non-empty input: refused, as Caffe2 enforces it.
        let e = out_extent(1, 3, 1, 0, 0, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch, "{e}");
        let e = out_extent(3, 3, 2, 0, 1, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch, "{e}");
        let e = out_extent(1, usize::MAX, 2, 0, 0, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadArgument, "{e}");
        let e = out_extent(1, 1, 1, usize::MAX, 1, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadArgument, "{e}");
        let e = out_extent(2, 5, 1, 0, 0, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch, "{e}");
    }
}
