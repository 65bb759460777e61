//! Comparisons and logic: EQ/NE/LT/LE/GT/GE (bool output, numpy or legacy broadcasting),
//! And/Or/Xor, Not, Where.

use super::broadcast::{broadcast_dims, for_each_broadcast};
use super::elementwise::{binary, input_dtype, input_meta, unary};
use super::math::BroadcastArgs;
use crate::bail;
use crate::dispatch;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Element};

/// Registers the comparison family.
pub fn register(r: &mut Registry) {
    r.cpu("EQ", |i| create_cmp(i, |o| o == std::cmp::Ordering::Equal));
    r.cpu("NE", |i| create_cmp(i, |o| o != std::cmp::Ordering::Equal));
    r.cpu("LT", |i| create_cmp(i, |o| o == std::cmp::Ordering::Less));
    r.cpu("LE", |i| {
        create_cmp(i, |o| o != std::cmp::Ordering::Greater)
    });
    r.cpu("GT", |i| {
        create_cmp(i, |o| o == std::cmp::Ordering::Greater)
    });
    r.cpu("GE", |i| create_cmp(i, |o| o != std::cmp::Ordering::Less));
    r.cpu("And", |i| create_logic(i, |a, b| a & b));
    r.cpu("Or", |i| create_logic(i, |a, b| a | b));
    r.cpu("Xor", |i| create_logic(i, |a, b| a ^ b));
    r.cpu("Not", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            unary::<bool, bool>(ctx, |x| !x)
        })))
    });
    r.cpu("Where", create_where);
}

type Cmp = fn(std::cmp::Ordering) -> bool;

fn cmp_with<T: Element + PartialOrd>(pred: Cmp) -> impl Fn(T, T) -> bool {
    // NaN compares unordered: only NE holds.
    move |a: T, b: T| match a.partial_cmp(&b) {
        Some(o) => pred(o),
        None => {
            !pred(std::cmp::Ordering::Equal)
                && pred(std::cmp::Ordering::Less)
                && pred(std::cmp::Ordering::Greater)
        }
    }
}

fn create_cmp(init: &OpInit<'_>, pred: Cmp) -> Result<Box<dyn Operator>> {
    let bc = BroadcastArgs::new(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (la, lb, lc, c) = bc.shapes(ctx)?;
        let dt = input_dtype(ctx, 0)?;
        dispatch!(dt, [Bool => bool, Int32 => i32, Int64 => i64, Float => f32, Double => f64], |T| {
            binary::<T, T, bool>(ctx, &la, &lb, &lc, &c, cmp_with::<T>(pred))
        })
    })))
}

fn create_logic(init: &OpInit<'_>, f: fn(bool, bool) -> bool) -> Result<Box<dyn Operator>> {
    let bc = BroadcastArgs::new(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let (la, lb, lc, c) = bc.shapes(ctx)?;
        binary::<bool, bool, bool>(ctx, &la, &lb, &lc, &c, f)
    })))
}

fn create_where(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let rows = init.args.bool("broadcast_on_rows", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        where_kernel(ctx, rows)
    })))
}

fn where_kernel(ctx: &mut OpContext<'_>, rows: bool) -> Result<()> {
    let (cd, ct) = input_meta(ctx, 0)?;
    let (xd, xt) = input_meta(ctx, 1)?;
    let (yd, yt) = input_meta(ctx, 2)?;
    if ct != DataType::Bool {
        bail!(op = ctx, DtypeMismatch: "Where expects a bool condition, got {ct}");
    }
    if xt != yt {
        bail!(op = ctx, DtypeMismatch: "Where: X is {xt} but Y is {yt}");
    }
    if xd != yd {
        bail!(op = ctx, ShapeMismatch: "left.sizes() == right.sizes(). {xd:?} vs {yd:?}");
    }
    let out_dims = if rows {
        if cd.len() != 1 || xd.first() != cd.first() {
            bail!(
                op = ctx,
                ShapeMismatch: "Where with broadcast_on_rows needs a 1-d condition of X's first \
                 dimension, got {cd:?} for {xd:?}"
            );
        }
        xd.to_vec()
    } else {
        if cd != xd {
            bail!(op = ctx, ShapeMismatch: "select.sizes() == left.sizes(). {cd:?} vs {xd:?}");
        }
        broadcast_dims(&cd, &xd)?
    };
    if (1..3).any(|i| ctx.is_inplace(i, 0)) || ctx.is_inplace(0, 0) {
        bail!(op = ctx, Schema: "Where cannot run in place");
    }
    dispatch!(xt, [Float => f32, Double => f64, Int32 => i32, Int64 => i64, Bool => bool, Uint8 => u8], |T| {
        let (ins, mut outs) = ctx.split();
        let c = ins.tensor(0)?.as_slice::<bool>()?.to_vec();
        let x = ins.tensor(1)?.as_slice::<T>()?;
        let y = ins.tensor(2)?.as_slice::<T>()?;
        let out = outs.tensor(0)?.ensure::<T>(&out_dims);
        if rows {
            let inner = out.len().checked_div(cd[0]).unwrap_or(0);
            for (i, o) in out.iter_mut().enumerate() {
                *o = if c[i / inner.max(1)] { x[i] } else { y[i] };
            }
        } else {
            for_each_broadcast(&c, &cd, &out_dims, |i, cv| out[i] = if cv { x[i] } else { y[i] });
        }
        Ok(())
    })
}
