//! Device memory: a caching pool per device, and tensors whose storage is such memory.
//!
//! Blocks are rounded (512 bytes below 1 MiB, 2 MiB above) and kept on free lists when a
//! tensor lets go of them, so a net that runs again reuses its memory without calling the
//! driver. Every op of a device runs on that device's one stream, so a block freed by one op
//! and taken by the next is ordered after every earlier use. `ResetWorkspace` returns the
//! cached blocks to the driver ([`super::empty_cache`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::result;
use parking_lot::Mutex;

use super::device::{device_of, DeviceCtx};
use crate::device::{Device, DeviceMemory};
use crate::error::{Error, Result};
use crate::tensor::{DataType, Tensor};

/// A device's cached blocks.
#[derive(Default)]
pub struct Pool {
    free: Mutex<HashMap<usize, Vec<u64>>>,
    cached: AtomicUsize,
    in_use: AtomicUsize,
}

/// How much memory a device's pool holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes in blocks tensors hold.
    pub in_use: usize,
    /// Bytes in blocks kept for reuse.
    pub cached: usize,
}

fn rounded(len: usize) -> Option<usize> {
    const SMALL: usize = 512;
    const LARGE: usize = 2 << 20;
    let unit = if len < (1 << 20) { SMALL } else { LARGE };
    len.max(1).checked_next_multiple_of(unit)
}

impl Pool {
    /// Current figures.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            in_use: self.in_use.load(Ordering::Relaxed),
            cached: self.cached.load(Ordering::Relaxed),
        }
    }
}

impl DeviceCtx {
    /// A block of at least `len` bytes (uninitialised).
    ///
    /// # Errors
    /// `OutOfMemory` when the device has no room even after the cache is emptied.
    pub fn alloc_block(self: &Arc<Self>, len: usize) -> Result<CudaMemory> {
        if len == 0 {
            return Ok(CudaMemory {
                dev: self.clone(),
                ptr: 0,
                size: 0,
                len: 0,
            });
        }
        let size = rounded(len).ok_or_else(|| {
            Error::OutOfMemory(format!("a device block of {len} bytes is too large"))
        })?;
        let reused = self.pool.free.lock().get_mut(&size).and_then(Vec::pop);
        let ptr = match reused {
            Some(p) => {
                self.pool.cached.fetch_sub(size, Ordering::Relaxed);
                p
            }
            None => self.malloc(size)?,
        };
        self.pool.in_use.fetch_add(size, Ordering::Relaxed);
        Ok(CudaMemory {
            dev: self.clone(),
            ptr,
            size,
            len,
        })
    }

    /// Device memory straight from the driver (not the pool): for libraries' workspaces that
    /// live as long as the device.
    pub(super) fn malloc(&self, size: usize) -> Result<u64> {
        self.bind()?;
        // SAFETY: a plain device allocation in the bound context.
        match unsafe { result::malloc_sync(size) } {
            Ok(p) => Ok(p),
            Err(_) => {
                // Give the cached blocks back and try once more.
                self.empty_cache();
                self.bind()?;
                // SAFETY: as above.
                unsafe { result::malloc_sync(size) }.map_err(|e| {
                    let free = result::mem_get_info().map(|(f, _)| f).unwrap_or(0);
                    Error::OutOfMemory(format!(
                        "CUDA out of memory: allocating {size} bytes on CUDA:{} ({free} bytes \
                         free; {e:?})",
                        self.ordinal
                    ))
                })
            }
        }
    }

    /// Frees every cached block (after the stream has finished with them).
    pub fn empty_cache(&self) {
        let blocks: Vec<(usize, Vec<u64>)> = self.pool.free.lock().drain().collect();
        if blocks.is_empty() || self.bind().is_err() {
            return;
        }
        let _ = self.synchronize();
        for (size, ptrs) in blocks {
            for p in ptrs {
                // SAFETY: the block came from malloc_sync in this context and no tensor
                // holds it; the stream has finished every use.
                let _ = unsafe { result::free_sync(p) };
                self.pool.cached.fetch_sub(size, Ordering::Relaxed);
            }
        }
    }

    fn release(&self, ptr: u64, size: usize) {
        self.pool.in_use.fetch_sub(size, Ordering::Relaxed);
        self.pool.cached.fetch_add(size, Ordering::Relaxed);
        self.pool.free.lock().entry(size).or_default().push(ptr);
    }

    /// A new tensor on this device, its elements uninitialised.
    pub fn alloc_tensor(self: &Arc<Self>, dtype: DataType, dims: &[usize]) -> Result<Tensor> {
        let bytes = dims
            .iter()
            .try_fold(dtype.item_size(), |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::OutOfMemory(format!("tensor shape {dims:?} overflows")))?;
        let mem = self.alloc_block(bytes)?;
        Tensor::on_device(dtype, dims, Box::new(mem))
    }

    /// A new tensor on this device filled with zero bytes.
    pub fn zeros(self: &Arc<Self>, dtype: DataType, dims: &[usize]) -> Result<Tensor> {
        let t = self.alloc_tensor(dtype, dims)?;
        let (ptr, len) = raw(&t)?;
        if len > 0 {
            self.bind()?;
            // SAFETY: `ptr` holds `len` bytes of this device.
            unsafe { result::memset_d8_async(ptr, 0, len, self.stream.cu_stream()) }
                .map_err(|e| Error::Device(format!("cuMemsetD8Async failed: {e:?}")))?;
        }
        Ok(t)
    }

    /// `t` on this device: shared when it is here already, else copied.
    ///
    /// # Errors
    /// String tensors (host only), or the copy failed.
    pub fn upload(self: &Arc<Self>, t: &Tensor) -> Result<Tensor> {
        if t.device() == Device::Cuda(self.ordinal) {
            return Ok(t.clone());
        }
        if t.dtype() == DataType::String {
            return Err(Error::DtypeMismatch(
                "string tensors live on the host only and cannot be copied to a CUDA device".into(),
            ));
        }
        let host = t.to_host()?;
        let out = self.alloc_tensor(host.dtype(), host.dims())?;
        let bytes = host.bytes();
        if !bytes.is_empty() {
            let (ptr, _) = raw(&out)?;
            self.bind()?;
            // SAFETY: `ptr` holds `bytes.len()` bytes (same dtype and dims); a copy from
            // pageable memory returns once the bytes are staged, so `host` may go.
            unsafe { result::memcpy_htod_async(ptr, bytes, self.stream.cu_stream()) }
                .map_err(|e| Error::Device(format!("host-to-device copy failed: {e:?}")))?;
        }
        Ok(out)
    }

    /// A copy of device tensor `t` (on this device) into new memory.
    pub fn duplicate(self: &Arc<Self>, t: &Tensor) -> Result<Tensor> {
        let t = self.upload(t)?;
        let out = self.alloc_tensor(t.dtype(), t.dims())?;
        let (src, len) = raw(&t)?;
        let (dst, _) = raw(&out)?;
        self.copy_d2d(dst, src, len)?;
        Ok(out)
    }

    /// Copies `len` bytes between two places of this device, in stream order.
    pub fn copy_d2d(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        if len == 0 || dst == src {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges are device memory of this context, `len` bytes long.
        unsafe { result::memcpy_dtod_async(dst, src, len, self.stream.cu_stream()) }
            .map_err(|e| Error::Device(format!("device-to-device copy failed: {e:?}")))
    }
}

/// A block of a device's pool, given back to the pool when dropped.
pub struct CudaMemory {
    dev: Arc<DeviceCtx>,
    ptr: u64,
    size: usize,
    len: usize,
}

impl CudaMemory {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if self.size != 0 {
            self.dev.release(self.ptr, self.size);
        }
    }
}

impl DeviceMemory for CudaMemory {
    fn device(&self) -> Device {
        Device::Cuda(self.dev.ordinal)
    }

    fn byte_len(&self) -> usize {
        self.len
    }

    fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(dst.len());
        if end.is_none_or(|e| e > self.len) {
            return Err(Error::InvalidArgument(format!(
                "copy of {} bytes at {offset} outside a device block of {} bytes",
                dst.len(),
                self.len
            )));
        }
        if dst.is_empty() {
            return Ok(());
        }
        self.dev.bind()?;
        let stream = self.dev.stream.cu_stream();
        // SAFETY: the range is inside this block; the stream is synchronised before `dst` is
        // read.
        unsafe { result::memcpy_dtoh_async(dst, self.ptr + offset as u64, stream) }
            .map_err(|e| Error::Device(format!("device-to-host copy failed: {e:?}")))?;
        self.dev.synchronize()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The device address of `t`'s first element and its byte length; `t` must be on a CUDA
/// device.
pub fn raw(t: &Tensor) -> Result<(u64, usize)> {
    let len = t
        .numel()
        .checked_mul(t.dtype().item_size())
        .ok_or_else(|| Error::InvalidArgument(format!("tensor shape {:?} overflows", t.dims())))?;
    match t.device_memory() {
        Some((m, off)) => match m.as_any().downcast_ref::<CudaMemory>() {
            Some(c) => Ok((c.ptr + off as u64, len)),
            None => Err(Error::Device(format!(
                "a tensor on {} whose memory is not CUDA memory",
                m.device()
            ))),
        },
        None => Err(Error::Device(
            "a host tensor where a CUDA tensor was expected".into(),
        )),
    }
}

/// Copies `t` to `device` (a CUDA device), or returns it when it is there already.
pub fn to_device(t: &Tensor, device: Device) -> Result<Tensor> {
    match device {
        Device::Cpu => t.to_host(),
        d => device_of(d)?.upload(t),
    }
}
