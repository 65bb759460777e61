//! Splitting an output into parts run through [`crate::blas::for_each_part`] (in parallel
//! when the work is large enough, see [`crate::blas::part_len`]).

use crate::blas::{for_each_part, part_len};

/// Calls `f(first_unit, chunk)` on consecutive chunks of `out`, each holding whole `unit`-long
/// units (`out.len()` should be a multiple of `unit`; a shorter tail forms its own chunk),
/// where `first_unit` is the index of the chunk's first unit. `work_per_unit` (elements read and
/// written per unit, roughly) decides how many parts run at once. Nothing runs when `out` is
/// empty or `unit` is zero.
#[inline]
pub(crate) fn for_each_chunk<T: Send>(
    out: &mut [T],
    unit: usize,
    work_per_unit: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    if unit == 0 || out.is_empty() {
        return;
    }
    let units = out.len().div_ceil(unit);
    let per = part_len(units, units.saturating_mul(work_per_unit.max(1)));
    if per >= units {
        // One part: run here, without building the list of parts (element-wise ops on a few
        // hundred values come here on every run).
        f(0, out);
        return;
    }
    // per <= units, so per * unit <= out.len() + unit.
    let parts: Vec<(usize, &mut [T])> = out
        .chunks_mut(per.saturating_mul(unit))
        .enumerate()
        .map(|(i, c)| (i.saturating_mul(per), c))
        .collect();
    for_each_part(parts, &|(first, chunk)| f(first, chunk));
}

/// Multiply-adds a core does in the time it moves one value of element-wise work (16: two
/// 8-lane fused multiply-adds a cycle against a load and a store).
const MACS_PER_VALUE: usize = 16;

/// How many of `items` go in each part of compute-bound work of `macs` multiply-adds in all:
/// [`part_len`] with the work counted in element-wise values, so a convolution takes as many
/// threads as an element-wise op that runs as long.
pub(crate) fn macs_part_len(items: usize, macs: usize) -> usize {
    part_len(items, macs / MACS_PER_VALUE)
}

/// How many NCHW planes each part takes when planes are transposed to NHWC and back: whole
/// groups of 8 (a vector of channels) where the planes allow.
pub(crate) fn planes_per_part(planes: usize, work: usize) -> usize {
    let per = part_len(planes, work);
    if per < planes {
        per.div_ceil(8).saturating_mul(8).min(planes)
    } else {
        per
    }
}

/// Work on `N` consecutive channels of an NHWC pixel at once, kept in an `N`-value array
/// (registers): the pooling and depthwise kernels' inner step.
pub(crate) trait ChannelBlock {
    /// Writes channels `c0..c0 + N` of `out`.
    fn block<const N: usize>(&self, c0: usize, out: &mut [f32]);
}

/// Runs `b` over channels `0..c` of `out`: blocks of 32, then 8, then the last channels as one
/// more 8-block overlapping the previous one (the channels computed twice get the same values),
/// or one by one when there are fewer than 8 in all.
#[inline(always)]
pub(crate) fn channel_blocks<B: ChannelBlock>(b: &B, c: usize, out: &mut [f32]) {
    let mut c0 = 0;
    while c0 + 32 <= c {
        b.block::<32>(c0, out);
        c0 += 32;
    }
    while c0 + 8 <= c {
        b.block::<8>(c0, out);
        c0 += 8;
    }
    if c0 < c && c >= 8 {
        b.block::<8>(c - 8, out);
    } else {
        for ch in c0..c {
            b.block::<1>(ch, out);
        }
    }
}

/// A copy of input `i` when that blob is also an output of the op (the kernel then reads the
/// copy while it writes the output), else `None`.
pub(crate) fn copy_if_inplace(
    ctx: &crate::ops::operator::OpContext<'_>,
    i: usize,
) -> crate::error::Result<Option<Vec<f32>>> {
    if !(0..ctx.num_outputs()).any(|j| ctx.is_inplace(i, j)) {
        return Ok(None);
    }
    let v = ctx.input(i)?.as_slice::<f32>()?;
    let mut out = crate::error::try_vec(v.len(), 0f32, "copy of an in-place input")?;
    out.copy_from_slice(v);
    Ok(Some(out))
}

/// An output written by several threads at once, each at places no other writes: for kernels
/// whose parts' outputs are not one slice each (a Winograd tile's pixels, a run of pixels of
/// every NCHW channel), which `chunks_mut` cannot hand out.
pub(crate) struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: the creator of a SharedOut promises (see `new`) that no element is written by two
// threads, and the borrow keeps the slice alive and otherwise untouched while it is shared.
unsafe impl Send for SharedOut<'_> {}
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    /// # Safety
    /// Until it is dropped, no element may be written through two of the threads that use it
    /// (its parts write disjoint elements).
    pub(crate) unsafe fn new(out: &'a mut [f32]) -> Self {
        SharedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _out: std::marker::PhantomData,
        }
    }

    /// `out[at + i] = f(vals[i])` for every `i`.
    ///
    /// # Panics
    /// When that passes the end (which the callers' geometry rules out; a kernel bug fails
    /// the op rather than leave values unwritten).
    #[inline(always)]
    pub(crate) fn write_with(&self, at: usize, vals: &[f32], f: impl Fn(f32) -> f32) {
        assert!(
            at.checked_add(vals.len()).is_some_and(|e| e <= self.len),
            "shared output written past its end"
        );
        // SAFETY: in bounds (above); no other thread writes these elements (the promise of
        // `new`), and nothing reads them while the parts run.
        let out = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), vals.len()) };
        for (o, &v) in out.iter_mut().zip(vals) {
            *o = f(v);
        }
    }

    /// `out[i] = v` (see [`SharedOut::write_with`]).
    #[inline(always)]
    pub(crate) fn set(&self, i: usize, v: f32) {
        self.write_with(i, &[v], |x| x);
    }
}
