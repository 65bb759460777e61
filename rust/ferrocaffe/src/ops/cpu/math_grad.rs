//! Gradient ops of the arithmetic family: AddGradient, SubGradient, MulGradient, DivGradient
//! (inputs `dC, A, B` — Div also `C` — outputs `dA, dB`, reduced over broadcast dimensions, with
//! the forward op's `broadcast`/`axis` arguments; DivGradient also takes the older `B, C, dC`;
//! `dA` may be written over `dC`), AbsGradient and CopyOnDeviceLike.

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
    // DivGradient also takes Caffe2's older three inputs (B, C, dC): A has C's shape.
    let legacy_div = matches!(kind, Kind::Div) && ctx.num_inputs() == 3;
    let (i_dc, i_b) = if legacy_div { (2, 0) } else { (0, 2) };
    let i_c = match kind {
        Kind::Div if legacy_div => Some(1),
        Kind::Div => Some(3),
        _ => None,
    };
    // A, or in the legacy Div form C, which has A's shape.
    let a_dims = ctx.input(1)?.dims().to_vec();
    let b_dims = ctx.input(i_b)?.dims().to_vec();
    let (la, lb, lc, c_dims) = bc.shapes_of(&a_dims, &b_dims)?;
    // An output may share a blob with an input (dA written over dC when the forward op ran
    // in place): such inputs are read from copies.
    let n_in = ctx.num_inputs();
    let aliased = (0..n_in).any(|i| (0..ctx.num_outputs()).any(|j| ctx.is_inplace(i, j)));
    let mut owned = Vec::new();
    if aliased {
        for i in 0..n_in {
            owned.push(ctx.input(i)?.as_slice::<f32>()?.to_vec());
        }
    }
    let dc_dims = ctx.input(i_dc)?.dims().to_vec();
    if dc_dims != c_dims {
        bail!(
            op = ctx,
            ShapeMismatch: "dC has shape {dc_dims:?}, the forward output had {c_dims:?}"
        );
    }
    let (ins, mut outs) = ctx.split();
    let mut vals: Vec<&[f32]> = Vec::with_capacity(n_in);
    for i in 0..n_in {
        vals.push(match owned.get(i) {
            Some(v) => v.as_slice(),
            None => ins.tensor(i)?.as_slice::<f32>()?,
        });
    }
    let dc = vals[i_dc];
    let b = vals[i_b];
    // Only Mul reads A (the legacy Div form has none).
    let a = if legacy_div { &[][..] } else { vals[1] };
    let c = i_c.map(|i| vals[i]);
    let mut da = vec![0f32; a_dims.iter().product()];
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
