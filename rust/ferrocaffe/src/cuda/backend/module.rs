//! Kernels: the CUDA C of [`crate::cuda::sources`] compiled by NVRTC for the device on first
//! use (once per process and device), loaded as modules, and launched on the device's stream.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, LaunchConfig};
use cudarc::nvrtc::CompileOptions;

use super::device::DeviceCtx;
use crate::cuda::sources;
use crate::error::{Error, Result};

/// Threads per block of the element-wise launches.
pub const BLOCK: u32 = 256;

/// A one-dimensional launch over `n` items with grid-stride loops in the kernel (the grid is
/// capped; kernels loop).
pub fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 16);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A two-dimensional launch over an `[rows, cols]` matrix: x covers the columns in blocks of
/// [`BLOCK`] threads, y the rows (capped; kernels loop over rows with a stride of `gridDim.y`).
pub fn grid_rows_cols(rows: usize, cols: usize) -> LaunchConfig {
    let x = cols.div_ceil(BLOCK as usize).clamp(1, 1 << 20);
    let y = rows.clamp(1, 65535);
    LaunchConfig {
        grid_dim: (x as u32, y as u32, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` threads per row, for `rows` rows (row-wise reductions).
pub fn rows(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, 1 << 20) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl DeviceCtx {
    /// The function `name` of source module `module`, compiling and loading the module on
    /// first use.
    ///
    /// # Errors
    /// An unknown module or function, or NVRTC's log when the source does not compile.
    pub fn function(self: &Arc<Self>, module: &str, name: &str) -> Result<CudaFunction> {
        let m = self.module(module)?;
        m.load_function(name).map_err(|e| {
            Error::Device(format!(
                "CUDA kernel '{name}' not found in module '{module}': {e:?}"
            ))
        })
    }

    fn module(self: &Arc<Self>, module: &str) -> Result<Arc<cudarc::driver::CudaModule>> {
        let (key, src) = sources::find(module)
            .ok_or_else(|| Error::Device(format!("no CUDA kernel source named '{module}'")))?;
        if let Some(m) = self.modules.lock().get(key) {
            return Ok(m.clone());
        }
        let opts = CompileOptions {
            arch: self.arch,
            name: Some(format!("{key}.cu")),
            options: sources::NVRTC_OPTIONS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ..Default::default()
        };
        let compiled = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(src, opts))
            .map_err(|_| Error::Device("NVRTC could not be loaded".into()))?;
        let ptx = compiled.map_err(|e| {
            Error::Device(format!(
                "NVRTC failed to compile CUDA module '{key}': {e:?}"
            ))
        })?;
        let m = self
            .ctx
            .load_module(ptx)
            .map_err(|e| Error::Device(format!("loading CUDA module '{key}' failed: {e:?}")))?;
        self.modules.lock().insert(key, m.clone());
        Ok(m)
    }
}

/// Launches `func` on `dev`'s stream with `cfg` and the arguments given (each a value that
/// lives to the end of the call: device addresses as `u64`, sizes as `i64`, scalars as `f32`).
///
/// `launch!(dev, func, cfg; x_ptr, y_ptr, n)`
#[macro_export]
#[doc(hidden)]
macro_rules! cuda_launch {
    ($dev:expr, $func:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        #[allow(unused_imports)]
        use cudarc::driver::PushKernelArg as _;
        let __f = &$func;
        let __dev = &$dev;
        let mut __b = __dev.stream.launch_builder(__f);
        $( let __a = $arg; __b.arg(&__a); )*
        // SAFETY: the kernel's parameters match the arguments pushed (checked by the kernel
        // sources' signatures and the callers' tests); device addresses point to live blocks
        // of this device.
        unsafe { __b.launch($cfg) }
            .map(|_| ())
            .map_err(|e| $crate::error::Error::Device(format!("CUDA launch failed: {e:?}")))
    }};
}
