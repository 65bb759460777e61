//! Tensors: dims + dtype + shared storage + element offset.
//!
//! # Storage and mutability rules
//!
//! A [`Tensor`] points at an `Arc<Storage>`; a `Storage` holds an `Arc<Buffer>` (the bytes).
//! The two levels give two kinds of sharing:
//!
//! * **Views / aliases** ([`Tensor::view`], [`Tensor::alias`]) share the `Storage`: a write
//!   through one is seen by all of them (Caffe2's `ShareData` / `ShareExternalPointer`, used by
//!   RNN links and the `Alias` op). Whoever creates aliases must make sure that no two threads
//!   write (or write and read) tensors of one storage at the same time; the executors do this by
//!   running ops in dependency order.
//! * **Copies** ([`Clone`], [`Tensor::snapshot`]) share the `Buffer` copy-on-write: the first
//!   write through any `Storage` that does not own its buffer alone copies the buffer first. So
//!   `Copy`, fetching a blob into numpy without copying, and feeding a read-only external buffer
//!   are all O(1), and nobody ever sees a later write of somebody else.
//!
//! Writes go through `&mut Tensor` ([`Tensor::as_mut_slice`], [`Tensor::ensure`]); the blob
//! lock of the workspace makes that exclusive for a tensor held in a blob.
//!
//! Memory of new buffers is zeroed and 64-byte aligned. A resize that fits the current buffer
//! (uniquely owned) keeps it, as Caffe2 keeps capacity when a tensor shrinks.
//!
//! # Devices
//!
//! A tensor knows its [`Device`]. Its buffer is host memory, or memory a device backend owns
//! ([`DeviceMemory`], made with [`Tensor::on_device`]). Host code cannot slice device memory
//! by accident: the typed accessors ([`Tensor::as_slice`], [`Tensor::as_mut_slice`],
//! [`Tensor::as_strings`], ...) return an error naming the device, the raw byte views
//! ([`Tensor::bytes`], [`Tensor::bytes_mut`]) are empty, and [`Tensor::to_host`] copies the
//! elements out. Device buffers are never written through host code, so copies of a device
//! tensor share its buffer; writing a CPU result into a blob that held one replaces it
//! with host memory.

use std::alloc::{self, Layout};
use std::any::Any;
use std::cell::UnsafeCell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use half::f16;

use crate::device::{not_on_host, Device, DeviceMemory};
use crate::error::{Error, Result};
use crate::proto::{tensor_proto, TensorProto};

/// Element types of a tensor (`TensorProto.DataType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// 32-bit float (`FLOAT = 1`).
    Float,
    /// 32-bit int (`INT32 = 2`).
    Int32,
    /// Byte strings (`STRING = 4`).
    String,
    /// Bool (`BOOL = 5`).
    Bool,
    /// `UINT8 = 6` (also `BYTE = 3` on input).
    Uint8,
    /// `INT8 = 7`.
    Int8,
    /// `UINT16 = 8`.
    Uint16,
    /// `INT16 = 9`.
    Int16,
    /// `INT64 = 10`.
    Int64,
    /// IEEE half, storage only (`FLOAT16 = 12`).
    Float16,
    /// 64-bit float (`DOUBLE = 13`).
    Double,
}

impl DataType {
    /// Bytes per element (strings: size of one stored string handle, not meaningful).
    pub fn item_size(self) -> usize {
        match self {
            DataType::Float | DataType::Int32 => 4,
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Float16 => 2,
            DataType::Int64 | DataType::Double => 8,
            DataType::String => std::mem::size_of::<Vec<u8>>(),
        }
    }

    /// The `TensorProto.DataType` number.
    pub fn to_proto(self) -> i32 {
        use tensor_proto::DataType as P;
        (match self {
            DataType::Float => P::Float,
            DataType::Int32 => P::Int32,
            DataType::String => P::String,
            DataType::Bool => P::Bool,
            DataType::Uint8 => P::Uint8,
            DataType::Int8 => P::Int8,
            DataType::Uint16 => P::Uint16,
            DataType::Int16 => P::Int16,
            DataType::Int64 => P::Int64,
            DataType::Float16 => P::Float16,
            DataType::Double => P::Double,
        }) as i32
    }

    /// From a `TensorProto.DataType` number (`BYTE` reads as uint8).
    pub fn from_proto(v: i64) -> Result<Self> {
        Ok(match v {
            1 => DataType::Float,
            2 => DataType::Int32,
            3 | 6 => DataType::Uint8,
            4 => DataType::String,
            5 => DataType::Bool,
            7 => DataType::Int8,
            8 => DataType::Uint16,
            9 => DataType::Int16,
            10 => DataType::Int64,
            12 => DataType::Float16,
            13 => DataType::Double,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unsupported TensorProto data type {v}"
                )))
            }
        })
    }

    /// numpy-style name (`float32`, `int64`, `object` for strings...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Float => "float32",
            DataType::Int32 => "int32",
            DataType::String => "string",
            DataType::Bool => "bool",
            DataType::Uint8 => "uint8",
            DataType::Int8 => "int8",
            DataType::Uint16 => "uint16",
            DataType::Int16 => "int16",
            DataType::Int64 => "int64",
            DataType::Float16 => "float16",
            DataType::Double => "float64",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A plain element type a tensor can hold (everything but strings).
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static {
    /// The matching data type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DataType = DataType::$d; })* };
}
element!(f32 => Float, f64 => Double, i32 => Int32, i64 => Int64, bool => Bool, u8 => Uint8,
    i8 => Int8, i16 => Int16, u16 => Uint16, f16 => Float16);

const ALIGN: usize = 64;

/// A zeroed, 64-byte aligned heap allocation.
struct AlignedBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain bytes, no thread affinity.
unsafe impl Send for AlignedBytes {}
// SAFETY: shared access is read-only (writes need a unique `Arc<Buffer>`).
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    /// `len` zeroed bytes, or an [`Error::OutOfMemory`] when the size cannot be laid out or
    /// the allocator has no memory for it (never an abort).
    fn try_zeroed(len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(AlignedBytes {
                ptr: NonNull::<u64>::dangling().cast(),
                len: 0,
            });
        }
        let layout = Layout::from_size_align(len, ALIGN).map_err(|_| {
            Error::OutOfMemory(format!("a tensor of {len} bytes is too large to allocate"))
        })?;
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::OutOfMemory(format!("out of memory allocating a tensor of {len} bytes"))
        })?;
        Ok(AlignedBytes { ptr, len })
    }

    /// [`try_zeroed`](Self::try_zeroed) for sizes the engine chose (a copy of an existing
    /// buffer, a fixed size): a failure is a panic (caught at the op boundary), not an abort.
    fn zeroed(len: usize) -> Self {
        match Self::try_zeroed(len) {
            Ok(b) => b,
            Err(e) => alloc_failed(&e),
        }
    }

    fn from_bytes(src: &[u8]) -> Self {
        let b = Self::zeroed(src.len());
        // SAFETY: b owns src.len() fresh bytes; the regions cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.ptr.as_ptr(), src.len()) };
        b
    }
}

#[cold]
fn alloc_failed(e: &Error) -> ! {
    panic!("{e}")
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        if self.len != 0 {
            if let Ok(layout) = Layout::from_size_align(self.len, ALIGN) {
                // SAFETY: allocated in `zeroed` with this very layout.
                unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
            }
        }
    }
}

/// The bytes behind a tensor.
enum Buffer {
    /// Owned by the engine; written in place when uniquely held.
    Owned(AlignedBytes),
    /// Memory owned by someone else (a fed numpy array): read-only, copied on first write.
    External {
        ptr: *const u8,
        len: usize,
        _owner: Box<dyn Any + Send + Sync>,
    },
    /// Byte strings, one per element.
    Strings(Vec<Vec<u8>>),
    /// Memory on a device (never read or written through host slices).
    Device(Box<dyn DeviceMemory>),
}

// SAFETY: `External` memory is only read, and its owner is Send + Sync.
unsafe impl Send for Buffer {}
// SAFETY: see above; Owned/Strings are plain data.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn bytes(&self) -> &[u8] {
        match self {
            Buffer::Owned(b) => {
                // SAFETY: ptr is valid for len initialized (zeroed) bytes.
                unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), b.len) }
            }
            // SAFETY: the creator of an External buffer promised validity for `len` bytes
            // while `_owner` lives.
            Buffer::External { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Buffer::Strings(_) | Buffer::Device(_) => &[],
        }
    }

    #[inline]
    fn device(&self) -> Device {
        match self {
            Buffer::Device(m) => m.device(),
            _ => Device::Cpu,
        }
    }

    fn byte_len(&self) -> usize {
        match self {
            Buffer::Owned(b) => b.len,
            Buffer::External { len, .. } => *len,
            Buffer::Strings(v) => v.len() * DataType::String.item_size(),
            Buffer::Device(m) => m.byte_len(),
        }
    }

    fn deep_copy(&self) -> Buffer {
        match self {
            Buffer::Strings(v) => Buffer::Strings(v.clone()),
            // Host writes are refused before they reach a device buffer (see `Tensor`), so no
            // copy-on-write of one ever happens.
            Buffer::Device(m) => device_buffer_written(m.device()),
            other => Buffer::Owned(AlignedBytes::from_bytes(other.bytes())),
        }
    }
}

/// The shared home of a buffer; tensors that alias each other share one `Storage`.
pub struct Storage {
    buf: UnsafeCell<Arc<Buffer>>,
}

// SAFETY: the buffer pointer is replaced only through `&mut Tensor` (copy-on-write); aliases in
// other threads must not be used concurrently with a write (see the module docs).
unsafe impl Sync for Storage {}
// SAFETY: all contents are Send.
unsafe impl Send for Storage {}

impl Storage {
    fn new(buf: Buffer) -> Arc<Storage> {
        Arc::new(Storage {
            buf: UnsafeCell::new(Arc::new(buf)),
        })
    }

    #[inline]
    fn buffer(&self) -> &Arc<Buffer> {
        // SAFETY: see the Sync impl.
        unsafe { &*self.buf.get() }
    }

    /// Mutable access to the buffer, copying it first when another `Storage` shares it or when
    /// it is external.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    fn buffer_mut(&self) -> &mut Buffer {
        // Uniqueness is read from the strong count (no `Weak<Buffer>` is ever made), never with
        // `Arc::get_mut`: its check briefly locks the weak count, so two threads writing
        // disjoint views of one storage at once (the RNN executor does) could each see the
        // other's lock, take the buffer for shared, and copy it away from the other aliases.
        // SAFETY: a shared read of the slot; it is only replaced below, under the contract.
        let cur = unsafe { &*self.buf.get() };
        let writable = matches!(**cur, Buffer::Owned(_) | Buffer::Strings(_));
        if !writable || Arc::strong_count(cur) != 1 {
            // SAFETY: callers hold `&mut Tensor`; aliases follow the module's concurrency
            // contract (a shared buffer is never written, so no alias writes concurrently).
            let slot = unsafe { &mut *self.buf.get() };
            *slot = Arc::new(slot.deep_copy());
        }
        // SAFETY: this storage holds the only reference to an owned buffer, so the buffer is
        // reached only through this storage's aliases, which write disjoint elements when they
        // run concurrently (module docs); the enum itself is never modified through this.
        unsafe { &mut *Arc::as_ptr(&*self.buf.get()).cast_mut() }
    }
}

#[cold]
fn device_buffer_written(device: Device) -> ! {
    panic!("internal error: host code tried to write a buffer on {device}")
}

#[cold]
fn unreachable_unique() -> ! {
    panic!("a freshly created buffer is uniquely owned")
}

/// A read-only, copy-on-write handle on a tensor's data, independent of later writes to the
/// tensor (used to hand data to numpy without copying).
#[derive(Clone)]
pub struct Snapshot {
    buf: Arc<Buffer>,
    byte_offset: usize,
    dims: Vec<usize>,
    dtype: DataType,
}

impl Snapshot {
    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }
    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
    /// Pointer to the first element (valid while the snapshot lives; never written through).
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes().as_ptr()
    }
    /// The data bytes (not for strings).
    pub fn bytes(&self) -> &[u8] {
        let n = self.numel() * self.dtype.item_size();
        let b = self.buf.bytes();
        let start = self.byte_offset.min(b.len());
        &b[start..(start + n).min(b.len())]
    }
    /// The strings of a string tensor.
    pub fn strings(&self) -> &[Vec<u8>] {
        match &*self.buf {
            Buffer::Strings(v) => {
                let off = (self.byte_offset / DataType::String.item_size()).min(v.len());
                &v[off..(off + self.numel()).min(v.len())]
            }
            _ => &[],
        }
    }
}

/// An n-dimensional array of one [`DataType`].
pub struct Tensor {
    dims: Vec<usize>,
    dtype: DataType,
    storage: Arc<Storage>,
    /// Offset of the first element, in elements.
    offset: usize,
}

impl Clone for Tensor {
    /// A copy with value semantics: the buffer is shared copy-on-write.
    fn clone(&self) -> Self {
        Tensor {
            dims: self.dims.clone(),
            dtype: self.dtype,
            storage: Storage::new_shared(self.storage.buffer().clone()),
            offset: self.offset,
        }
    }
}

impl Storage {
    fn new_shared(buf: Arc<Buffer>) -> Arc<Storage> {
        Arc::new(Storage {
            buf: UnsafeCell::new(buf),
        })
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor<{}>{:?}", self.dtype, self.dims)
    }
}

impl Default for Tensor {
    fn default() -> Self {
        Tensor::new(DataType::Float, &[0])
    }
}

fn checked_numel(dims: &[usize]) -> usize {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .unwrap_or(usize::MAX)
}

/// A zeroed buffer of `numel` elements, or an [`Error::OutOfMemory`] (the byte size overflows
/// or the memory is not there).
fn try_fresh_buffer(dtype: DataType, numel: usize) -> Result<Buffer> {
    if dtype == DataType::String {
        Ok(Buffer::Strings(crate::error::try_vec(
            numel,
            Vec::new(),
            "a string tensor",
        )?))
    } else {
        let bytes = numel.checked_mul(dtype.item_size()).ok_or_else(|| {
            Error::OutOfMemory(format!(
                "a {dtype} tensor of {numel} elements is too large to allocate"
            ))
        })?;
        Ok(Buffer::Owned(AlignedBytes::try_zeroed(bytes)?))
    }
}

impl Tensor {
    /// A zero-filled tensor (empty strings for `String`). For internal sizes: a shape no
    /// memory can hold panics; use [`try_new`](Self::try_new) for shapes from user input.
    pub fn new(dtype: DataType, dims: &[usize]) -> Tensor {
        match Self::try_new(dtype, dims) {
            Ok(t) => t,
            Err(e) => alloc_failed(&e),
        }
    }

    /// A zero-filled tensor, or an [`Error::OutOfMemory`] naming the shape when its size
    /// overflows or cannot be allocated.
    pub fn try_new(dtype: DataType, dims: &[usize]) -> Result<Tensor> {
        let numel =
            crate::error::checked_numel(dims, dtype.item_size(), &format!("a {dtype} tensor"))?;
        let buf = try_fresh_buffer(dtype, numel)
            .map_err(|e| e.map_message(|m| format!("{m} (a {dtype} tensor of shape {dims:?})")))?;
        Ok(Tensor {
            dims: dims.to_vec(),
            dtype,
            storage: Storage::new(buf),
            offset: 0,
        })
    }

    /// A tensor holding `data` (length must equal the product of `dims`).
    pub fn from_vec<T: Element>(dims: &[usize], data: Vec<T>) -> Result<Tensor> {
        Self::from_slice(dims, &data)
    }

    /// A tensor holding a copy of `data`.
    pub fn from_slice<T: Element>(dims: &[usize], data: &[T]) -> Result<Tensor> {
        let n = checked_numel(dims);
        if n != data.len() {
            return Err(Error::InvalidArgument(format!(
                "tensor of shape {dims:?} needs {n} values, got {}",
                data.len()
            )));
        }
        // SAFETY: T is a plain Copy type; viewing its memory as bytes is fine.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        Ok(Tensor {
            dims: dims.to_vec(),
            dtype: T::DTYPE,
            storage: Storage::new(Buffer::Owned(AlignedBytes::from_bytes(bytes))),
            offset: 0,
        })
    }

    /// A 0-d tensor holding one value.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        match Self::from_slice(&[], &[v]) {
            Ok(t) => t,
            Err(_) => unreachable_unique(),
        }
    }

    /// A string tensor.
    pub fn from_strings(dims: &[usize], data: Vec<Vec<u8>>) -> Result<Tensor> {
        let n = checked_numel(dims);
        if n != data.len() {
            return Err(Error::InvalidArgument(format!(
                "string tensor of shape {dims:?} needs {n} values, got {}",
                data.len()
            )));
        }
        Ok(Tensor {
            dims: dims.to_vec(),
            dtype: DataType::String,
            storage: Storage::new(Buffer::Strings(data)),
            offset: 0,
        })
    }

    /// A tensor over memory owned by `owner` (zero-copy feed). The engine never writes to it: the
    /// first write copies.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `numel(dims) * dtype.item_size()` bytes, suitably
    /// aligned for `dtype`, for as long as `owner` lives, and must not be written by anyone
    /// while the tensor (or a copy of it) may read it.
    pub unsafe fn from_external(
        dtype: DataType,
        dims: &[usize],
        ptr: *const u8,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Tensor> {
        if dtype == DataType::String {
            return Err(Error::InvalidArgument(
                "string tensors cannot wrap external memory".into(),
            ));
        }
        let len = checked_numel(dims) * dtype.item_size();
        Ok(Tensor {
            dims: dims.to_vec(),
            dtype,
            storage: Storage::new(Buffer::External {
                ptr,
                len,
                _owner: owner,
            }),
            offset: 0,
        })
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.dims.len()
    }
    /// Dimension `i`, counting from the back when negative (numpy style).
    pub fn dim(&self, i: isize) -> Result<usize> {
        let n = self.dims.len() as isize;
        let k = if i < 0 { i + n } else { i };
        if k < 0 || k >= n {
            return Err(Error::InvalidArgument(format!(
                "dimension {i} out of range for a tensor of {n} dimensions"
            )));
        }
        Ok(self.dims[k as usize])
    }
    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
    /// Product of the dims before `axis` (Caffe2's `size_to_dim`).
    pub fn size_to_dim(&self, axis: usize) -> usize {
        self.dims[..axis.min(self.dims.len())].iter().product()
    }
    /// Product of the dims from `axis` on (Caffe2's `size_from_dim`).
    pub fn size_from_dim(&self, axis: usize) -> usize {
        self.dims[axis.min(self.dims.len())..].iter().product()
    }
    /// Whether two tensors share storage (are views of one buffer).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// The device the tensor's memory is on.
    #[inline]
    pub fn device(&self) -> Device {
        self.storage.buffer().device()
    }

    /// Whether host code can read the elements (the memory is on the host).
    pub fn is_host(&self) -> bool {
        self.device().is_host()
    }

    #[inline]
    fn check_host(&self) -> Result<()> {
        match self.device() {
            Device::Cpu => Ok(()),
            d => Err(self.not_on_host_error(d)),
        }
    }

    #[cold]
    fn not_on_host_error(&self, d: Device) -> Error {
        not_on_host(d, &format!("a tensor of {} {:?}", self.dtype, self.dims))
    }

    /// A tensor of `dtype` and `dims` whose elements are `memory` on a device (made by a
    /// device backend).
    ///
    /// # Errors
    /// Strings (which live on the host only), or memory of another size than the shape needs.
    pub fn on_device(
        dtype: DataType,
        dims: &[usize],
        memory: Box<dyn DeviceMemory>,
    ) -> Result<Tensor> {
        if dtype == DataType::String {
            return Err(Error::InvalidArgument(
                "string tensors live on the host only".into(),
            ));
        }
        let need = dims
            .iter()
            .try_fold(dtype.item_size(), |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::InvalidArgument(format!("tensor shape {dims:?} overflows")))?;
        if memory.byte_len() != need {
            return Err(Error::InvalidArgument(format!(
                "device memory of {} bytes for a {dtype} tensor of shape {dims:?} ({need} bytes)",
                memory.byte_len()
            )));
        }
        Ok(Tensor {
            dims: dims.to_vec(),
            dtype,
            storage: Storage::new(Buffer::Device(memory)),
            offset: 0,
        })
    }

    /// The device memory behind the tensor and the byte offset of its first element; `None`
    /// for host memory.
    pub fn device_memory(&self) -> Option<(&dyn DeviceMemory, usize)> {
        match &**self.storage.buffer() {
            Buffer::Device(m) => Some((&**m, self.offset * self.dtype.item_size())),
            _ => None,
        }
    }

    /// The tensor with its elements in host memory: itself (shared copy-on-write) when it is
    /// there already, else a copy from the device.
    ///
    /// # Errors
    /// The device backend's copy failed, or the host buffer cannot be allocated.
    pub fn to_host(&self) -> Result<Tensor> {
        let buf = self.storage.buffer();
        let Buffer::Device(mem) = &**buf else {
            return Ok(self.clone());
        };
        let item = self.dtype.item_size();
        let len = self.numel().checked_mul(item);
        let start = self.offset.checked_mul(item);
        let (Some(len), Some(start)) = (len, start) else {
            return Err(Error::InvalidArgument(format!(
                "tensor shape {:?} overflows",
                self.dims
            )));
        };
        let mut host = Tensor::new(self.dtype, &self.dims);
        mem.copy_to_host(start, host.bytes_mut()).map_err(|e| {
            Error::Device(format!("copying {len} bytes from {}: {e}", mem.device()))
        })?;
        Ok(host)
    }

    #[inline]
    fn check<T: Element>(&self) -> Result<()> {
        self.check_host()?;
        if self.dtype != T::DTYPE {
            return Err(self.dtype_error(T::DTYPE));
        }
        Ok(())
    }

    #[cold]
    fn dtype_error(&self, want: DataType) -> Error {
        Error::InvalidArgument(format!("tensor holds {}, not {want}", self.dtype))
    }

    /// The elements, if the tensor holds `T`.
    #[inline]
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check::<T>()?;
        let n = self.numel();
        let buf = self.storage.buffer();
        let bytes = buf.bytes();
        let start = self.offset * std::mem::size_of::<T>();
        let end = start + n * std::mem::size_of::<T>();
        if end > bytes.len() {
            return Err(Error::ShapeMismatch(format!(
                "tensor view [{start}, {end}) bytes exceeds its buffer of {} bytes",
                bytes.len()
            )));
        }
        // SAFETY: in bounds, aligned (64-byte base, offsets in whole elements; external memory is
        // aligned by the contract of `from_external`), any bit pattern of the plain types here is
        // valid except bool, whose buffers only ever receive 0/1.
        Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().add(start).cast::<T>(), n) })
    }

    /// The elements for writing, if the tensor holds `T` (copies a shared buffer first).
    #[inline]
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check::<T>()?;
        let n = self.numel();
        let start = self.offset * std::mem::size_of::<T>();
        let end = start + n * std::mem::size_of::<T>();
        let buf = self.storage.buffer_mut();
        match buf {
            Buffer::Owned(b) if end <= b.len => {
                // SAFETY: in bounds, aligned, exclusive (unique buffer, `&mut self`).
                Ok(unsafe {
                    std::slice::from_raw_parts_mut(b.ptr.as_ptr().add(start).cast::<T>(), n)
                })
            }
            _ => Err(Error::ShapeMismatch(format!(
                "tensor view [{start}, {end}) bytes exceeds its buffer"
            ))),
        }
    }

    /// The strings of a string tensor.
    pub fn as_strings(&self) -> Result<&[Vec<u8>]> {
        self.check_host()?;
        match &**self.storage.buffer() {
            Buffer::Strings(v) if self.dtype == DataType::String => {
                Ok(&v[self.offset..self.offset + self.numel()])
            }
            _ => Err(Error::InvalidArgument(format!(
                "tensor holds {}, not strings",
                self.dtype
            ))),
        }
    }

    /// The strings of a string tensor, for writing.
    pub fn as_strings_mut(&mut self) -> Result<&mut [Vec<u8>]> {
        self.check_host()?;
        if self.dtype != DataType::String {
            return Err(Error::InvalidArgument(format!(
                "tensor holds {}, not strings",
                self.dtype
            )));
        }
        let (off, n) = (self.offset, self.numel());
        match self.storage.buffer_mut() {
            Buffer::Strings(v) => Ok(&mut v[off..off + n]),
            _ => Err(Error::Runtime(
                "string tensor without string storage".into(),
            )),
        }
    }

    /// The raw bytes of the elements (not for strings; empty for memory on a device).
    pub fn bytes(&self) -> &[u8] {
        let n = self.numel() * self.dtype.item_size();
        let start = self.offset * self.dtype.item_size();
        let b = self.storage.buffer().bytes();
        &b[start.min(b.len())..(start + n).min(b.len())]
    }

    /// The raw bytes for writing (not for strings; empty for memory on a device).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if !self.is_host() {
            return &mut [];
        }
        let n = self.numel() * self.dtype.item_size();
        let start = self.offset * self.dtype.item_size();
        match self.storage.buffer_mut() {
            Buffer::Owned(b) if start + n <= b.len => {
                // SAFETY: in bounds and exclusive.
                unsafe { std::slice::from_raw_parts_mut(b.ptr.as_ptr().add(start), n) }
            }
            _ => &mut [],
        }
    }

    fn capacity_elems(&self) -> usize {
        let b = self.storage.buffer();
        match &**b {
            Buffer::Strings(v) => v.len(),
            other => other.byte_len() / self.dtype.item_size().max(1),
        }
    }

    /// Whether the buffer (host or device) belongs to this tensor's storage alone: views of
    /// this tensor share it, no other tensor does. A device backend writes such a buffer in
    /// place, as host kernels write an owned one.
    pub fn buffer_is_unshared(&self) -> bool {
        Arc::strong_count(self.storage.buffer()) == 1
    }

    /// Gives the tensor new dims over its current buffer when the element count and dtype
    /// allow (no data is touched, on any device); false when they do not.
    pub fn try_reshape_in_place(&mut self, dtype: DataType, dims: &[usize]) -> bool {
        if self.dtype != dtype || checked_numel(dims) != self.numel() {
            return false;
        }
        self.dims.clear();
        self.dims.extend_from_slice(dims);
        true
    }

    /// Whether writing would not copy: the buffer belongs to this storage alone and is owned.
    fn owns_buffer(&self) -> bool {
        let b = self.storage.buffer();
        Arc::strong_count(b) == 1 && !matches!(**b, Buffer::External { .. } | Buffer::Device(_))
    }

    /// Makes this tensor hold `dtype` elements in shape `dims`, keeping the buffer when it is
    /// owned alone and large enough (contents then undefined but initialized), otherwise
    /// allocating a zeroed one (which detaches it from any alias). Views keep their offset only
    /// when the new size fits.
    pub fn reset(&mut self, dtype: DataType, dims: &[usize]) {
        if let Err(e) = self.try_reset(dtype, dims) {
            alloc_failed(&e)
        }
    }

    /// [`reset`](Self::reset) for shapes from user input: an [`Error::OutOfMemory`] (the tensor
    /// left as it was) when a new buffer of that shape cannot be had.
    pub fn try_reset(&mut self, dtype: DataType, dims: &[usize]) -> Result<()> {
        // A tensor on a device is replaced by host memory: host code writes what follows.
        if self.dtype == dtype && self.dims == dims && self.is_host() {
            return Ok(());
        }
        let n = crate::error::checked_numel(dims, dtype.item_size(), &format!("a {dtype} tensor"))?;
        let fits = if dtype == DataType::String || self.dtype == DataType::String {
            dtype == self.dtype
                && self
                    .offset
                    .checked_add(n)
                    .is_some_and(|e| e <= self.capacity_elems())
        } else {
            let bytes = n.saturating_mul(dtype.item_size());
            let start = self.offset * self.dtype.item_size();
            start.is_multiple_of(dtype.item_size())
                && start
                    .checked_add(bytes)
                    .is_some_and(|e| e <= self.storage.buffer().byte_len())
                && self.owns_buffer()
        };
        if fits {
            if dtype != self.dtype {
                self.offset = self.offset * self.dtype.item_size() / dtype.item_size();
            }
            self.dtype = dtype;
            self.dims.clear();
            self.dims.extend_from_slice(dims);
        } else {
            *self = Tensor::try_new(dtype, dims)?;
        }
        Ok(())
    }

    /// [`reset`](Self::reset) to `T` and `dims`, then the elements for writing.
    #[inline]
    pub fn ensure<T: Element>(&mut self, dims: &[usize]) -> &mut [T] {
        self.reset(T::DTYPE, dims);
        match self.as_mut_slice::<T>() {
            Ok(s) => s,
            Err(_) => unreachable_unique(),
        }
    }

    /// [`ensure`](Self::ensure) for shapes from arguments or input values: an
    /// [`Error::OutOfMemory`] when no buffer of that shape can be had.
    pub fn try_ensure<T: Element>(&mut self, dims: &[usize]) -> Result<&mut [T]> {
        self.try_reset(T::DTYPE, dims)?;
        self.as_mut_slice::<T>()
    }

    /// [`resize`](Self::resize) for shapes from user input (see [`try_reset`](Self::try_reset)).
    pub fn try_resize(&mut self, dims: &[usize]) -> Result<()> {
        self.try_reset(self.dtype, dims)
    }

    /// Changes the shape keeping dtype (Caffe2's `Resize`): see [`reset`](Self::reset).
    pub fn resize(&mut self, dims: &[usize]) {
        self.reset(self.dtype, dims);
    }

    /// Changes the shape without touching the data; the element count must not change.
    pub fn reshape(&mut self, dims: &[usize]) -> Result<()> {
        if checked_numel(dims) != self.numel() {
            return Err(Error::InvalidArgument(format!(
                "cannot reshape a tensor of shape {:?} ({} elements) to {:?}",
                self.dims,
                self.numel(),
                dims
            )));
        }
        self.dims.clear();
        self.dims.extend_from_slice(dims);
        Ok(())
    }

    /// A view of `numel(dims)` elements starting `offset` elements into this tensor, sharing
    /// its storage (writes are seen by both).
    pub fn view(&self, offset: usize, dims: &[usize]) -> Result<Tensor> {
        let n = checked_numel(dims);
        if offset + n > self.numel() {
            return Err(Error::InvalidArgument(format!(
                "view of {n} elements at offset {offset} exceeds a tensor of {} elements",
                self.numel()
            )));
        }
        Ok(Tensor {
            dims: dims.to_vec(),
            dtype: self.dtype,
            storage: self.storage.clone(),
            offset: self.offset + offset,
        })
    }

    /// A tensor sharing this one's storage and shape (Caffe2's `ShareData`).
    pub fn alias(&self) -> Tensor {
        Tensor {
            dims: self.dims.clone(),
            dtype: self.dtype,
            storage: self.storage.clone(),
            offset: self.offset,
        }
    }

    /// A read-only copy-on-write handle on the current data. For a tensor on a device its
    /// bytes are empty: take the snapshot of [`to_host`](Self::to_host) to read the values.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            buf: self.storage.buffer().clone(),
            byte_offset: self.offset * self.dtype.item_size(),
            dims: self.dims.clone(),
            dtype: self.dtype,
        }
    }

    /// Copies `src` into this tensor (dtype and shape included), reusing this buffer if possible.
    pub fn copy_from(&mut self, src: &Tensor) {
        // Strings, and device memory (never written through the host), are shared.
        if src.dtype == DataType::String || !src.is_host() {
            *self = src.clone();
            return;
        }
        self.reset(src.dtype, &src.dims);
        let from = src.bytes();
        let to = self.bytes_mut();
        if to.len() == from.len() {
            to.copy_from_slice(from);
        } else {
            *self = src.clone();
        }
    }

    /// A deep copy with a buffer of its own.
    pub fn deep_copy(&self) -> Tensor {
        let mut t = Tensor::new(self.dtype, &self.dims);
        t.copy_from(self);
        t
    }

    /// Element `i` converted to f64 (any numeric or bool dtype).
    pub fn get_f64(&self, i: usize) -> Result<f64> {
        let bad = || Error::InvalidArgument(format!("index {i} out of range"));
        Ok(match self.dtype {
            DataType::Float => *self.as_slice::<f32>()?.get(i).ok_or_else(bad)? as f64,
            DataType::Double => *self.as_slice::<f64>()?.get(i).ok_or_else(bad)?,
            DataType::Int32 => *self.as_slice::<i32>()?.get(i).ok_or_else(bad)? as f64,
            DataType::Int64 => *self.as_slice::<i64>()?.get(i).ok_or_else(bad)? as f64,
            DataType::Bool => *self.as_slice::<bool>()?.get(i).ok_or_else(bad)? as u8 as f64,
            DataType::Uint8 => *self.as_slice::<u8>()?.get(i).ok_or_else(bad)? as f64,
            DataType::Int8 => *self.as_slice::<i8>()?.get(i).ok_or_else(bad)? as f64,
            DataType::Int16 => *self.as_slice::<i16>()?.get(i).ok_or_else(bad)? as f64,
            DataType::Uint16 => *self.as_slice::<u16>()?.get(i).ok_or_else(bad)? as f64,
            DataType::Float16 => self.as_slice::<f16>()?.get(i).ok_or_else(bad)?.to_f64(),
            DataType::String => {
                return Err(Error::InvalidArgument(
                    "string tensor has no numeric value".into(),
                ))
            }
        })
    }

    /// All elements as i64 (integer and bool dtypes).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        if !self.is_host() {
            // Shapes, indices and counts read by host code may live on a device: copy them.
            return self.to_host()?.to_i64_vec();
        }
        Ok(match self.dtype {
            DataType::Int32 => self.as_slice::<i32>()?.iter().map(|&v| v as i64).collect(),
            DataType::Int64 => self.as_slice::<i64>()?.to_vec(),
            DataType::Int16 => self.as_slice::<i16>()?.iter().map(|&v| v as i64).collect(),
            DataType::Int8 => self.as_slice::<i8>()?.iter().map(|&v| v as i64).collect(),
            DataType::Uint8 => self.as_slice::<u8>()?.iter().map(|&v| v as i64).collect(),
            DataType::Uint16 => self.as_slice::<u16>()?.iter().map(|&v| v as i64).collect(),
            DataType::Bool => self.as_slice::<bool>()?.iter().map(|&v| v as i64).collect(),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "expected an integer tensor, got {other}"
                )))
            }
        })
    }

    /// Serializes to a `TensorProto` (values in the fields Caffe2 uses for each dtype).
    ///
    /// The tensor must be on the host ([`to_host`](Self::to_host) first): device memory gives
    /// no values here.
    pub fn to_proto(&self, name: Option<&str>) -> TensorProto {
        let mut p = TensorProto {
            dims: self.dims.iter().map(|&d| d as i64).collect(),
            data_type: Some(self.dtype.to_proto()),
            name: name.map(str::to_string),
            ..Default::default()
        };
        macro_rules! ints {
            ($t:ty) => {
                p.int32_data = self
                    .as_slice::<$t>()
                    .map(|s| s.iter().map(|&v| v as i32).collect())
                    .unwrap_or_default()
            };
        }
        match self.dtype {
            DataType::Float => p.float_data = self.as_slice::<f32>().unwrap_or(&[]).to_vec(),
            DataType::Double => p.double_data = self.as_slice::<f64>().unwrap_or(&[]).to_vec(),
            DataType::Int64 => p.int64_data = self.as_slice::<i64>().unwrap_or(&[]).to_vec(),
            DataType::Int32 => ints!(i32),
            DataType::Int16 => ints!(i16),
            DataType::Int8 => ints!(i8),
            DataType::Uint8 => ints!(u8),
            DataType::Uint16 => ints!(u16),
            DataType::Bool => {
                p.int32_data = self
                    .as_slice::<bool>()
                    .map(|s| s.iter().map(|&v| v as i32).collect())
                    .unwrap_or_default()
            }
            DataType::Float16 => {
                p.int32_data = self
                    .as_slice::<f16>()
                    .map(|s| s.iter().map(|v| v.to_bits() as i32).collect())
                    .unwrap_or_default()
            }
            DataType::String => p.string_data = self.as_strings().unwrap_or(&[]).to_vec(),
        }
        p
    }

    /// Deserializes a `TensorProto` (typed fields or `raw_data`).
    pub fn from_proto(p: &TensorProto) -> Result<Tensor> {
        let dtype = DataType::from_proto(p.data_type.unwrap_or(1) as i64)?;
        let mut dims = Vec::with_capacity(p.dims.len());
        for &d in &p.dims {
            if d < 0 {
                return Err(Error::InvalidArgument(format!(
                    "TensorProto {:?} has a negative dimension {d}",
                    p.name()
                )));
            }
            dims.push(d as usize);
        }
        let n = checked_numel(&dims);
        if dtype == DataType::String {
            return Tensor::from_strings(&dims, p.string_data.clone());
        }
        if let Some(raw) = &p.raw_data {
            if raw.len() != n * dtype.item_size() {
                return Err(Error::InvalidArgument(format!(
                    "TensorProto {:?}: raw_data has {} bytes, shape {dims:?} of {dtype} needs {}",
                    p.name(),
                    raw.len(),
                    n * dtype.item_size()
                )));
            }
            let mut t = Tensor::new(dtype, &dims);
            if dtype == DataType::Bool {
                // Only 0 and 1 are valid bools.
                for (d, &b) in t.bytes_mut().iter_mut().zip(raw.iter()) {
                    *d = (b != 0) as u8;
                }
            } else {
                t.bytes_mut().copy_from_slice(raw);
            }
            return Ok(t);
        }
        let count = |len: usize, field: &str| {
            if len != n {
                Err(Error::InvalidArgument(format!(
                    "TensorProto {:?}: shape {dims:?} needs {n} values, {field} has {len}",
                    p.name()
                )))
            } else {
                Ok(())
            }
        };
        macro_rules! from_i32 {
            ($t:ty, $conv:expr) => {{
                count(p.int32_data.len(), "int32_data")?;
                let v: Vec<$t> = p.int32_data.iter().map($conv).collect();
                Tensor::from_vec(&dims, v)
            }};
        }
        match dtype {
            DataType::Float => {
                count(p.float_data.len(), "float_data")?;
                Tensor::from_slice(&dims, &p.float_data)
            }
            DataType::Double => {
                count(p.double_data.len(), "double_data")?;
                Tensor::from_slice(&dims, &p.double_data)
            }
            DataType::Int64 => {
                count(p.int64_data.len(), "int64_data")?;
                Tensor::from_slice(&dims, &p.int64_data)
            }
            DataType::Int32 => from_i32!(i32, |&v| v),
            DataType::Int16 => from_i32!(i16, |&v| v as i16),
            DataType::Int8 => from_i32!(i8, |&v| v as i8),
            DataType::Uint8 => {
                if p.int32_data.is_empty() && p.byte_data.as_ref().is_some_and(|b| b.len() == n) {
                    Tensor::from_slice(&dims, p.byte_data.as_deref().unwrap_or(&[]))
                } else {
                    from_i32!(u8, |&v| v as u8)
                }
            }
            DataType::Uint16 => from_i32!(u16, |&v| v as u16),
            DataType::Bool => from_i32!(bool, |&v| v != 0),
            DataType::Float16 => from_i32!(f16, |&v| f16::from_bits(v as u16)),
            DataType::String => unreachable_unique(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device memory for tests: bytes kept aside, reachable only through `copy_to_host`.
    struct FakeDeviceMemory(Vec<u8>);

    impl DeviceMemory for FakeDeviceMemory {
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn device(&self) -> Device {
            Device::Cuda(0)
        }
        fn byte_len(&self) -> usize {
            self.0.len()
        }
        fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
            let src = offset
                .checked_add(dst.len())
                .and_then(|end| self.0.get(offset..end))
                .ok_or_else(|| Error::InvalidArgument("range outside the memory".into()))?;
            dst.copy_from_slice(src);
            Ok(())
        }
    }

    fn on_fake_device(values: &[f32]) -> Tensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        Tensor::on_device(
            DataType::Float,
            &[values.len()],
            Box::new(FakeDeviceMemory(bytes)),
        )
        .unwrap()
    }

    #[test]
    fn device_memory_is_not_sliced_by_host_code() {
        let mut t = on_fake_device(&[1.0, 2.0, 3.0]);
        assert_eq!(t.device(), Device::Cuda(0));
        assert!(!t.is_host());
        let e = t.as_slice::<f32>().unwrap_err().to_string();
        assert!(
            e.contains("CUDA:0") && e.contains("copy it to the CPU"),
            "{e}"
        );
        assert!(t.as_mut_slice::<f32>().is_err());
        assert!(t.as_strings().is_err() && t.get_f64(0).is_err());
        assert!(t.bytes().is_empty() && t.bytes_mut().is_empty());
        // Copies share the device buffer; the host copy has the values.
        let mut c = Tensor::default();
        c.copy_from(&t);
        assert_eq!(c.device(), Device::Cuda(0));
        let h = t.to_host().unwrap();
        assert!(h.is_host());
        assert_eq!(h.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0]);
        // A view copies only its own range; a host write replaces the device buffer.
        let v = t.view(1, &[2]).unwrap();
        assert_eq!(v.to_host().unwrap().as_slice::<f32>().unwrap(), &[2.0, 3.0]);
        t.ensure::<f32>(&[2]).copy_from_slice(&[5.0, 6.0]);
        assert!(t.is_host());
        assert_eq!(t.as_slice::<f32>().unwrap(), &[5.0, 6.0]);
    }

    #[test]
    fn device_memory_of_the_wrong_size_is_refused() {
        let e = Tensor::on_device(
            DataType::Float,
            &[4],
            Box::new(FakeDeviceMemory(vec![0; 8])),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("8 bytes") && e.contains("16 bytes"), "{e}");
        assert!(
            Tensor::on_device(DataType::String, &[1], Box::new(FakeDeviceMemory(vec![]))).is_err()
        );
        let huge = Tensor::on_device(
            DataType::Float,
            &[usize::MAX, 2],
            Box::new(FakeDeviceMemory(vec![])),
        );
        assert!(huge.is_err());
    }

    #[test]
    fn clone_is_copy_on_write() {
        let mut a = Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap();
        let b = a.clone();
        a.as_mut_slice::<f32>().unwrap()[0] = 9.0;
        assert_eq!(a.as_slice::<f32>().unwrap(), &[9.0, 2.0, 3.0]);
        assert_eq!(b.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0]);
    }

    #[test]
    fn views_share_writes() {
        let big = Tensor::from_vec(&[2, 3], vec![0i64; 6]).unwrap();
        let mut row1 = big.view(3, &[3]).unwrap();
        row1.as_mut_slice::<i64>()
            .unwrap()
            .copy_from_slice(&[7, 8, 9]);
        assert_eq!(big.as_slice::<i64>().unwrap(), &[0, 0, 0, 7, 8, 9]);
        assert!(row1.shares_storage_with(&big));
        assert!(big.view(4, &[3]).is_err());
    }

    #[test]
    fn snapshot_is_isolated_from_later_writes() {
        let mut a = Tensor::from_vec(&[2], vec![1i32, 2]).unwrap();
        let snap = a.snapshot();
        a.as_mut_slice::<i32>().unwrap()[1] = 5;
        assert_eq!(snap.bytes(), &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(a.as_slice::<i32>().unwrap(), &[1, 5]);
    }

    #[test]
    fn ensure_reuses_owned_buffer_and_checks_dtype() {
        let mut t = Tensor::new(DataType::Float, &[8]);
        let p = t.as_slice::<f32>().unwrap().as_ptr();
        t.ensure::<f32>(&[2, 2]).fill(1.0);
        assert_eq!(t.as_slice::<f32>().unwrap().as_ptr(), p);
        assert!(t.as_slice::<i32>().is_err());
        t.ensure::<i64>(&[100]);
        assert_eq!(t.numel(), 100);
        assert_eq!(t.dtype(), DataType::Int64);
    }

    #[test]
    fn external_memory_is_copied_on_write() {
        let data: Arc<Vec<f32>> = Arc::new(vec![1.0, 2.0]);
        let ptr = data.as_ptr().cast::<u8>();
        let mut t =
            unsafe { Tensor::from_external(DataType::Float, &[2], ptr, Box::new(data.clone())) }
                .unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 2.0]);
        t.as_mut_slice::<f32>().unwrap()[0] = 4.0;
        assert_eq!(data[0], 1.0);
        assert_eq!(t.as_slice::<f32>().unwrap(), &[4.0, 2.0]);
    }

    #[test]
    fn proto_round_trip_every_dtype() {
        let ts = vec![
            Tensor::from_vec(&[2], vec![1.5f32, -2.0]).unwrap(),
            Tensor::from_vec(&[1, 2], vec![1.5f64, 3.0]).unwrap(),
            Tensor::from_vec(&[2], vec![-3i32, 4]).unwrap(),
            Tensor::from_vec(&[2], vec![-3i64, 1 << 40]).unwrap(),
            Tensor::from_vec(&[2], vec![true, false]).unwrap(),
            Tensor::from_vec(&[1], vec![255u8]).unwrap(),
            Tensor::from_vec(&[1], vec![-7i8]).unwrap(),
            Tensor::from_vec(&[1], vec![-300i16]).unwrap(),
            Tensor::from_vec(&[1], vec![60000u16]).unwrap(),
            Tensor::from_vec(&[1], vec![f16::from_f32(-0.5)]).unwrap(),
            Tensor::from_strings(&[2], vec![b"ab".to_vec(), vec![]]).unwrap(),
            Tensor::scalar(3.0f32),
        ];
        for t in ts {
            let p = t.to_proto(Some("x"));
            let back = Tensor::from_proto(&p).unwrap();
            assert_eq!(back.dims(), t.dims());
            assert_eq!(back.dtype(), t.dtype());
            if t.dtype() == DataType::String {
                assert_eq!(back.as_strings().unwrap(), t.as_strings().unwrap());
            } else {
                assert_eq!(back.bytes(), t.bytes(), "{t:?}");
            }
        }
    }

    #[test]
    fn raw_bool_bytes_are_normalised() {
        let p = TensorProto {
            dims: vec![3],
            data_type: Some(5),
            raw_data: Some(vec![0, 7, 1]),
            ..Default::default()
        };
        let t = Tensor::from_proto(&p).unwrap();
        assert_eq!(t.as_slice::<bool>().unwrap(), &[false, true, true]);
    }

    #[test]
    fn proto_errors_name_the_problem() {
        let p = TensorProto {
            dims: vec![3],
            float_data: vec![1.0],
            ..Default::default()
        };
        let e = Tensor::from_proto(&p).unwrap_err().to_string();
        assert!(e.contains("needs 3 values"), "{e}");
    }

    #[test]
    fn try_new_and_try_ensure_refuse_what_no_memory_holds_and_keep_the_tensor() {
        use crate::error::ErrorKind;
        // Overflowing element count, overflowing byte size, and a size past any address space
        // (the allocator returns null: an error, not an abort).
        for dims in [&[usize::MAX, 2][..], &[1 << 62], &[1 << 50, 1 << 4]] {
            let e = Tensor::try_new(DataType::Float, dims).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{dims:?}: {e}");
        }
        let e = Tensor::try_new(DataType::String, &[1 << 60]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
        let mut t = Tensor::from_slice(&[2], &[1.0f32, 2.0]).unwrap();
        let e = t.try_ensure::<f32>(&[1 << 40, 1 << 20]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
        assert_eq!(t.dims(), &[2]);
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 2.0]);
        assert_eq!(t.try_ensure::<f32>(&[0, 7]).unwrap().len(), 0);
        assert_eq!(t.dims(), &[0, 7]);
        assert_eq!(Tensor::try_new(DataType::Int64, &[3]).unwrap().numel(), 3);
    }
}
