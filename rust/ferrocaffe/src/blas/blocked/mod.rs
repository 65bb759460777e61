//! This crate's own cache-blocked GEMM for products too large for the small-dimension kernels
//! ([`super::small`]), on AVX2 with FMA: FC and MatMul layers, convolutions' im2col products.
//!
//! Why not only the `gemm` crate: its kernels are as fast as OpenBLAS's on one thread, but
//! it packs (copies into its kernel's layout) the operands of every call it is given, so a
//! product split across threads as independent calls packs the operand it does not split
//! once per thread. That cost grows with the thread count and is what left FC behind
//! numpy's OpenBLAS on two cores. Here one product is one job for the team of compute threads
//! ([`crate::threads`]), and every block of either operand is packed once, by whichever
//! thread needs it first:
//!
//! - `C` is cut in tiles of `mc x nc` ([`Plan`]), taken by the threads as they go; a tile
//!   runs over the inner dimension in chunks of `kc`, each a pass of the [`avx2`] micro-kernel
//!   over `MR x NR` sub-tiles (the classic blocking: a `kc x NR` panel of `B` stays in L1, the
//!   `mc x kc` block of `A` in L2, the `kc x nc` block of `B` in the shared cache);
//! - a row-major `A` (not transposed: FC's input, an NHWC convolution's columns) is read in
//!   place (unless its rows are 4 KiB apart, [`ALIASING_STRIDE`], and it fits [`MAX_PACKED`]),
//!   its rows a panel at a time (the last panel, when short, copied): against packing
//!   it, measured interleaved on 2 cores, 1.6x faster at `3136 x 64 x 576` (an NHWC
//!   convolution, each element of `A` serving only 64 multiply-adds), 1.2x at `256^3`, equal
//!   at `1024^3` and `2048^3`; a transposed `A` is packed;
//! - the packed blocks live in one buffer of the calling thread (kept between calls up to
//!   [`KEEP`]); each block is cut in slices of a few panels with an atomic state (to pack,
//!   being packed, packed). A thread that needs a block packs the slices nobody has taken,
//!   then waits for the ones other threads are packing: every thread that waits waits for a
//!   thread that is running, so no barrier is needed and a late or absent helper costs
//!   nothing (the caller alone runs every tile when the team is busy).
//!
//! Each element of `C` is the same sequence of FMA chains (one per `kc` chunk, in order)
//! whatever the tiling or the thread count, so results do not depend on either.
//! On CPUs with AVX-512 the [`avx512`] kernel runs (two of the AVX2 kernel's panels at once, on
//! the same packed layouts). Measured on a 16-core Xeon with AVX-512 (`bench_runtime.py --only
//! fc`, worst of 5): FC 1.65-1.92x numpy's OpenBLAS at 256-2048 on 16 cores, where the `gemm`
//! crate's AVX-512 kernels, split as independent calls, ran 0.6-1.0x and this AVX2 kernel
//! 0.82-1.0x at 2048-4096 (its half-width FMAs); on 2 of those cores 1.01-1.43x (two rounds).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::threads::{self, run_parts};

mod avx2;
mod avx512;
mod pack;

/// Rows of a micro-tile.
pub(super) const MR: usize = 6;
/// Columns of a micro-tile (two 8-lane vectors).
pub(super) const NR: usize = 16;
/// Largest chunk of the inner dimension: a `KC x NR` panel of `B` (16 KiB) fits L1.
const KC: usize = 256;
/// Largest tile height: a `MC x KC` block of `A` (144 KiB) fits L2.
const MC: usize = 144;
/// Largest tile width: the tile of `C` (`MC x NC`, 288 KiB) stays in L2 between the passes
/// of the inner chunks, beside the block of `A`. Measured against 2048 and 1024 on 2 cores
/// (interleaved, two runs): 3-10% faster than 2048 at `1024^3`, `1500^3` and `2048^3`, and
/// level with 1024.
const NC: usize = 512;
/// Panels per packing slice, for `A` and `B`: the unit threads share the packing in.
const A_SLICE: usize = 4;
const B_SLICE: usize = 8;
/// A row-major `A` whose rows are a multiple of this many floats (4 KiB) apart is packed
/// anyway: read in place, the six rows of a panel fall in one set of an 8-way 32 KiB L1 (as do
/// the rows of C), and evict each other. Packing it was faster at `1024^3` and `2048^3` in 8 of
/// 9 interleaved runs on 2 cores (1-5%).
const ALIASING_STRIDE: usize = 1024;
/// Tiles at most this many columns wide (NHWC convolutions' output channels) run each A panel
/// against all their B panels before the next A panel, so that the A panel (read in place,
/// rows far apart) stays in L1: faster in 11 of 12 interleaved runs on 2 cores, by 0-5%
/// (`512x64x576` +3-5%, `2048x64x576` +2%). Wider tiles keep each B panel in L1 instead.
const NARROW: usize = 4 * NR;
/// Products of at least this many multiply-adds are cut in tiles for the team.
const PARALLEL_MNK: usize = 1 << 18;
/// Tiles per thread aimed at when cutting (so that a slower thread leaves little to wait for).
const TILES_PER_THREAD: usize = 3;
/// The packed operands of one product may take at most this many floats (136 MiB: a `4096^3`
/// product's two operands with their padding, which ran 8-11% faster than with A read in place,
/// buffer allocation included, A/B on 2 cores); larger products read A in place, or run on the
/// `gemm` crate, which packs a block at a time, when B alone does not fit.
const MAX_PACKED: usize = (1 << 25) + (1 << 21);
/// The calling thread keeps its packing buffer between products up to this many floats
/// (64 MiB, with room for padding: two 2048 x 2048 operands packed, or one 4096 x 4096); a
/// larger one is freed after the product. Allocating it again each time cost a 2048^3 FC
/// 15-25% on 16 cores (measured on a 16-core Xeon).
const KEEP: usize = (1 << 24) + (1 << 16);

/// The environment variable that overrides the kernel choice: `avx2` runs the AVX2 kernel
/// even where AVX-512 is available (to measure one against the other), `off` runs every
/// product on the `gemm` crate; unset (or anything else), [`isa`] picks the widest kernel the
/// CPU has.
pub(super) const BLOCKED_VAR: &str = "FERROCAFFE_BLOCKED";

/// The micro-kernels: [`avx2`] (`6 x 16`) and [`avx512`] (`6 x 32`, AVX2's for a last
/// single panel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isa {
    Avx2,
    Avx512,
}

/// The kernels this CPU can run, narrowest first.
pub(super) fn available() -> Vec<Isa> {
    let mut out = Vec::new();
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        out.push(Isa::Avx2);
        if std::arch::is_x86_feature_detected!("avx512f") {
            out.push(Isa::Avx512);
        }
    }
    out
}

/// The kernel products run on: the widest [`available`], unless [`BLOCKED_VAR`] says
/// otherwise; `None` (the `gemm` crate) where none is. Read once.
pub(super) fn isa() -> Option<Isa> {
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    *ISA.get_or_init(|| {
        let all = available();
        let mode = std::env::var(BLOCKED_VAR).unwrap_or_default();
        match mode.trim().to_ascii_lowercase().as_str() {
            "off" | "0" => None,
            "avx2" => all.first().copied(),
            _ => all.last().copied(),
        }
    })
}

/// A matrix as (first element, row stride, column stride) of its `op()` view.
pub(super) struct View {
    pub(super) ptr: *const f32,
    pub(super) rs: isize,
    pub(super) cs: isize,
}

impl View {
    /// Element `(i, j)`.
    ///
    /// # Safety
    /// `(i, j)` lies inside the matrix.
    pub(super) unsafe fn at(&self, i: usize, j: usize) -> *const f32 {
        // SAFETY: as the caller says.
        unsafe { self.ptr.offset(i as isize * self.rs + j as isize * self.cs) }
    }
}

/// What a micro-tile does with its products: the first `kc` chunk stores
/// `alpha * AB + beta * C + bias` (`beta == 0` does not read `C`), later chunks add
/// `alpha * AB` to `C`.
pub(super) struct Epilogue {
    pub(super) alpha: f32,
    pub(super) beta: f32,
    pub(super) accumulate: bool,
    /// The bias of the tile's first column (one value per column of `C`), or null.
    pub(super) bias: *const f32,
}

/// How one product is cut: tiles of `mc x nc`, inner chunks of `kc` (the last of each
/// shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    m: usize,
    n: usize,
    k: usize,
    mc: usize,
    nc: usize,
    kc: usize,
    mb: usize,
    nb: usize,
    kb: usize,
}

impl Plan {
    fn new(m: usize, n: usize, k: usize, threads: usize) -> Plan {
        let kb = k.div_ceil(KC).max(1);
        let kc = k.div_ceil(kb).max(1);
        let (mut mb, mut nb) = (m.div_ceil(MC), n.div_ceil(NC));
        let parallel = m.saturating_mul(n).saturating_mul(k) >= PARALLEL_MNK;
        let target = if parallel {
            threads.saturating_mul(TILES_PER_THREAD)
        } else {
            1
        };
        // Cut the longer side of the tiles until there are enough for the team.
        while mb * nb < target {
            let (h, w) = (m.div_ceil(mb), n.div_ceil(nb));
            if h >= w && h > 2 * MR {
                mb += 1;
            } else if w > 2 * NR {
                nb += 1;
            } else if h > 2 * MR {
                mb += 1;
            } else {
                break;
            }
        }
        let mc = m.div_ceil(mb).next_multiple_of(MR);
        let nc = n.div_ceil(nb).next_multiple_of(NR);
        Plan {
            m,
            n,
            k,
            mc,
            nc,
            kc,
            mb: m.div_ceil(mc),
            nb: n.div_ceil(nc),
            kb,
        }
    }

    /// Rows of tile row `ib`, padded to whole panels.
    fn padded_rows(&self, ib: usize) -> usize {
        (self.m - ib * self.mc).min(self.mc).next_multiple_of(MR)
    }

    /// Columns of tile column `jb`, padded to whole panels.
    fn padded_cols(&self, jb: usize) -> usize {
        (self.n - jb * self.nc).min(self.nc).next_multiple_of(NR)
    }

    /// The inner chunk `pb`: its first index and length.
    fn chunk(&self, pb: usize) -> (usize, usize) {
        let p0 = pb * self.kc;
        (p0, (self.k - p0).min(self.kc))
    }

    /// Floats of the packed `A` (all tile rows) and `B` (all tile columns).
    fn packed_lens(&self) -> Option<(usize, usize)> {
        let a = self.mb.checked_mul(self.mc)?.checked_mul(self.k)?;
        let b = self.nb.checked_mul(self.nc)?.checked_mul(self.k)?;
        Some((a, b))
    }

    /// Slices per packed block of `A` and of `B`, at most.
    fn slices(&self) -> (usize, usize) {
        (
            (self.mc / MR).div_ceil(A_SLICE),
            (self.nc / NR).div_ceil(B_SLICE),
        )
    }
}

thread_local! {
    /// The calling thread's packing buffer, kept between products (up to [`KEEP`]).
    static BUFFER: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Slice states.
const TO_PACK: u8 = 0;
const PACKING: u8 = 1;
const PACKED: u8 = 2;

/// One product as the threads share it.
struct Job {
    plan: Plan,
    a: View,
    b: View,
    c: *mut f32,
    alpha: f32,
    beta: f32,
    bias: *const f32,
    /// Null when A is read in place (row-major A, see the module docs).
    packed_a: *mut f32,
    packed_b: *mut f32,
    a_state: Vec<AtomicU8>,
    b_state: Vec<AtomicU8>,
    /// Micro-tiles of two panels on the AVX-512 kernel.
    wide: bool,
}

// SAFETY: the threads read A, B and the bias, write disjoint tiles of C, and write each
// packed slice once (claimed through its state) before anyone reads it (published through
// the same state).
unsafe impl Sync for Job {}

impl Job {
    /// Packs (or waits for) block `(ib, pb)` of `A`; returns its start.
    fn a_block(&self, ib: usize, pb: usize) -> *const f32 {
        let p = &self.plan;
        let (p0, kc) = p.chunk(pb);
        let rows = p.padded_rows(ib);
        // SAFETY: blocks of tile row `ib` start at `ib * mc * k` and follow each other in
        // chunk order, `rows * kc` each: inside the buffer sized by `packed_lens`.
        let start = unsafe { self.packed_a.add(ib * p.mc * p.k + p0 * rows) };
        let per = p.slices().0;
        let states = &self.a_state[(ib * p.kb + pb) * per..][..per];
        let panels = rows / MR;
        share_packing(states, panels, A_SLICE, |range| {
            // SAFETY: a claimed slice of this block; rows below `m` lie in A.
            unsafe { pack::a_panels(&self.a, p.m, ib * p.mc, p0, kc, range, start) }
        });
        start
    }

    /// Packs (or waits for) block `(pb, jb)` of `B`; returns its start.
    fn b_block(&self, pb: usize, jb: usize) -> *const f32 {
        let p = &self.plan;
        let (p0, kc) = p.chunk(pb);
        let cols = p.padded_cols(jb);
        // SAFETY: as `a_block`, by tile column.
        let start = unsafe { self.packed_b.add(jb * p.nc * p.k + p0 * cols) };
        let per = p.slices().1;
        let states = &self.b_state[(jb * p.kb + pb) * per..][..per];
        let panels = cols / NR;
        share_packing(states, panels, B_SLICE, |range| {
            // SAFETY: a claimed slice of this block; columns below `n` lie in B.
            unsafe { pack::b_panels(&self.b, p.n, jb * p.nc, p0, kc, range, start) }
        });
        start
    }

    /// Tile `t` of `C` (column-major over tiles, so that consecutive tiles share a block of
    /// `B`).
    fn tile(&self, t: usize) {
        let p = &self.plan;
        let (ib, jb) = (t % p.mb, t / p.mb);
        let (i0, j0) = (ib * p.mc, jb * p.nc);
        let (rows, cols) = ((p.m - i0).min(p.mc), (p.n - j0).min(p.nc));
        let ldc = p.n;
        // A read in place: the tile's short last panel (only at the bottom of C) is copied
        // here once per chunk, as reading it in place would run past the end of A.
        let short = rows % MR;
        let mut edge = [0.0f32; MR * KC];
        for pb in 0..p.kb {
            let (p0, kc) = p.chunk(pb);
            let a = (!self.packed_a.is_null()).then(|| self.a_block(ib, pb));
            let b = self.b_block(pb, jb);
            if a.is_none() && short != 0 {
                // SAFETY: rows `i0 + rows - short..` (below `m`) of A, columns `p0..p0 + kc`;
                // `edge` holds one panel of up to KC steps.
                unsafe {
                    pack::a_panels(
                        &self.a,
                        p.m,
                        i0 + rows - short,
                        p0,
                        kc,
                        0..1,
                        edge.as_mut_ptr(),
                    )
                };
            }
            // Columns per micro-tile: one panel, or two on the AVX-512 kernel.
            let width = if self.wide { avx512::WIDE } else { NR };
            let micro = |ir: usize, jr: usize| {
                let e = Epilogue {
                    alpha: self.alpha,
                    beta: self.beta,
                    accumulate: pb > 0,
                    // SAFETY: column `j0 + jr < n` of the bias (n values).
                    bias: if self.bias.is_null() {
                        self.bias
                    } else {
                        unsafe { self.bias.add(j0 + jr) }
                    },
                };
                let (c, tr, tc) = (
                    // SAFETY: the sub-tile's corner lies in this tile of C.
                    unsafe { self.c.add((i0 + ir) * ldc + j0 + jr) },
                    (rows - ir).min(MR),
                    (cols - jr).min(width),
                );
                // The A panel: packed, in place (MR rows of A, row stride `rs`, from column
                // `p0`) or the short last one copied above.
                let (pa, lda, packed) = match a {
                    Some(a) => (unsafe { a.add(ir * kc) }, 0, true),
                    None if tr == MR => {
                        (unsafe { self.a.at(i0 + ir, p0) }, self.a.rs as usize, false)
                    }
                    None => (edge.as_ptr(), 0, true),
                };
                // SAFETY (the four calls): that A panel; panel `jr / NR` of the packed B
                // block (and the next one, which exists when `tc > NR`); the sub-tile lies in
                // this tile of C, which only this thread writes; the wide kernel only on a
                // job the caller made for a CPU with AVX-512.
                let pbk = unsafe { b.add(jr * kc) };
                unsafe {
                    match (tc > NR, packed) {
                        (true, true) => avx512::tile::<true>(kc, pa, lda, pbk, c, ldc, tr, tc, &e),
                        (true, false) => {
                            avx512::tile::<false>(kc, pa, lda, pbk, c, ldc, tr, tc, &e)
                        }
                        (false, true) => avx2::tile::<true>(kc, pa, lda, pbk, c, ldc, tr, tc, &e),
                        (false, false) => avx2::tile::<false>(kc, pa, lda, pbk, c, ldc, tr, tc, &e),
                    }
                };
            };
            if cols <= NARROW {
                for ir in (0..rows).step_by(MR) {
                    for jr in (0..cols).step_by(width) {
                        micro(ir, jr);
                    }
                }
            } else {
                for jr in (0..cols).step_by(width) {
                    for ir in (0..rows).step_by(MR) {
                        micro(ir, jr);
                    }
                }
            }
        }
    }
}

/// Packs the slices of one block nobody has claimed (`pack` gets a range of panels), then
/// waits for the rest.
fn share_packing(
    states: &[AtomicU8],
    panels: usize,
    per_slice: usize,
    pack: impl Fn(std::ops::Range<usize>),
) {
    let slices = panels.div_ceil(per_slice);
    let mut done = true;
    for (s, state) in states.iter().enumerate().take(slices) {
        if state.load(Ordering::Acquire) == PACKED {
            continue;
        }
        if state
            .compare_exchange(TO_PACK, PACKING, Ordering::Acquire, Ordering::Acquire)
            .is_ok()
        {
            pack(s * per_slice..((s + 1) * per_slice).min(panels));
            state.store(PACKED, Ordering::Release);
        } else {
            done = false;
        }
    }
    if done {
        return;
    }
    for state in states.iter().take(slices) {
        let mut spins = 0u32;
        while state.load(Ordering::Acquire) != PACKED {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// `C = alpha op(A) op(B) + beta C (+ bias in every row)` on the kernels of `isa` (the one
/// [`isa`] picks, for the engine's products); false, having done nothing, when the packed
/// operands would exceed [`MAX_PACKED`] or cannot be allocated.
///
/// # Safety
/// The CPU has `isa` ([`available`]); `a`, `b`, `c` (and `bias`, `n` values) hold the
/// matrices of these sizes; `k > 0`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn sgemm(
    isa: Isa,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
    bias: Option<&[f32]>,
) -> bool {
    let plan = Plan::new(m, n, k, threads::num_threads());
    let Some((mut a_len, b_len)) = plan.packed_lens() else {
        return false;
    };
    // A row-major A is read in place, unless its rows alias in L1 and packing it fits
    // [`MAX_PACKED`] (beyond that, reading it in place keeps the product on this kernel rather
    // than sending it to the `gemm` crate).
    let fits = a_len.checked_add(b_len).is_some_and(|t| t <= MAX_PACKED);
    let a_in_place = !trans_a && (!k.is_multiple_of(ALIASING_STRIDE) || !fits);
    if a_in_place {
        a_len = 0;
    }
    let Some(total) = a_len.checked_add(b_len).filter(|&t| t <= MAX_PACKED) else {
        return false;
    };
    // `op(X)` of `rows x cols`: X itself is `cols x rows` when transposed.
    let view = |p: &[f32], trans: bool, rows: usize, cols: usize| {
        if trans {
            View {
                ptr: p.as_ptr(),
                rs: 1,
                cs: rows as isize,
            }
        } else {
            View {
                ptr: p.as_ptr(),
                rs: cols as isize,
                cs: 1,
            }
        }
    };
    let (per_a, per_b) = plan.slices();
    let c = c.as_mut_ptr();
    let states = |len: usize| (0..len).map(|_| AtomicU8::new(TO_PACK)).collect::<Vec<_>>();
    let run = |buf: &mut Vec<f32>| -> bool {
        // 16 spare floats to start the packed blocks on a 64-byte line.
        let want = total + 16;
        if buf.len() < want {
            *buf = Vec::new();
            match zeroed(want) {
                Some(v) => *buf = v,
                None => return false,
            }
        }
        let align = buf.as_ptr().align_offset(64).min(16);
        let start = buf[align..].as_mut_ptr();
        // SAFETY: `a_len + b_len` floats follow the aligned start.
        let packed_b = unsafe { start.add(a_len) };
        let packed_a = if a_in_place {
            std::ptr::null_mut()
        } else {
            start
        };
        let job = Job {
            plan,
            a: view(a, trans_a, m, k),
            b: view(b, trans_b, k, n),
            c,
            alpha,
            beta,
            bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
            packed_a,
            packed_b,
            a_state: states(if a_in_place {
                0
            } else {
                plan.mb * plan.kb * per_a
            }),
            b_state: states(plan.nb * plan.kb * per_b),
            wide: isa == Isa::Avx512,
        };
        run_parts(plan.mb * plan.nb, &|t| job.tile(t));
        true
    };
    BUFFER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            let ok = run(&mut buf);
            if buf.capacity() > KEEP {
                *buf = Vec::new();
            }
            ok
        }
        // Not expected (a product does not start another on the same thread), but a
        // buffer of its own is correct either way.
        Err(_) => run(&mut Vec::new()),
    })
}

/// `len` zeros, or `None` when they cannot be allocated. Through `alloc_zeroed` (calloc), so
/// a large buffer comes as fresh zero pages from the system: the threads that pack into it
/// fault its pages in as they go, where `Vec::resize` would first write every float on the
/// calling thread alone (for a 4096^3 product, 128 MiB). No safe, fallible `vec![0.0; len]`
/// exists, hence this.
fn zeroed(len: usize) -> Option<Vec<f32>> {
    let layout = std::alloc::Layout::array::<f32>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout's size is not zero.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` floats, all
    // zero (a valid `f32`).
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

#[cfg(test)]
mod tests;
