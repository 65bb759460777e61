//! Matrix products: MatMul (2-d after flattening at `axis_a` / `axis_b`, optional transposes;
//! a third input, as its gradient ops pass, gives the output that input's shape)
//! and BatchMatMul (batched over leading dims; `broadcast=1` gives numpy `matmul` rules,
//! including 1-d operands).

use super::broadcast::{broadcast_dims, for_each_index};
use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("MatMul", create_matmul);
    r.cpu("BatchMatMul", create_batch);
}

fn canonical(axis: i64, nd: usize) -> Result<usize> {
    let a = if axis < 0 { axis + nd as i64 } else { axis };
    if a < 0 || a > nd as i64 {
        bail!(BadArgument: "axis {axis} out of range for {nd} dimensions");
    }
    Ok(a as usize)
}

fn create_matmul(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axis_a = init.args.int("axis_a", 1)?;
    let axis_b = init.args.int("axis_b", 1)?;
    let trans_a = init.args.bool("trans_a", false)?;
    let trans_b = init.args.bool("trans_b", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let a = ins.tensor(0)?;
        let b = ins.tensor(1)?;
        let (ka, kb) = (canonical(axis_a, a.ndim())?, canonical(axis_b, b.ndim())?);
        let (a_rows, a_cols) = (a.size_to_dim(ka), a.size_from_dim(ka));
        let (b_rows, b_cols) = (b.size_to_dim(kb), b.size_from_dim(kb));
        let (m, k) = if trans_a {
            (a_cols, a_rows)
        } else {
            (a_rows, a_cols)
        };
        let (k2, n) = if trans_b {
            (b_cols, b_rows)
        } else {
            (b_rows, b_cols)
        };
        if k != k2 {
            bail!(
                ShapeMismatch: "Matrix dimension mismatch: A {:?} gives K = {k}, B {:?} gives K = \
                 {k2}",
                a.dims(),
                b.dims()
            );
        }
        let (av, bv) = (a.as_slice::<f32>()?, b.as_slice::<f32>()?);
        // A third input (as gradient ops pass) gives the output its shape.
        let shape_like = if ins.len() > 2 {
            Some(ins.tensor(2)?.dims().to_vec())
        } else {
            None
        };
        let out = outs.tensor(0)?;
        gemm.sgemm(
            trans_a,
            trans_b,
            m,
            n,
            k,
            1.0,
            av,
            bv,
            0.0,
            out.ensure::<f32>(&[m, n]),
        );
        if let Some(d) = shape_like {
            out.reshape(&d)?;
        }
        Ok(())
    })))
}

fn create_batch(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let trans_a = init.args.bool("trans_a", false)?;
    let trans_b = init.args.bool("trans_b", false)?;
    let broadcast = init.args.bool("broadcast", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let a = ins.tensor(0)?;
        let b = ins.tensor(1)?;
        let (mut ad, mut bd) = (a.dims().to_vec(), b.dims().to_vec());
        if !broadcast {
            if ad.len() != bd.len() || ad.len() < 2 {
                bail!(
                    ShapeMismatch: "BatchMatMul without broadcast needs A and B of one rank >= 2, \
                     got {ad:?} and {bd:?}"
                );
            }
            if ad[..ad.len() - 2] != bd[..bd.len() - 2] {
                bail!(
                    ShapeMismatch: "BatchMatMul batch dimensions differ: {ad:?} vs {bd:?} (set \
                     broadcast=1?)"
                );
            }
        }
        let (a1, b1) = (ad.len() == 1, bd.len() == 1);
        if a1 {
            ad.insert(0, 1);
        }
        if b1 {
            bd.push(1);
        }
        if ad.len() < 2 || bd.len() < 2 {
            bail!(ShapeMismatch: "BatchMatMul inputs must not be 0-d");
        }
        let (ra, ca) = (ad[ad.len() - 2], ad[ad.len() - 1]);
        let (rb, cb) = (bd[bd.len() - 2], bd[bd.len() - 1]);
        let (m, k) = if trans_a && !a1 { (ca, ra) } else { (ra, ca) };
        let (k2, n) = if trans_b && !b1 { (cb, rb) } else { (rb, cb) };
        if k != k2 {
            bail!(
                ShapeMismatch: "BatchMatMul: A {:?} and B {:?} disagree on K ({k} vs {k2})",
                a.dims(),
                b.dims()
            );
        }
        let batch_a = &ad[..ad.len() - 2];
        let batch_b = &bd[..bd.len() - 2];
        let batch = broadcast_dims(batch_a, batch_b)?;
        let mut y_dims = batch.clone();
        if !a1 {
            y_dims.push(m);
        }
        if !b1 {
            y_dims.push(n);
        }
        let (av, bv) = (a.as_slice::<f32>()?, b.as_slice::<f32>()?);
        let y = outs.tensor(0)?.ensure::<f32>(&y_dims);
        let (sa, sb, sy) = (m * k, k * n, m * n);
        let mut pairs = Vec::new();
        for_each_index(batch_a, batch_b, &batch, |i, ia, ib| {
            pairs.push((i, ia, ib))
        });
        for (i, ia, ib) in pairs {
            gemm.sgemm(
                trans_a && !a1,
                trans_b && !b1,
                m,
                n,
                k,
                1.0,
                &av[ia * sa..(ia + 1) * sa],
                &bv[ib * sb..(ib + 1) * sb],
                0.0,
                &mut y[i * sy..(i + 1) * sy],
            );
        }
        Ok(())
    })))
}
