//! Reference timings taken in the same process as the operators they are compared with.

use std::time::Instant;

use super::blas::Gemm;
use super::device::device;
use super::memory::raw;
use crate::error::Result;
use crate::tensor::DataType;

/// Seconds per call of a bare cuBLAS `sgemm` of `C[m, n] = A[m, k] op(B)` on device
/// `ordinal` (`op(B)` = `B[k, n]`, or `B[n, k]` transposed with `trans_b`, as FC's weights),
/// averaged over `iters` calls after one warm-up: the reference the FC and MatMul operators
/// are measured against.
pub fn sgemm_seconds(
    ordinal: u32,
    m: usize,
    n: usize,
    k: usize,
    trans_b: bool,
    iters: usize,
) -> Result<f64> {
    let dev = device(ordinal)?;
    let a = dev.zeros(DataType::Float, &[m, k])?;
    let b = dev.zeros(DataType::Float, &[k, n])?;
    let c = dev.zeros(DataType::Float, &[m, n])?;
    let (pa, pb, pc) = (raw(&a)?.0, raw(&b)?.0, raw(&c)?.0);
    let g = Gemm {
        trans_a: false,
        trans_b,
        m,
        n,
        k,
        alpha: 1.0,
        beta: 0.0,
    };
    dev.sgemm(g, pa, pb, pc)?;
    dev.synchronize()?;
    let iters = iters.max(1);
    let t0 = Instant::now();
    for _ in 0..iters {
        dev.sgemm(g, pa, pb, pc)?;
    }
    dev.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() / iters as f64)
}

/// Waits for every opened device's stream.
pub fn synchronize_all() -> Result<()> {
    for d in super::device::opened_all() {
        d.synchronize()?;
    }
    Ok(())
}
