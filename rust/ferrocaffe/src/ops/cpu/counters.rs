//! Iteration counters and synchronisation blobs: Iter, AtomicIter, CreateMutex,
//! CreateAtomicBool, ConditionalSetAtomicBool, CheckAtomicBool, and the Counter ops
//! (CreateCounter, ResetCounter, CountUp, CountDown, RetrieveCount).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::Tensor;
use crate::workspace::Blob;
use crate::{bail, err};

/// Registers the counters family.
pub fn register(r: &mut Registry) {
    r.cpu("Iter", |_| Ok(Box::new(FnOp(iter_kernel))));
    r.cpu("AtomicIter", |_| Ok(Box::new(FnOp(atomic_iter_kernel))));
    r.cpu("CreateMutex", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            *ctx.output_blob(0)? = Blob::Mutex(Arc::new(Mutex::new(())));
            Ok(())
        })))
    });
    r.cpu("CreateAtomicBool", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            *ctx.output_blob(0)? = Blob::AtomicBool(Arc::new(AtomicBool::new(false)));
            Ok(())
        })))
    });
    r.cpu("ConditionalSetAtomicBool", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let flag = atomic_bool(ctx, 0)?;
            let cond = ctx.input(1)?;
            if cond.as_slice::<bool>()?.first().copied().unwrap_or(false) {
                flag.store(true, Ordering::SeqCst);
            }
            Ok(())
        })))
    });
    r.cpu("CheckAtomicBool", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let v = atomic_bool(ctx, 0)?.load(Ordering::SeqCst);
            ctx.output(0)?.ensure::<bool>(&[1])[0] = v;
            Ok(())
        })))
    });
    r.cpu("CreateCounter", create_counter);
    r.cpu("ResetCounter", create_reset_counter);
    r.cpu("CountUp", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let prev = counter(ctx)?.fetch_add(1, Ordering::SeqCst);
            write_scalar(ctx, 0, prev)
        })))
    });
    r.cpu("CountDown", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let prev = counter(ctx)?.fetch_sub(1, Ordering::SeqCst);
            if ctx.num_outputs() > 0 {
                ctx.output(0)?.ensure::<bool>(&[])[0] = prev <= 0;
            }
            Ok(())
        })))
    });
    r.cpu("RetrieveCount", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            let v = counter(ctx)?.load(Ordering::SeqCst);
            write_scalar(ctx, 0, v)
        })))
    });
}

fn increment(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = ctx.output(0)?;
    if out.numel() != 1 {
        bail!(op = ctx, ShapeMismatch: "The output of IterOp exists, but not of the right size.");
    }
    let v = out
        .as_mut_slice::<i64>()
        .map_err(|e| err!(DtypeMismatch: "Iter expects an int64 counter: {e}"))?;
    if v[0] < 0 {
        bail!(BadArgument: "Previous iteration number is negative.");
    }
    if v[0] == i64::MAX {
        bail!(Runtime: "Overflow will happen!");
    }
    v[0] += 1;
    Ok(())
}

fn iter_kernel(ctx: &mut OpContext<'_>) -> Result<()> {
    if ctx.num_inputs() == 0 && !ctx.output_blob(0)?.is_tensor() {
        *ctx.output_blob(0)? = Blob::Tensor(Tensor::from_vec(&[1], vec![0i64])?);
    }
    increment(ctx)
}

fn atomic_iter_kernel(ctx: &mut OpContext<'_>) -> Result<()> {
    let m = match ctx.input_blob(0)? {
        Blob::Mutex(m) => m.clone(),
        other => {
            bail!(
                op = ctx,
                DtypeMismatch: "AtomicIter expects a mutex in '{}', found {}",
                ctx.input_name(0),
                other.type_name()
            )
        }
    };
    let _g = m.lock();
    increment(ctx)
}

fn atomic_bool(ctx: &OpContext<'_>, i: usize) -> Result<Arc<AtomicBool>> {
    match ctx.input_blob(i)? {
        Blob::AtomicBool(b) => Ok(b.clone()),
        other => Err(err!(
            op = ctx,
            DtypeMismatch: "expected an atomic bool in '{}', found {}",
            ctx.input_name(i),
            other.type_name()
        )),
    }
}

fn counter(ctx: &OpContext<'_>) -> Result<Arc<AtomicI64>> {
    match ctx.input_blob(0)? {
        Blob::Counter(c) => Ok(c.clone()),
        other => Err(err!(
            op = ctx,
            DtypeMismatch: "expected a counter in '{}', found {}",
            ctx.input_name(0),
            other.type_name()
        )),
    }
}

fn write_scalar(ctx: &mut OpContext<'_>, j: usize, v: i64) -> Result<()> {
    if ctx.num_outputs() > j {
        ctx.output(j)?.ensure::<i64>(&[])[0] = v;
    }
    Ok(())
}

fn create_counter(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let init_count = init.args.int("init_count", 0)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        *ctx.output_blob(0)? = Blob::Counter(Arc::new(AtomicI64::new(init_count)));
        Ok(())
    })))
}

fn create_reset_counter(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let init_count = init.args.int("init_count", 0)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let prev = counter(ctx)?.swap(init_count, Ordering::SeqCst);
        write_scalar(ctx, 0, prev)
    })))
}
