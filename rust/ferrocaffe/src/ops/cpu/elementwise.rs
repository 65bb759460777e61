//! Helpers for elementwise kernels that may run in place: they resize output 0, then loop over
//! raw pointers so an input that is also the output is read before being overwritten.
//!
//! Kernel writers: use [`unary`], [`binary`] and [`nary_same_shape`] for in-place-capable
//! elementwise ops; [`dispatch!`](crate::dispatch) picks the Rust type for a [`DataType`].

use super::broadcast::binary_loop;
use super::par::for_each_chunk;
use crate::blas::part_len;
use crate::error::{Error, Result};
use crate::ops::operator::OpContext;
use crate::tensor::{DataType, Element};
use crate::threads::run_parts;
use crate::{bail, err};

/// Runs `$body` with the type alias `$T` bound to the Rust type of `$dtype`, for the listed
/// data types; other types give an error naming the op's type list.
///
/// ```
/// use ferrocaffe::dispatch;
/// use ferrocaffe::tensor::DataType;
///
/// fn size_of(dtype: DataType) -> ferrocaffe::Result<usize> {
///     dispatch!(dtype, [Float => f32, Int64 => i64], |T| Ok(std::mem::size_of::<T>()))
/// }
/// assert_eq!(size_of(DataType::Float).unwrap(), 4);
/// assert_eq!(size_of(DataType::Int64).unwrap(), 8);
/// assert!(size_of(DataType::Bool).is_err());
/// ```
#[macro_export]
macro_rules! dispatch {
    ($dtype:expr, [$($d:ident => $t:ty),* $(,)?], |$T:ident| $body:expr) => {{
        #[allow(unreachable_patterns)]
        match $dtype {
            $($crate::tensor::DataType::$d => {
                #[allow(dead_code)]
                type $T = $t;
                $body
            })*
            other => Err($crate::err!(
                DtypeMismatch: "Unsupported input type {other}; this op supports: {}",
                [$(stringify!($t)),*].join(", ")
            )),
        }
    }};
}

/// Dims and dtype of input `i` (read through the output when the op runs in place).
pub fn input_meta(ctx: &OpContext<'_>, i: usize) -> Result<(Dims, DataType)> {
    let t = ctx.input(i)?;
    Ok((Dims::from_slice(t.dims()), t.dtype()))
}

/// Input `i`'s dtype (no copy of its dims: per-op overhead counts on chains of tiny ops).
pub fn input_dtype(ctx: &OpContext<'_>, i: usize) -> Result<DataType> {
    Ok(ctx.input(i)?.dtype())
}

/// Dims copied out of a tensor without a heap allocation up to 6-d.
pub type Dims = smallvec::SmallVec<[usize; 6]>;

fn type_mismatch(ctx: &OpContext<'_>, i: usize, want: DataType, got: DataType) -> Error {
    err!(
        op = ctx,
        DtypeMismatch: "Tensor type mismatch, caller expects elements to be {want} while tensor \
         '{}' (input {i}) contains {got}",
        ctx.input_name(i)
    )
}

/// Work counted per value of [`unary`] (a compare or an add) and of [`unary_slices`] (its
/// kernels evaluate a polynomial per value), for [`for_each_chunk`]: large inputs are cut in
/// parts shared out to the team of compute threads. Each value is computed alone, so the
/// parts do not change any result.
const UNARY_WORK: usize = 1;
const SLICES_WORK: usize = 8;

/// `y = f(x)` elementwise from input 0 to output 0 (in place when they are one blob).
pub fn unary<A: Element, C: Element>(
    ctx: &mut OpContext<'_>,
    f: impl Fn(A) -> C + Sync,
) -> Result<()> {
    let map = |x: &[A], y: &mut [C]| {
        for_each_chunk(y, 1, UNARY_WORK, &|first, part| {
            for (o, &v) in part.iter_mut().zip(&x[first..]) {
                *o = f(v);
            }
        })
    };
    // The common case first, with one lookup of the input (a chain of tiny ops pays for every
    // lookup); anything else (in place, wrong type, not a tensor) takes the checked path below.
    if !ctx.is_inplace(0, 0) {
        let (ins, mut outs) = ctx.split();
        if let Ok(xt) = ins.tensor(0) {
            if let Ok(x) = xt.as_slice::<A>() {
                map(x, outs.tensor(0)?.ensure::<C>(xt.dims()));
                return Ok(());
            }
        }
    }
    let dt = input_dtype(ctx, 0)?;
    if dt != A::DTYPE {
        return Err(type_mismatch(ctx, 0, A::DTYPE, dt));
    }
    if ctx.is_inplace(0, 0) {
        if A::DTYPE != C::DTYPE {
            bail!(op = ctx, Schema: "this op cannot run in place: input and output types differ");
        }
        let y = ctx.output(0)?.as_mut_slice::<C>()?;
        for_each_chunk(y, 1, UNARY_WORK, &|_, part| {
            let p = part.as_mut_ptr();
            for i in 0..part.len() {
                // SAFETY: i < part.len() elements of one buffer of type C == A.
                unsafe {
                    let v = f(*(p as *const A).add(i));
                    *p.add(i) = v;
                }
            }
        });
        return Ok(());
    }
    let (ins, mut outs) = ctx.split();
    let xt = ins.tensor(0)?;
    let x = xt.as_slice::<A>()?;
    map(x, outs.tensor(0)?.ensure::<C>(xt.dims()));
    Ok(())
}

/// As [`unary`] with a kernel over whole slices, `f(x, y)` (`y` as long as `x`); in place,
/// `f` reads a copy of the input.
pub fn unary_slices<A: Element, C: Element>(
    ctx: &mut OpContext<'_>,
    f: impl Fn(&[A], &mut [C]) + Sync,
) -> Result<()> {
    let (dims, dt) = input_meta(ctx, 0)?;
    if dt != A::DTYPE {
        return Err(type_mismatch(ctx, 0, A::DTYPE, dt));
    }
    let map = |x: &[A], y: &mut [C]| {
        for_each_chunk(y, 1, SLICES_WORK, &|first, part| {
            f(&x[first..first + part.len()], part)
        })
    };
    if ctx.is_inplace(0, 0) {
        if A::DTYPE != C::DTYPE {
            bail!(op = ctx, Schema: "this op cannot run in place: input and output types differ");
        }
        let x = ctx.input(0)?.as_slice::<A>()?.to_vec();
        map(&x, ctx.output(0)?.as_mut_slice::<C>()?);
        return Ok(());
    }
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?.as_slice::<A>()?;
    map(x, outs.tensor(0)?.ensure::<C>(&dims));
    Ok(())
}

/// `c = f(a, b)` from inputs 0, 1 to output 0 with the given (already broadcast-checked) loop
/// shapes; `c_dims` is the output shape, `loop_c` the shape the loop iterates over (same
/// element count).
#[allow(clippy::too_many_arguments)]
pub fn binary<A: Element, B: Element, C: Element>(
    ctx: &mut OpContext<'_>,
    a_dims: &[usize],
    b_dims: &[usize],
    loop_c: &[usize],
    c_dims: &[usize],
    f: impl Fn(A, B) -> C,
) -> Result<()> {
    let ta = ctx.input(0)?.dtype();
    if ta != A::DTYPE {
        return Err(type_mismatch(ctx, 0, A::DTYPE, ta));
    }
    let tb = ctx.input(1)?.dtype();
    if tb != B::DTYPE {
        return Err(type_mismatch(ctx, 1, B::DTYPE, tb));
    }
    let alias_a = ctx.is_inplace(0, 0);
    let alias_b = ctx.is_inplace(1, 0);
    let n_c: usize = c_dims.iter().product();
    if alias_a && (A::DTYPE != C::DTYPE || a_dims.iter().product::<usize>() != n_c) {
        bail!(
            op = ctx,
            ShapeMismatch: "cannot compute in place: output shape {c_dims:?} differs from input 0's"
        );
    }
    if alias_b && (B::DTYPE != C::DTYPE || b_dims.iter().product::<usize>() != n_c) {
        bail!(
            op = ctx,
            ShapeMismatch: "cannot compute in place: output shape {c_dims:?} differs from input 1's"
        );
    }
    let (ins, mut outs) = ctx.split();
    let ap = if alias_a {
        None
    } else {
        Some(ins.tensor(0)?.as_slice::<A>()?.as_ptr())
    };
    let bp = if alias_b {
        None
    } else {
        Some(ins.tensor(1)?.as_slice::<B>()?.as_ptr())
    };
    let c = outs.tensor(0)?;
    c.reset(C::DTYPE, c_dims);
    let cp = c.as_mut_slice::<C>()?.as_mut_ptr();
    let ap = ap.unwrap_or(cp as *const A);
    let bp = bp.unwrap_or(cp as *const B);
    // SAFETY: pointers cover their shapes; an aliased input has the output's shape and type.
    unsafe { binary_loop(ap, a_dims, bp, b_dims, cp, loop_c, f) };
    Ok(())
}

/// `y[i] = f(y[i] so far, x_k[i])` folded over all inputs of one shape (Sum and friends):
/// output 0 gets input 0's values, then each further input is combined in.
pub fn nary_same_shape<T: Element>(
    ctx: &mut OpContext<'_>,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<()> {
    let (dims, dt) = input_meta(ctx, 0)?;
    if dt != T::DTYPE {
        return Err(type_mismatch(ctx, 0, T::DTYPE, dt));
    }
    let n_in = ctx.num_inputs();
    for i in 1..n_in {
        let (d, t) = input_meta(ctx, i)?;
        if d != dims {
            bail!(
                op = ctx,
                ShapeMismatch: "Input #{i}, input dimension:{d:?} should match output dimension: \
                 {dims:?}"
            );
        }
        if t != T::DTYPE {
            return Err(type_mismatch(ctx, i, T::DTYPE, t));
        }
    }
    let aliased: Vec<bool> = (0..n_in).map(|i| ctx.is_inplace(i, 0)).collect();
    let (ins, mut outs) = ctx.split();
    let mut ptrs: Vec<Option<*const T>> = Vec::with_capacity(n_in);
    for (i, &al) in aliased.iter().enumerate() {
        ptrs.push(if al {
            None
        } else {
            Some(ins.tensor(i)?.as_slice::<T>()?.as_ptr())
        });
    }
    let c = outs.tensor(0)?;
    c.reset(T::DTYPE, &dims);
    let cp = c.as_mut_slice::<T>()?.as_mut_ptr();
    let ptrs: Vec<*const T> = ptrs
        .into_iter()
        .map(|p| p.unwrap_or(cp as *const T))
        .collect();
    let n: usize = dims.iter().product();
    let fold = Fold { ptrs, out: cp, f };
    // Ranges of the values shared out to the team when there are enough (each value is folded
    // alone, so the ranges do not change any result).
    let per = part_len(n, n.saturating_mul(n_in));
    if per >= n {
        // SAFETY: every pointer covers n elements.
        unsafe { fold.range(0, n) };
    } else {
        run_parts(n.div_ceil(per), &|i| {
            let start = i * per;
            // SAFETY: `start..start + per` clipped to n lies within every pointer's n
            // elements; the parts' ranges are disjoint.
            unsafe { fold.range(start, (start + per).min(n)) }
        });
    }
    Ok(())
}

/// The pointers of [`nary_same_shape`]: its inputs (any of which may be the output) and its
/// output, and the fold.
struct Fold<T, F> {
    ptrs: Vec<*const T>,
    out: *mut T,
    f: F,
}

// SAFETY: threads fold disjoint ranges of values: each reads its range of every input and
// writes the same range of the output, which no other thread reads or writes.
unsafe impl<T: Element, F: Sync> Sync for Fold<T, F> {}

impl<T: Element, F: Fn(T, T) -> T> Fold<T, F> {
    /// Values `start..end` of the output.
    ///
    /// # Safety
    /// Every pointer covers `end` elements, and no other thread touches `start..end` of the
    /// output meanwhile.
    unsafe fn range(&self, mut start: usize, end: usize) {
        let (ptrs, cp, f) = (&self.ptrs, self.out, &self.f);
        // Blocks of a fixed size through registers: every input of a block is read before the
        // block is written (inputs may alias the output); the fixed size makes the loads, the
        // fold and the store plain vector code (no memcpy calls). Each element is still folded
        // in input order. The tail goes through a stack buffer.
        const LANES: usize = 32;
        while start + LANES <= end {
            // SAFETY: every pointer covers `end` elements of T, so `start..start + LANES` is
            // in bounds; unaligned array reads and writes of Copy elements; no reference to the
            // output exists (it is written through `cp`).
            unsafe {
                let mut acc = std::ptr::read_unaligned(ptrs[0].add(start).cast::<[T; LANES]>());
                for p in &ptrs[1..] {
                    let x = std::ptr::read_unaligned(p.add(start).cast::<[T; LANES]>());
                    for (a, v) in acc.iter_mut().zip(x) {
                        *a = f(*a, v);
                    }
                }
                std::ptr::write_unaligned(cp.add(start).cast::<[T; LANES]>(), acc);
            }
            start += LANES;
        }
        const BLOCK: usize = LANES;
        let mut acc = [T::default(); BLOCK];
        while start < end {
            let len = BLOCK.min(end - start);
            let acc = &mut acc[..len];
            // SAFETY: every pointer covers `end` elements of T; no reference to the output exists
            // while these shared slices live (the output is written through `cp` afterwards).
            unsafe {
                acc.copy_from_slice(std::slice::from_raw_parts(ptrs[0].add(start), len));
                for p in &ptrs[1..] {
                    let x = std::slice::from_raw_parts(p.add(start), len);
                    for (a, &v) in acc.iter_mut().zip(x) {
                        *a = f(*a, v);
                    }
                }
                std::ptr::copy_nonoverlapping(acc.as_ptr(), cp.add(start), len);
            }
            start += len;
        }
    }
}
