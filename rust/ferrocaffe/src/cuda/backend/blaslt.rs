//! Matrix products with the bias added in the product's epilogue (cuBLASLt), for FC: one
//! kernel instead of a product and a bias pass. Used when libcublasLt is present; otherwise
//! FC runs the product on cuBLAS and adds the bias with a kernel of its own.
//!
//! A plan (descriptors and the algorithm cuBLASLt's heuristic picks) is made once per shape
//! and kept by the op that uses it.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use super::blas::Gemm;
use super::device::DeviceCtx;
use crate::error::{Error, Result};

/// Bytes of scratch memory cuBLASLt may use per call.
const WORKSPACE: usize = 32 << 20;

fn lt_error(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("cuBLASLt {what} failed: {e:?}"))
}

/// Whether libcublasLt can be loaded (checked once: cudarc panics on a missing library).
fn present() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library by its usual names.
    *P.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// A device's cuBLASLt handle and workspace (driver memory kept for the process's life, not
/// counted in the pool's figures).
pub struct LtHandle {
    handle: sys::cublasLtHandle_t,
    workspace: u64,
}

// SAFETY: the handle is used under the device's cuBLAS mutex only.
unsafe impl Send for LtHandle {}
// SAFETY: as above.
unsafe impl Sync for LtHandle {}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: made by cublasLtCreate and used by nothing else now.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

impl DeviceCtx {
    /// The device's cuBLASLt handle, made on first use; `None` without the library.
    fn lt(self: &Arc<Self>) -> Result<Option<&LtHandle>> {
        if !present() {
            return Ok(None);
        }
        if let Some(h) = self.lt.get() {
            return Ok(Some(h));
        }
        self.bind()?;
        let made = std::panic::catch_unwind(lt::create_handle)
            .map_err(|_| Error::Device("cuBLASLt could not be loaded".into()))?;
        let handle = made.map_err(|e| lt_error("cublasLtCreate", e))?;
        let workspace = self.malloc(WORKSPACE)?;
        let _ = self.lt.set(LtHandle { handle, workspace });
        Ok(self.lt.get())
    }
}

struct Layout(sys::cublasLtMatrixLayout_t);
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: made by cublasLtMatrixLayoutCreate, owned here.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

struct Desc(sys::cublasLtMatmulDesc_t);
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: made by cublasLtMatmulDescCreate, owned here.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

struct Pref(sys::cublasLtMatmulPreference_t);
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: made by cublasLtMatmulPreferenceCreate, owned here.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

/// A product with a bias epilogue, planned for one shape.
pub struct BiasPlan {
    shape: Gemm,
    desc: Desc,
    a: Layout,
    b: Layout,
    c: Layout,
    algo: sys::cublasLtMatmulAlgo_t,
}

// SAFETY: descriptors are plain host objects, used by one op at a time.
unsafe impl Send for BiasPlan {}

fn op(t: bool) -> cudarc::cublas::sys::cublasOperation_t {
    if t {
        cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
    }
}

fn layout(rows: usize, cols: usize, ld: usize) -> Result<Layout> {
    let l = lt::create_matrix_layout(
        sys::cudaDataType::CUDA_R_32F,
        rows as u64,
        cols as u64,
        ld as i64,
    )
    .map_err(|e| lt_error("cublasLtMatrixLayoutCreate", e))?;
    Ok(Layout(l))
}

fn set_desc<T>(d: &Desc, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    // SAFETY: `v` is a live value of the attribute's type and size.
    unsafe {
        lt::set_matmul_desc_attribute(
            d.0,
            attr,
            (v as *const T).cast::<c_void>(),
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| lt_error("cublasLtMatmulDescSetAttribute", e))
}

impl DeviceCtx {
    /// `C = op(A) op(B) + bias` (row-major, `bias` of `n` floats added to every row; `beta`
    /// must be 0) through cuBLASLt, reusing `plan` when it was made for this shape. Returns
    /// false (nothing done) when cuBLASLt is absent or has no algorithm for the shape: the
    /// caller then runs the product and the bias itself.
    pub fn sgemm_bias(
        self: &Arc<Self>,
        plan: &mut Option<BiasPlan>,
        g: Gemm,
        a: u64,
        b: u64,
        bias: u64,
        c: u64,
    ) -> Result<bool> {
        let Some(h) = self.lt()? else {
            return Ok(false);
        };
        if g.m == 0 || g.n == 0 || g.k == 0 || g.beta != 0.0 {
            return Ok(false);
        }
        let fresh = plan.as_ref().is_none_or(|p| {
            let s = p.shape;
            (s.m, s.n, s.k, s.trans_a, s.trans_b) != (g.m, g.n, g.k, g.trans_a, g.trans_b)
        });
        if fresh {
            *plan = match self.plan(h, g) {
                Ok(p) => Some(p),
                Err(_) => return Ok(false),
            };
        }
        let Some(p) = plan.as_ref() else {
            return Ok(false);
        };
        set_desc(
            &p.desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            &bias,
        )?;
        let (alpha, beta) = (g.alpha, 0.0f32);
        let _guard = self.blas.lock();
        self.bind()?;
        // SAFETY: the layouts describe the buffers the caller sized from the tensors' dims
        // (column-major view: D[n, m] = op(B)^T op(A)^T); the workspace is this device's
        // and ordered on its stream.
        unsafe {
            lt::matmul(
                h.handle,
                p.desc.0,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                b as *const c_void,
                p.a.0,
                a as *const c_void,
                p.b.0,
                c as *const c_void,
                p.c.0,
                c as *mut c_void,
                p.c.0,
                &p.algo,
                h.workspace as *mut c_void,
                WORKSPACE,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_error("cublasLtMatmul", e))?;
        Ok(true)
    }

    fn plan(&self, h: &LtHandle, g: Gemm) -> Result<BiasPlan> {
        let desc = Desc(
            lt::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            )
            .map_err(|e| lt_error("cublasLtMatmulDescCreate", e))?,
        );
        use sys::cublasLtMatmulDescAttributes_t as A;
        set_desc(&desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &op(g.trans_b))?;
        set_desc(&desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &op(g.trans_a))?;
        set_desc(
            &desc,
            A::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        )?;
        // Column-major operands: the first is B ([k, n] stored, or [n, k] transposed), the
        // second A ([m, k] row-major is [k, m] column-major), the result [n, m].
        let (ldb, lda) = (
            if g.trans_b { g.k } else { g.n },
            if g.trans_a { g.m } else { g.k },
        );
        let a = if g.trans_b {
            layout(g.k, g.n, ldb)?
        } else {
            layout(g.n, g.k, ldb)?
        };
        let b = if g.trans_a {
            layout(g.m, g.k, lda)?
        } else {
            layout(g.k, g.m, lda)?
        };
        let c = layout(g.n, g.m, g.n)?;
        let pref = Pref(lt::create_matmul_pref().map_err(|e| lt_error("preference", e))?);
        let ws = WORKSPACE as u64;
        // SAFETY: a live u64 for the workspace-size attribute.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        }
        .map_err(|e| lt_error("cublasLtMatmulPreferenceSetAttribute", e))?;
        // SAFETY: all descriptors are live and describe one product.
        let heuristic =
            unsafe { lt::get_matmul_algo_heuristic(h.handle, desc.0, a.0, b.0, c.0, c.0, pref.0) }
                .map_err(|e| lt_error("cublasLtMatmulAlgoGetHeuristic", e))?;
        Ok(BiasPlan {
            shape: g,
            desc,
            a,
            b,
            c,
            algo: heuristic.algo,
        })
    }
}
