//! The CUDA devices of the process: the libraries checked before first use, one context,
//! stream, cuBLAS handle, memory pool and kernel-module cache per device, made on first use.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaModule, CudaStream};
use parking_lot::Mutex;

use super::memory::Pool;
use crate::device::Device;
use crate::error::{Error, Result};

/// One CUDA device as the runtime uses it.
pub struct DeviceCtx {
    /// The ordinal.
    pub ordinal: u32,
    /// The primary context.
    pub ctx: Arc<CudaContext>,
    /// The stream every op on this device runs on (ops are ordered on it, so freed memory is
    /// reused safely by later ops).
    pub stream: Arc<CudaStream>,
    /// cuBLAS, bound to [`stream`](Self::stream).
    pub blas: Mutex<CudaBlas>,
    /// Cached device memory.
    pub pool: Pool,
    /// Compiled kernel modules by source name.
    pub(super) modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// The NVRTC target (`compute_XY`) of this device, when known.
    pub(super) arch: Option<&'static str>,
    /// cuBLASLt, made on first use.
    pub(super) lt: OnceLock<super::blaslt::LtHandle>,
}

impl std::fmt::Debug for DeviceCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CUDA:{}", self.ordinal)
    }
}

/// Whether this build has the CUDA backend.
pub const BUILT_WITH_CUDA: bool = true;

fn driver_error(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("CUDA {what} failed: {e:?}"))
}

/// Checks the driver library once: cudarc panics on first use of a library it cannot load,
/// so presence is checked (and initialisation tried) before anything touches it.
fn driver_state() -> &'static std::result::Result<usize, String> {
    static STATE: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    STATE.get_or_init(|| {
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("the CUDA driver library (libcuda) was not found".into());
        }
        let probe = std::panic::catch_unwind(|| {
            cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
            cudarc::driver::result::device::get_count()
                .map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))
        });
        match probe {
            Ok(Ok(n)) => Ok(usize::try_from(n).unwrap_or(0)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the CUDA driver library could not be loaded".into()),
        }
    })
}

/// The number of CUDA devices (0 without a driver).
pub fn num_devices() -> usize {
    driver_state().as_ref().map(|n| *n).unwrap_or(0)
}

/// `Ok` when CUDA can be used here; else what is missing.
pub fn availability() -> Result<()> {
    match driver_state() {
        Ok(0) => Err(Error::Device("no CUDA device is present".into())),
        Ok(_) => Ok(()),
        Err(e) => Err(Error::Device(e.clone())),
    }
}

fn check_libraries() -> Result<()> {
    // SAFETY: only tries to open the libraries by their usual names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Device(
            "the NVRTC library (libnvrtc) was not found: CUDA kernels cannot be compiled".into(),
        ));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(Error::Device(
            "the cuBLAS library (libcublas) was not found".into(),
        ));
    }
    Ok(())
}

fn arch_of(cc: (i32, i32)) -> Option<&'static str> {
    Some(match cc {
        (7, 0) => "compute_70",
        (7, 2) => "compute_72",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

fn open(ordinal: u32) -> Result<Arc<DeviceCtx>> {
    availability()?;
    check_libraries()?;
    let n = num_devices();
    if ordinal as usize >= n {
        return Err(Error::Device(format!(
            "CUDA device {ordinal} does not exist ({n} device(s) present)"
        )));
    }
    let made = std::panic::catch_unwind(|| -> Result<Arc<DeviceCtx>> {
        let ctx = CudaContext::new(ordinal as usize).map_err(|e| driver_error("context", e))?;
        // Our memory is raw device pointers ordered on one stream: no per-slice events.
        // SAFETY: no CudaSlice of this context is alive yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| driver_error("cuBLAS init", e))?;
        let arch = ctx.compute_capability().ok().and_then(arch_of);
        Ok(Arc::new(DeviceCtx {
            ordinal,
            ctx,
            stream,
            blas: Mutex::new(blas),
            pool: Pool::default(),
            modules: Mutex::new(HashMap::new()),
            arch,
            lt: OnceLock::new(),
        }))
    });
    made.unwrap_or_else(|_| {
        Err(Error::Device(format!(
            "CUDA device {ordinal}: a CUDA library could not be loaded"
        )))
    })
}

fn table() -> &'static Mutex<HashMap<u32, Arc<DeviceCtx>>> {
    static T: OnceLock<Mutex<HashMap<u32, Arc<DeviceCtx>>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// The device context of a CUDA ordinal, made on first use.
///
/// # Errors
/// No driver, no such device, or a library missing (each named).
pub fn device(ordinal: u32) -> Result<Arc<DeviceCtx>> {
    let mut t = table().lock();
    if let Some(d) = t.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = open(ordinal)?;
    t.insert(ordinal, d.clone());
    Ok(d)
}

/// The context of `device`, which must be a CUDA device.
pub fn device_of(device: Device) -> Result<Arc<DeviceCtx>> {
    match device {
        Device::Cuda(i) => self::device(i),
        Device::Cpu => Err(Error::Device("expected a CUDA device, got the CPU".into())),
    }
}

/// Returns every device's cached memory to the driver (`ResetWorkspace` calls this).
pub fn empty_cache() {
    let devices: Vec<Arc<DeviceCtx>> = table().lock().values().cloned().collect();
    for d in devices {
        d.empty_cache();
    }
}

impl DeviceCtx {
    /// Waits for everything queued on the device's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error("synchronize", e))
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }
}

/// The context of `ordinal` if it has been opened.
pub(super) fn opened(ordinal: u32) -> Option<Arc<DeviceCtx>> {
    table().lock().get(&ordinal).cloned()
}

/// Every opened device.
pub(super) fn opened_all() -> Vec<Arc<DeviceCtx>> {
    table().lock().values().cloned().collect()
}
