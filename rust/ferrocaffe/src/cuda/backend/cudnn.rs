//! cuDNN, loaded at run time when present: one handle per device, bound to the device's
//! stream and made on first use, and owned descriptors (destroyed on drop, so nothing leaks
//! on an error path).
//!
//! cudarc panics on the first call into a library it cannot load, so presence (and a usable
//! version) is checked once before any other call. cudarc's bindings follow cuDNN 9 (its
//! status codes among them), so only a 9.x library is used; with none, or with
//! `FERROCAFFE_CUDNN=0` when an op is created, ops keep their own kernels.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::{Arc, OnceLock};

use cudarc::cudnn::sys;
use cudarc::driver::CudaStream;
use parking_lot::Mutex;

use super::device::DeviceCtx;
use crate::error::{Error, Result};

/// The versions cudarc's bindings match (cuDNN 9.x: `major * 10000 + minor * 100 + patch`).
const USABLE: std::ops::Range<usize> = 90_000..100_000;

/// The environment variable that turns cuDNN off (`0`) for ops created after it is set.
pub const CUDNN_ENV: &str = "FERROCAFFE_CUDNN";

/// The version of the cuDNN library found here, checked once; None when there is none.
pub fn cudnn_version() -> Option<usize> {
    static VERSION: OnceLock<Option<usize>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        // SAFETY: cudnnGetVersion takes nothing and only reports the library's version; a
        // symbol that cannot be loaded panics inside cudarc, caught here.
        catch_unwind(|| unsafe { sys::cudnnGetVersion() }).ok()
    })
}

/// Whether `FERROCAFFE_CUDNN` leaves cuDNN on (anything but `0`, or unset).
pub fn cudnn_enabled_by_env() -> bool {
    std::env::var(CUDNN_ENV).map_or(true, |v| v.trim() != "0")
}

/// `Ok` on success, else an `Error::Device` naming the call and the status.
pub fn check(call: &str, status: sys::cudnnStatus_t) -> Result<()> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Device(format!("cuDNN {call} failed: {status:?}")))
    }
}

/// A raw handle, used by one thread at a time (behind [`Cudnn`]'s lock).
struct Handle(sys::cudnnHandle_t);

// SAFETY: a cuDNN handle may be used from any host thread as long as no two threads use it
// at once; [`Cudnn`] keeps it behind a mutex.
unsafe impl Send for Handle {}

/// The cuDNN handle of one device, bound to its stream. Kept for the life of the process
/// (like the device contexts).
pub struct Cudnn {
    handle: Mutex<Handle>,
    /// The stream the handle is bound to, kept alive with it.
    _stream: Arc<CudaStream>,
    /// The library version.
    pub version: usize,
}

impl Cudnn {
    fn create(dev: &DeviceCtx, version: usize) -> Result<Cudnn> {
        dev.bind()?;
        let made = catch_unwind(AssertUnwindSafe(|| -> Result<Handle> {
            let mut h: sys::cudnnHandle_t = null_mut();
            // SAFETY: `h` is a valid place for the new handle; the device's context is
            // current on this thread.
            check("cudnnCreate", unsafe { sys::cudnnCreate(&mut h) })?;
            let handle = Handle(h);
            let stream = dev.stream.cu_stream() as sys::cudaStream_t;
            // SAFETY: `h` is the live handle just made; the stream belongs to the current
            // context and is kept alive as long as the handle (`_stream`).
            if let Err(e) = check("cudnnSetStream", unsafe { sys::cudnnSetStream(h, stream) }) {
                // SAFETY: `h` is live and used nowhere else.
                unsafe { sys::cudnnDestroy(handle.0) };
                return Err(e);
            }
            Ok(handle)
        }));
        let handle = made.unwrap_or_else(|_| {
            Err(Error::Device(
                "cuDNN: a function of the cuDNN library could not be loaded".into(),
            ))
        })?;
        Ok(Cudnn {
            handle: Mutex::new(handle),
            _stream: dev.stream.clone(),
            version,
        })
    }

    /// Runs `f` with the handle, locked, the device's context current on this thread. A
    /// cuDNN function that cannot be loaded (cudarc panics) becomes an error.
    pub fn with<R>(
        &self,
        dev: &DeviceCtx,
        f: impl FnOnce(sys::cudnnHandle_t) -> Result<R>,
    ) -> Result<R> {
        let h = self.handle.lock();
        dev.bind()?;
        catch_unwind(AssertUnwindSafe(|| f(h.0))).unwrap_or_else(|_| {
            Err(Error::Device(
                "cuDNN: a function of the cuDNN library could not be loaded".into(),
            ))
        })
    }
}

type Handles = Mutex<HashMap<u32, std::result::Result<Arc<Cudnn>, String>>>;

fn handles() -> &'static Handles {
    static H: OnceLock<Handles> = OnceLock::new();
    H.get_or_init(Default::default)
}

impl DeviceCtx {
    /// This device's cuDNN handle, made on first use: None when the library is absent (or
    /// not a 9.x version) or `FERROCAFFE_CUDNN=0` is set now.
    ///
    /// # Errors
    /// The library is there but its handle could not be made (named; the failure is kept,
    /// and `FERROCAFFE_CUDNN=0` avoids it).
    pub fn cudnn(&self) -> Result<Option<Arc<Cudnn>>> {
        if !cudnn_enabled_by_env() {
            return Ok(None);
        }
        let Some(version) = cudnn_version().filter(|v| USABLE.contains(v)) else {
            return Ok(None);
        };
        let mut t = handles().lock();
        let made = t.entry(self.ordinal).or_insert_with(|| {
            Cudnn::create(self, version)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        match made {
            Ok(c) => Ok(Some(c.clone())),
            Err(e) => Err(Error::Device(format!(
                "CUDA:{}: {e} (set {CUDNN_ENV}=0 to run without cuDNN)",
                self.ordinal
            ))),
        }
    }
}

/// The layouts of 4-d tensors and filters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[N, C, H, W]` (filters `[K, C, R, S]`).
    Nchw,
    /// `[N, H, W, C]` (filters `[K, R, S, C]`).
    Nhwc,
}

impl Layout {
    fn format(self) -> sys::cudnnTensorFormat_t {
        match self {
            Layout::Nchw => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            Layout::Nhwc => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
        }
    }
}

/// A 4-d float32 tensor descriptor.
pub struct TensorDesc(sys::cudnnTensorDescriptor_t);

// SAFETY: a descriptor is plain host memory owned by this value; it is only used by the
// thread that holds the value (or a handle's lock).
unsafe impl Send for TensorDesc {}

impl TensorDesc {
    /// A descriptor of a float32 tensor of logical dims `[n, c, h, w]` stored in `layout`.
    pub fn new(layout: Layout, [n, c, h, w]: [i32; 4]) -> Result<Self> {
        let mut d: sys::cudnnTensorDescriptor_t = null_mut();
        // SAFETY: `d` is a valid place for the new descriptor.
        check("cudnnCreateTensorDescriptor", unsafe {
            sys::cudnnCreateTensorDescriptor(&mut d)
        })?;
        let desc = TensorDesc(d);
        // SAFETY: `desc.0` is a live tensor descriptor; the arguments are (descriptor,
        // format, data type, n, c, h, w).
        check("cudnnSetTensor4dDescriptor", unsafe {
            sys::cudnnSetTensor4dDescriptor(
                desc.0,
                layout.format(),
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                n,
                c,
                h,
                w,
            )
        })?;
        Ok(desc)
    }

    /// The raw descriptor (valid while `self` lives).
    pub fn raw(&self) -> sys::cudnnTensorDescriptor_t {
        self.0
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: the descriptor was made by cudnnCreateTensorDescriptor and is destroyed
        // once, here.
        unsafe { sys::cudnnDestroyTensorDescriptor(self.0) };
    }
}

/// A 4-d float32 filter descriptor.
pub struct FilterDesc(sys::cudnnFilterDescriptor_t);

// SAFETY: as for [`TensorDesc`].
unsafe impl Send for FilterDesc {}

impl FilterDesc {
    /// A descriptor of float32 filters of logical dims `[k, c, r, s]` (output channels,
    /// input channels per group, kernel height, kernel width) stored in `layout`.
    pub fn new(layout: Layout, [k, c, r, s]: [i32; 4]) -> Result<Self> {
        let mut d: sys::cudnnFilterDescriptor_t = null_mut();
        // SAFETY: `d` is a valid place for the new descriptor.
        check("cudnnCreateFilterDescriptor", unsafe {
            sys::cudnnCreateFilterDescriptor(&mut d)
        })?;
        let desc = FilterDesc(d);
        // SAFETY: `desc.0` is a live filter descriptor; the arguments are (descriptor, data
        // type, format, k, c, h, w): the data type comes before the format here.
        check("cudnnSetFilter4dDescriptor", unsafe {
            sys::cudnnSetFilter4dDescriptor(
                desc.0,
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                layout.format(),
                k,
                c,
                r,
                s,
            )
        })?;
        Ok(desc)
    }

    /// The raw descriptor (valid while `self` lives).
    pub fn raw(&self) -> sys::cudnnFilterDescriptor_t {
        self.0
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: made by cudnnCreateFilterDescriptor, destroyed once, here.
        unsafe { sys::cudnnDestroyFilterDescriptor(self.0) };
    }
}

/// The geometry of a 2-d convolution (symmetric padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvParams {
    /// Zero padding on each side, (height, width).
    pub pad: [i32; 2],
    /// Strides, (height, width).
    pub stride: [i32; 2],
    /// Dilations, (height, width).
    pub dilation: [i32; 2],
    /// Groups.
    pub groups: i32,
}

/// A 2-d float32 cross-correlation descriptor (what Caffe2 calls a convolution), with FMA
/// math only: no TF32 tensor-core kernels (cuDNN's default math allows them on Ampere and
/// later, which would not match the CPU's float32 results).
pub struct ConvDesc(sys::cudnnConvolutionDescriptor_t);

// SAFETY: as for [`TensorDesc`].
unsafe impl Send for ConvDesc {}

impl ConvDesc {
    /// A descriptor of `p`.
    pub fn new(p: ConvParams) -> Result<Self> {
        let mut d: sys::cudnnConvolutionDescriptor_t = null_mut();
        // SAFETY: `d` is a valid place for the new descriptor.
        check("cudnnCreateConvolutionDescriptor", unsafe {
            sys::cudnnCreateConvolutionDescriptor(&mut d)
        })?;
        let desc = ConvDesc(d);
        // SAFETY: `desc.0` is a live convolution descriptor; the arguments are (descriptor,
        // pad_h, pad_w, stride_h (u), stride_w (v), dilation_h, dilation_w, mode, compute
        // type).
        check("cudnnSetConvolution2dDescriptor", unsafe {
            sys::cudnnSetConvolution2dDescriptor(
                desc.0,
                p.pad[0],
                p.pad[1],
                p.stride[0],
                p.stride[1],
                p.dilation[0],
                p.dilation[1],
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
        })?;
        // SAFETY: `desc.0` is live; (descriptor, group count).
        check("cudnnSetConvolutionGroupCount", unsafe {
            sys::cudnnSetConvolutionGroupCount(desc.0, p.groups)
        })?;
        // SAFETY: `desc.0` is live; (descriptor, math type).
        check("cudnnSetConvolutionMathType", unsafe {
            sys::cudnnSetConvolutionMathType(desc.0, sys::cudnnMathType_t::CUDNN_FMA_MATH)
        })?;
        Ok(desc)
    }

    /// The raw descriptor (valid while `self` lives).
    pub fn raw(&self) -> sys::cudnnConvolutionDescriptor_t {
        self.0
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: made by cudnnCreateConvolutionDescriptor, destroyed once, here.
        unsafe { sys::cudnnDestroyConvolutionDescriptor(self.0) };
    }
}

/// Whether an algorithm the heuristics offer may be used: it is supported for these
/// descriptors and does not ask for tensor-core (TF32) math.
pub fn usable_algo(status: sys::cudnnStatus_t, math: sys::cudnnMathType_t) -> bool {
    status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
        && matches!(
            math,
            sys::cudnnMathType_t::CUDNN_DEFAULT_MATH | sys::cudnnMathType_t::CUDNN_FMA_MATH
        )
}
