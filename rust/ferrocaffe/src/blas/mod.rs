//! Single-precision GEMM for every kernel that multiplies matrices (FC, MatMul, BatchMatMul,
//! Conv, ConvTranspose and through them the RNN step nets).
//!
//! Two backends behind one function, [`sgemm`]:
//! - this crate's own (the default): the kernels below and the pure-Rust `gemm` crate;
//! - a CBLAS library loaded at run time with [`load_cblas`] (for example the OpenBLAS that
//!   numpy's wheels bundle, which the Python package loads with `FERROCAFFE_BLAS=numpy`).
//!   `benchmarks/bench_runtime.py` measures FC layers on both against numpy.
//!
//! Loading is explicit and happens once per process; [`set_cblas_enabled`] switches between
//! the backends afterwards (tests compare them), and [`backend`] names the one in use.
//!
//! Without a CBLAS library, products with one small dimension (an RNN step's batch:
//! `m <= 64` of `A B` and `A B^T`, `k <= 64` of `A^T B`) run on this crate's own AVX-512 or AVX2
//! kernels where the CPU has them (`small`): they read the large operand in place instead of
//! packing it on every call ([`set_small_kernels_enabled`] turns them off; benchmarks
//! compare). Products above a megaflop, on these kernels or on the `gemm` crate, are shared
//! out to the team of compute threads ([`crate::threads`]). The Python package uses this
//! backend by default: on a 2-core machine it runs an LSTM step net 1.4x faster than
//! OpenBLAS, whose packing of the weight on every call and spinning workers cost more than
//! its kernels gain there.

use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::error::{Error, Result};

mod constant;
pub(crate) use crate::threads::for_each_part;
pub use crate::threads::single_threaded;
use crate::threads::{self, run_parts};
pub use constant::{hold_constant, ConstantOperands};
#[cfg(target_arch = "x86_64")]
mod blocked;
#[cfg(target_arch = "x86_64")]
mod small;
#[cfg(target_arch = "x86_64")]
mod transpose;

/// The AVX-512 mask of lanes `0..n`: all 16 from `n = 16` on. Masked loads and stores of the
/// kernels' row tails (products, pooling) take it.
#[cfg(target_arch = "x86_64")]
pub(crate) fn mask16(n: usize) -> std::arch::x86_64::__mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as std::arch::x86_64::__mmask16
    }
}

/// `cblas_sgemm`'s C signature (row/column order, transposes, sizes, leading dimensions),
/// generic over the integer width: `c_int` for LP64 builds, `i64` for ILP64 builds (the
/// `*64_` symbols of the OpenBLAS that numpy bundles).
type CblasSgemm<I> = unsafe extern "C" fn(
    order: I,
    trans_a: I,
    trans_b: I,
    m: I,
    n: I,
    k: I,
    alpha: f32,
    a: *const f32,
    lda: I,
    b: *const f32,
    ldb: I,
    beta: f32,
    c: *mut f32,
    ldc: I,
);

const CBLAS_ROW_MAJOR: i64 = 101;
const CBLAS_NO_TRANS: i64 = 111;
const CBLAS_TRANS: i64 = 112;

/// LP64 symbol names tried in order: the reference CBLAS name, then the prefixed name of
/// the `scipy-openblas32` builds.
const SGEMM_SYMBOLS: [&[u8]; 2] = [b"cblas_sgemm\0", b"scipy_cblas_sgemm\0"];
/// ILP64 symbol names (64-bit integers): OpenBLAS's `64_` suffix, with and without the
/// `scipy_` prefix of the build numpy bundles.
const SGEMM64_SYMBOLS: [&[u8]; 2] = [b"scipy_cblas_sgemm64_\0", b"cblas_sgemm64_\0"];

#[derive(Clone, Copy)]
enum SgemmFn {
    Lp64(CblasSgemm<c_int>),
    Ilp64(CblasSgemm<i64>),
}

struct Cblas {
    /// Keeps the library mapped for as long as `sgemm` may be called (the whole process).
    _library: libloading::Library,
    sgemm: SgemmFn,
    path: String,
}

static CBLAS: OnceLock<Cblas> = OnceLock::new();
static CBLAS_ENABLED: AtomicBool = AtomicBool::new(true);
static SMALL_ENABLED: AtomicBool = AtomicBool::new(true);
static BLOCKED_ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns this crate's blocked kernel for large products on or off (on by default; it runs
/// on CPUs with AVX2 and FMA, on AVX-512 where the CPU has it: the `blocked` module). Off,
/// those products run on the `gemm` crate (benchmarks compare the two).
pub fn set_blocked_enabled(enabled: bool) {
    BLOCKED_ENABLED.store(enabled, Ordering::Relaxed);
}

/// Turns the small-dimension kernels on or off (on by default; they only run on CPUs with
/// AVX-512 or AVX2 with FMA).
pub fn set_small_kernels_enabled(enabled: bool) {
    SMALL_ENABLED.store(enabled, Ordering::Relaxed);
}

/// How one product is run: which backend and which kernels. Kernels take it from their op
/// context ([`crate::ops::operator::OpContext::gemm`]) and call [`GemmContext::sgemm`]; the
/// process-wide switches ([`set_cblas_enabled`], [`set_small_kernels_enabled`]) only give the
/// default ([`GemmContext::current`]) that a context starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmContext {
    /// Use the loaded CBLAS library, when one is loaded.
    pub cblas: bool,
    /// Use this crate's small-dimension kernels where they apply.
    pub small_kernels: bool,
    /// Use this crate's blocked kernel for large products where it applies.
    pub blocked: bool,
}

impl Default for GemmContext {
    fn default() -> Self {
        GemmContext {
            cblas: true,
            small_kernels: true,
            blocked: true,
        }
    }
}

impl GemmContext {
    /// The process default: the switches as they are set now.
    pub fn current() -> Self {
        GemmContext {
            cblas: CBLAS_ENABLED.load(Ordering::Relaxed),
            small_kernels: SMALL_ENABLED.load(Ordering::Relaxed),
            blocked: BLOCKED_ENABLED.load(Ordering::Relaxed),
        }
    }

    /// The CBLAS library this context runs products on, if any.
    fn cblas(&self) -> Option<&'static Cblas> {
        CBLAS.get().filter(|_| self.cblas)
    }

    /// The instruction set a product would run on with the small-dimension kernels.
    #[cfg(target_arch = "x86_64")]
    fn small_kernels(
        &self,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
    ) -> Option<small::Isa> {
        if !self.small_kernels {
            return None;
        }
        small::applies(trans_a, trans_b, m, n, k)
    }
}

/// Loads a CBLAS shared library and uses its `sgemm` from now on. Loading the library that
/// is already loaded is a no-op; a second, different library is an error (a process keeps
/// one BLAS).
///
/// # Errors
/// The file cannot be loaded as a shared library, or exports neither `cblas_sgemm` nor
/// `scipy_cblas_sgemm`.
pub fn load_cblas(path: &Path) -> Result<()> {
    let shown = path.display().to_string();
    if let Some(loaded) = CBLAS.get() {
        return if loaded.path == shown {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "a CBLAS library is already loaded ({}); cannot also load {shown}",
                loaded.path
            )))
        };
    }
    // SAFETY: loading a shared library runs its initialisers; the caller names a BLAS
    // library, whose initialisers only set up its thread pool and CPU dispatch.
    let library = unsafe { libloading::Library::new(path) }
        .map_err(|e| Error::InvalidArgument(format!("cannot load CBLAS library {shown}: {e}")))?;
    // SAFETY (both lookups): a symbol of one of these names is a CBLAS sgemm with the LP64
    // or ILP64 signature above.
    let lp64 = SGEMM_SYMBOLS
        .iter()
        .find_map(|sym| unsafe { library.get::<CblasSgemm<c_int>>(sym) }.ok())
        .map(|f| SgemmFn::Lp64(*f));
    let found = lp64.or_else(|| {
        SGEMM64_SYMBOLS
            .iter()
            .find_map(|sym| unsafe { library.get::<CblasSgemm<i64>>(sym) }.ok())
            .map(|f| SgemmFn::Ilp64(*f))
    });
    let sgemm = found.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{shown} exports no cblas_sgemm (nor its scipy_ / 64_ variants): not a CBLAS library"
        ))
    })?;
    let _ = CBLAS.set(Cblas {
        _library: library,
        sgemm,
        path: shown,
    });
    Ok(())
}

/// Turns the loaded CBLAS library on or off (it is on once loaded); without one loaded,
/// the `gemm` crate runs either way.
pub fn set_cblas_enabled(enabled: bool) {
    CBLAS_ENABLED.store(enabled, Ordering::Relaxed);
}

/// The backend [`sgemm`] uses now: `"cblas:<path>"` or `"gemm"`.
pub fn backend() -> String {
    match active_cblas() {
        Some(c) => format!("cblas:{}", c.path),
        None => "gemm".to_string(),
    }
}

/// Whether [`sgemm`] parallelizes products itself: on a CBLAS library's thread pool, or split
/// across the team of compute threads ([`crate::threads`], machines with two or more cores).
/// Callers that would run GEMMs on several threads at once may prefer one.
pub fn gemm_is_threaded() -> bool {
    active_cblas().is_some() || threads::available()
}

/// Values of element-wise work in the smallest part worth handing to another thread (a few
/// microseconds on one core, against a hand-off of about one).
const PART_GRAIN: usize = 1 << 13;

/// How many of `items` (rows, or columns) go in each part when element-wise work of `work`
/// values in all is cut up for [`for_each_part`]: all of them (one part) below 16k values,
/// where the hand-off would cost more than it saves, or when a CBLAS library runs the
/// products (its spinning workers own the cores); else one part per [`PART_GRAIN`] values,
/// up to about two parts per thread. So a job's threads grow with its work: on a many-core
/// machine a 16k-value op takes 2 threads, not all of them.
#[inline]
pub(crate) fn part_len(items: usize, work: usize) -> usize {
    let parts = if work < 1 << 14 || active_cblas().is_some() || !threads::available() {
        1
    } else {
        let most = threads::num_threads().saturating_mul(2).max(4);
        items.min(work / PART_GRAIN).clamp(1, most)
    };
    items.div_ceil(parts).max(1)
}

/// `dst[..m * k]` (`k x m`, row-major) `= src[..m * k]` (`m x k`, row-major) transposed: in
/// 8 x 8 register blocks where the CPU has AVX2.
///
/// # Panics
/// When `src` or `dst` holds fewer than `m * k` values.
pub(crate) fn transpose_f32(src: &[f32], m: usize, k: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    transpose::transpose(src, m, k, dst);
    #[cfg(not(target_arch = "x86_64"))]
    for (i, row) in src[..m * k].chunks_exact(k.max(1)).enumerate() {
        for (p, &v) in row.iter().enumerate() {
            dst[p * m + i] = v;
        }
    }
}

fn active_cblas() -> Option<&'static Cblas> {
    GemmContext::current().cblas()
}

/// `C = alpha * op(A) * op(B) + beta * C` for row-major f32 matrices, where `op(A)` is
/// `m x k` and `op(B)` is `k x n`; `beta == 0` overwrites `C` (NaNs in it included).
///
/// # Panics
/// If a slice is shorter than its matrix (callers check shapes first).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
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
) {
    GemmContext::current().sgemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

impl GemmContext {
    /// [`sgemm`] run as this context says (backend and kernels).
    ///
    /// # Panics
    /// If a slice is shorter than its matrix (callers check shapes first).
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm(
        &self,
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
    ) {
        assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
        if m == 0 || n == 0 {
            return;
        }
        if let Some(cblas) = self.cblas() {
            let t = |x| if x { CBLAS_TRANS } else { CBLAS_NO_TRANS };
            let (ta, tb) = (t(trans_a), t(trans_b));
            // Tight row-major leading dimensions; BLAS does not read C when beta is 0 (as the
            // reference BLAS specifies).
            let (lda, ldb) = (
                if trans_a { m } else { k }.max(1),
                if trans_b { k } else { n }.max(1),
            );
            let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
            match cblas.sgemm {
                SgemmFn::Lp64(f) => {
                    let int = |v: usize| c_int::try_from(v).ok();
                    if let (Some(mi), Some(ni), Some(ki), Some(la), Some(lb)) =
                        (int(m), int(n), int(k), int(lda), int(ldb))
                    {
                        let e = |v: i64| v as c_int;
                        // SAFETY: row-major matrices of the asserted sizes.
                        unsafe {
                            f(
                                e(CBLAS_ROW_MAJOR),
                                e(ta),
                                e(tb),
                                mi,
                                ni,
                                ki,
                                alpha,
                                pa,
                                la,
                                pb,
                                lb,
                                beta,
                                pc,
                                ni,
                            )
                        };
                        return;
                    }
                }
                SgemmFn::Ilp64(f) => {
                    let int = |v: usize| v as i64;
                    // SAFETY: row-major matrices of the asserted sizes.
                    unsafe {
                        f(
                            CBLAS_ROW_MAJOR,
                            ta,
                            tb,
                            int(m),
                            int(n),
                            int(k),
                            alpha,
                            pa,
                            int(lda),
                            pb,
                            int(ldb),
                            beta,
                            pc,
                            int(n),
                        )
                    };
                    return;
                }
            }
        }
        // A loaded CBLAS library (above) takes every product: its worker threads spin after each
        // call, and a second pool beside them would fight them for the cores.
        #[cfg(target_arch = "x86_64")]
        if let Some(isa) = self.small_kernels(trans_a, trans_b, m, n, k) {
            small::sgemm(isa, trans_a, trans_b, m, n, k, alpha, a, b, beta, c, None);
            return;
        }
        if self.run_blocked(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, None) {
            return;
        }
        gemm_crate(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
    }

    /// `C = op(A) op(B) + bias` with `bias` (`n` values) added to every row: a fully
    /// connected layer. The small-dimension kernels add the bias as they store each tile, the
    /// blocked kernel as it stores its first pass over `C`; the other backends get `C` filled
    /// with the bias and then accumulate into it (the same value: one rounding of the product
    /// plus the bias).
    ///
    /// # Panics
    /// If a slice is shorter than its matrix, or the bias than `n` (callers check shapes
    /// first).
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm_bias(
        &self,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        bias: &[f32],
        c: &mut [f32],
    ) {
        assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n && bias.len() >= n);
        if m == 0 || n == 0 {
            return;
        }
        let bias = &bias[..n];
        // The small-dimension kernels and the blocked one add the bias as they store.
        if self.cblas().is_none() {
            #[cfg(target_arch = "x86_64")]
            if let Some(isa) = self.small_kernels(trans_a, trans_b, m, n, k) {
                small::sgemm(
                    isa,
                    trans_a,
                    trans_b,
                    m,
                    n,
                    k,
                    1.0,
                    a,
                    b,
                    0.0,
                    c,
                    Some(bias),
                );
                return;
            }
            if self.run_blocked(trans_a, trans_b, m, n, k, 1.0, a, b, 0.0, c, Some(bias)) {
                return;
            }
        }
        // The bias in every row (then C += op(A) op(B)), rows shared with the team.
        let per = part_len(m, m * n) * n;
        for_each_part(c[..m * n].chunks_mut(per).collect(), &|part| {
            for row in part.chunks_mut(n) {
                row.copy_from_slice(bias);
            }
        });
        if k > 0 {
            self.sgemm(trans_a, trans_b, m, n, k, 1.0, a, b, 1.0, c);
        }
    }

    /// The product on the blocked kernel, if this context allows it and it applies there;
    /// false (nothing done) otherwise.
    #[allow(clippy::too_many_arguments)]
    fn run_blocked(
        &self,
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
        #[cfg(target_arch = "x86_64")]
        if let Some(isa) = blocked::isa().filter(|_| {
            self.blocked
                && !trans_a
                && k > 0
                && m.saturating_mul(n).saturating_mul(k) >= BLOCKED_MIN_MNK
        }) {
            // SAFETY: the CPU has `isa` (`blocked::isa` picked it), the lengths were asserted
            // by the callers and `k > 0`.
            return unsafe {
                blocked::sgemm(isa, trans_a, trans_b, m, n, k, alpha, a, b, beta, c, bias)
            };
        }
        let _ = (trans_a, trans_b, m, n, k, alpha, a, b, beta, c, bias);
        false
    }
}

/// Products with a transposed `A` stay on the `gemm` crate too: packing `A^T` cost the blocked
/// kernel 10-20% on convolution gradients (`64x576x2048`, `576x256x64`, measured interleaved on
/// 2 cores) and gained nothing on squares.
///
/// Products below this many multiply-adds (2M, ~20 us on two cores) run on the `gemm` crate
/// even where the blocked kernel applies: measured interleaved on 2 cores
/// (`bench_runtime.py --only shapes`, three runs), the crate was 1.2x faster on NHWC
/// convolutions of 0.4M-2M (`256x32x144`, `1024x16x27`, `225x24x363`); from `128^3` up the
/// blocked kernel is faster.
const BLOCKED_MIN_MNK: usize = 1 << 21;

/// The `gemm` crate, single-threaded per call; products of at least [`SPLIT_MNK`] multiply-adds
/// are cut in pieces of `C` (rows or columns, whichever is longer) run on this thread and the
/// team of compute threads ([`crate::threads`]). (The crate's own rayon parallelism costs more in
/// hand-offs at these sizes, and rayon workers waiting for subtasks could run other queued
/// ops that block on a blob lock held further up the same stack.)
#[allow(clippy::too_many_arguments)]
fn gemm_crate(
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
) {
    let (rsa, csa) = if trans_a {
        (1, m as isize)
    } else {
        (k as isize, 1)
    };
    let (rsb, csb) = if trans_b {
        (1, k as isize)
    } else {
        (n as isize, 1)
    };
    let whole = CrateGemm {
        k,
        alpha,
        beta,
        a: (a.as_ptr(), rsa, csa),
        b: (b.as_ptr(), rsb, csb),
        c: c.as_mut_ptr(),
        ldc: n,
    };
    if m * n * k < SPLIT_MNK || (m < 16 && n < 16) {
        // SAFETY: the whole product, within the asserted lengths.
        unsafe { whole.run(0..m, 0..n) };
        return;
    }
    // Pieces of whole rows or columns of C (the longer side), shared out between this thread
    // and the team.
    let parts = if m * n * k >= ONE_PIECE_PER_THREAD_MNK {
        threads::num_threads()
    } else {
        pieces()
    };
    if m >= n {
        let height = (m.div_ceil(parts)).div_ceil(16) * 16;
        // SAFETY: the pieces write disjoint rows of C.
        run_parts(m.div_ceil(height), &|i| unsafe {
            whole.run(i * height..((i + 1) * height).min(m), 0..n)
        });
    } else {
        let width = (n.div_ceil(parts)).div_ceil(16) * 16;
        // SAFETY: the pieces write disjoint columns of C.
        run_parts(n.div_ceil(width), &|i| unsafe {
            whole.run(0..m, i * width..((i + 1) * width).min(n))
        });
    }
}

/// Split products are cut in about this many pieces: two per thread of the team, so that a
/// thread that starts late or runs slower leaves less to wait for.
fn pieces() -> usize {
    threads::num_threads().saturating_mul(2).max(4)
}

/// Products of at least this many multiply-adds (256^3) are cut in one piece per thread: each
/// piece packs the whole of the operand it does not split, so fewer pieces pack less. Measured
/// on 2 cores (FC against numpy, 4 interleaved rounds): 108-147 -> 129-159 GFLOP/s at 256,
/// 114-128 -> 129-162 at 512, 121-150 -> 118-173 at 1024, 128-168 -> 119-174 at 2048.
/// Smaller products keep two pieces per thread, which balance better when a thread is late.
const ONE_PIECE_PER_THREAD_MNK: usize = 1 << 24;

/// Products of at least this many multiply-adds are shared out to the team.
const SPLIT_MNK: usize = 1 << 18;

/// A row-major product `C (m x n, row stride ldc) = alpha op(A) op(B) + beta C`, with each
/// operand as (pointer, row stride, column stride) of its `op()` view.
struct CrateGemm {
    k: usize,
    alpha: f32,
    beta: f32,
    a: (*const f32, isize, isize),
    b: (*const f32, isize, isize),
    c: *mut f32,
    ldc: usize,
}

// SAFETY: shared by the two halves of a split product, which read A and B and write
// disjoint blocks of C.
unsafe impl Sync for CrateGemm {}

impl CrateGemm {
    /// Rows `rows` and columns `cols` of C.
    ///
    /// # Safety
    /// The block lies within the matrices, and no other thread writes it meanwhile.
    unsafe fn run(&self, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) {
        let (m, n) = (rows.len(), cols.len());
        if m == 0 || n == 0 {
            return;
        }
        let (pa, rsa, csa) = self.a;
        let (pb, rsb, csb) = self.b;
        // SAFETY: offsets of the block's first row / column inside the caller's matrices;
        // gemm computes dst = beta_dst * dst + alpha * lhs * rhs with (alpha, beta) named
        // (beta, alpha) here, as Caffe2 and BLAS name them.
        unsafe {
            gemm::gemm(
                m,
                n,
                self.k,
                self.c.add(rows.start * self.ldc + cols.start),
                1,
                self.ldc as isize,
                self.beta != 0.0,
                pa.offset(rows.start as isize * rsa),
                csa,
                rsa,
                pb.offset(cols.start as isize * csb),
                csb,
                rsb,
                self.beta,
                self.alpha,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `op(A) op(B)` in float64 (row-major, tight): the reference for every kernel's tests.
    pub(super) fn naive(
        ta: bool,
        tb: bool,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
    ) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    let av = if ta { a[p * m + i] } else { a[i * k + p] };
                    let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                    s += av as f64 * bv as f64;
                }
                c[i * n + j] = s;
            }
        }
        c
    }

    #[test]
    fn gemm_crate_matches_naive_for_every_transpose() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        for ta in [false, true] {
            for tb in [false, true] {
                let want = naive(ta, tb, m, n, k, &a, &b);
                let mut c = vec![f32::NAN; m * n];
                gemm_crate(ta, tb, m, n, k, 1.0, &a, &b, 0.0, &mut c);
                for (x, y) in c.iter().zip(&want) {
                    assert!((*x as f64 - y).abs() < 1e-5, "{ta} {tb}: {x} vs {y}");
                }
                // beta = 1 accumulates.
                gemm_crate(ta, tb, m, n, k, 2.0, &a, &b, 1.0, &mut c);
                for (x, y) in c.iter().zip(&want) {
                    assert!((*x as f64 - 3.0 * y).abs() < 1e-4);
                }
            }
        }
    }

    #[test]
    fn loading_a_file_that_is_not_a_library_is_an_error() {
        let err = load_cblas(Path::new("/nonexistent/libnothing.so"));
        assert!(matches!(err, Err(Error::InvalidArgument(m)) if m.contains("libnothing")));
    }
}
