//! Single-precision matrix products on cuBLAS, with row-major operands as the CPU kernels
//! take them (cuBLAS is column-major: a row-major `C = op(A) op(B)` is the column-major
//! `C^T = op(B)^T op(A)^T`, so the operands swap).

use cudarc::cublas::result as cublas;
use cudarc::cublas::sys::cublasOperation_t;

use super::device::DeviceCtx;
use crate::error::{Error, Result};

fn dim(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::InvalidArgument(format!("{what} = {v} exceeds cuBLAS's 32-bit dimensions"))
    })
}

fn op(t: bool) -> cublasOperation_t {
    if t {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// A row-major product shape: `C[m, n] = alpha * op(A) op(B) + beta * C` with `op(A)` of
/// `[m, k]` and `op(B)` of `[k, n]`; `lda`, `ldb`, `ldc` are row strides.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Whether A is stored transposed (`[k, m]`).
    pub trans_a: bool,
    /// Whether B is stored transposed (`[n, k]`).
    pub trans_b: bool,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C's previous values.
    pub beta: f32,
}

impl Gemm {
    fn lds(&self) -> (usize, usize) {
        let lda = if self.trans_a { self.m } else { self.k };
        let ldb = if self.trans_b { self.k } else { self.n };
        (lda, ldb)
    }
}

impl DeviceCtx {
    /// `C = alpha op(A) op(B) + beta C` on densely stored row-major matrices.
    pub fn sgemm(&self, g: Gemm, a: u64, b: u64, c: u64) -> Result<()> {
        self.sgemm_batched(g, a, 0, b, 0, c, 0, 1)
    }

    /// `batch` products at the given element strides between consecutive matrices.
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm_batched(
        &self,
        g: Gemm,
        a: u64,
        stride_a: usize,
        b: u64,
        stride_b: usize,
        c: u64,
        stride_c: usize,
        batch: usize,
    ) -> Result<()> {
        if g.m == 0 || g.n == 0 || batch == 0 {
            return Ok(());
        }
        let (lda, ldb) = g.lds();
        let (m, n, k) = (dim(g.m, "m")?, dim(g.n, "n")?, dim(g.k, "k")?);
        let (lda, ldb, ldc) = (dim(lda.max(1), "lda")?, dim(ldb.max(1), "ldb")?, n);
        let blas = self.blas.lock();
        self.bind()?;
        let h = *blas.handle();
        let (alpha, beta) = (g.alpha, g.beta);
        let r = if batch == 1 {
            // SAFETY: the addresses hold the matrices the shape describes (callers size them
            // from the tensors' dims); the handle is bound to this device's stream.
            unsafe {
                cublas::sgemm(
                    h,
                    op(g.trans_b),
                    op(g.trans_a),
                    n,
                    m,
                    k,
                    &alpha,
                    b as *const f32,
                    ldb,
                    a as *const f32,
                    lda,
                    &beta,
                    c as *mut f32,
                    ldc,
                )
            }
        } else {
            let s = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
            // SAFETY: as above, for `batch` matrices at the given strides.
            unsafe {
                cublas::sgemm_strided_batched(
                    h,
                    op(g.trans_b),
                    op(g.trans_a),
                    n,
                    m,
                    k,
                    &alpha,
                    b as *const f32,
                    ldb,
                    s(stride_b),
                    a as *const f32,
                    lda,
                    s(stride_a),
                    &beta,
                    c as *mut f32,
                    ldc,
                    s(stride_c),
                    dim(batch, "batch")?,
                )
            }
        };
        r.map_err(|e| Error::Device(format!("cublasSgemm failed: {e:?}")))
    }
}

impl DeviceCtx {
    /// [`sgemm`](Self::sgemm), or zeros when the inner dimension is empty (`C` has `m * n`
    /// elements, `beta` 0).
    pub fn sgemm_or_zero(&self, g: Gemm, a: u64, b: u64, c: u64) -> Result<()> {
        if g.k == 0 {
            return self.fill_zero(c, g.m.saturating_mul(g.n));
        }
        self.sgemm(g, a, b, c)
    }

    /// Sets `n` floats at `ptr` to zero.
    pub fn fill_zero(&self, ptr: u64, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let bytes = n
            .checked_mul(4)
            .ok_or_else(|| Error::InvalidArgument("size overflows".into()))?;
        // SAFETY: callers pass an address holding `n` floats of this device.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| Error::Device(format!("cuMemsetD8Async failed: {e:?}")))
    }
}
