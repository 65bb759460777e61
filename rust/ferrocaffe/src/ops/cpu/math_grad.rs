//! Gradient ops of the arithmetic family: AddGradient, SubGradient, MulGradient, DivGradient
//! (inputs `dC, A, B` — Div also `C` — outputs `dA, dB`, reduced over broadcast dimensions, with
//! the forward op's `broadcast`/`axis` arguments), AbsGradient and CopyOnDeviceLike.

use super::broadcast::for_each_index;
use super::elementwise::{binary, input_meta};
use super::math::BroadcastArgs;
use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the arithmetic gradient ops.
pub fn register(r: &mut Registry) {
    r.cpu("AddGradient", |i| create(i, Kind::Add));
    r.cpu("SubGradient", |i| create(i, Kind::Sub));
    r.cpu("MulGradient", |i| create(i, Kind::Mul));
    r.cpu("DivGradient", |i| create(i, Kind::Div));
    r.cpu("AbsGradient", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let (xd, _) = input_meta(ctx, 0)?;
            let (gd, _) = input_meta(ctx, 1)?;
            if xd != gd {
                bail!(op = ctx, ShapeMismatch: "X {xd:?} and dY {gd:?} must have the same shape");
            }
            binary::<f32, f32, f32>(ctx, &xd, &gd, &xd, &xd, |x, g| {
                if x > 0.0 {
                    g
                } else if x < 0.0 {
                    -g
                } else {
                    0.0
                }
            })
        })))
    });
    r.cpu("CopyOnDeviceLike", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            if ctx.is_inplace(0, 0) {
                return Ok(());
            }
            let (ins, mut outs) = ctx.split();
            let src = ins.tensor(0)?;
            outs.tensor(0)?.copy_from(src);
            Ok(())
        })))
    });
}

#[derive(Clone, Copy)]
enum Kind {
    Add,
    Sub,
    Mul,
    Div,
}

fn create(init: &OpInit<'_>, kind: Kind) -> Result<Box<dyn Operator>> {
    let bc = BroadcastArgs::new(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        run(ctx, bc, kind)
    })))
}

fn run(ctx: &mut OpContext<'_>, bc: BroadcastArgs, kind: Kind) -> Result<()> {
    if (0..ctx.num_inputs()).any(|i| (0..ctx.num_outputs()).any(|j| ctx.is_inplace(i, j))) {
        bail!(op = ctx, Schema: "arithmetic gradient ops cannot run in place");
    }
    let a_dims = ctx.input(1)?.dims().to_vec();
    let b_dims = ctx.input(2)?.dims().to_vec();
    let (la, lb, lc, c_dims) = bc.shapes_of(&a_dims, &b_dims)?;
    let (ins, mut outs) = ctx.split();
    let dc = ins.tensor(0)?;
    if dc.dims() != c_dims.as_slice() {
        bail!(ShapeMismatch: "dC has shape {:?}, the forward output had {c_dims:?}", dc.dims());
    }
    let dc = dc.as_slice::<f32>()?;
    let a = ins.tensor(1)?.as_slice::<f32>()?;
    let b = ins.tensor(2)?.as_slice::<f32>()?;
    let c = match kind {
        Kind::Div => Some(ins.tensor(3)?.as_slice::<f32>()?),
        _ => None,
    };
    let mut da = vec![0f32; a.len()];
    let mut db = vec![0f32; b.len()];
    match kind {
        Kind::Add => for_each_index(&la, &lb, &lc, |i, ia, ib| {
            da[ia] += dc[i];
            db[ib] += dc[i];
        }),
        Kind::Sub => for_each_index(&la, &lb, &lc, |i, ia, ib| {
            da[ia] += dc[i];
            db[ib] -= dc[i];
        }),
        Kind::Mul => for_each_index(&la, &lb, &lc, |i, ia, ib| {
            da[ia] += dc[i] * b[ib];
            db[ib] += dc[i] * a[ia];
        }),
        Kind::Div => {
            let c = c.unwrap_or(&[]);
            if c.len() != dc.len() {
                bail!(ShapeMismatch: "DivGradient: C must have the shape of dC");
            }
            for_each_index(&la, &lb, &lc, |i, ia, ib| {
                da[ia] += dc[i] / b[ib];
                db[ib] -= dc[i] * c[i] / b[ib];
            })
        }
    }
    outs.tensor(0)?.ensure::<f32>(&a_dims).copy_from_slice(&da);
    if outs.len() > 1 {
        outs.tensor(1)?.ensure::<f32>(&b_dims).copy_from_slice(&db);
    }
    Ok(())
}
