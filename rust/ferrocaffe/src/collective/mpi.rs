//! MPI, loaded at run time with `libloading`: no MPI is needed to build or import ferrocaffe.
//!
//! Which library: `FERROCAFFE_MPI_LIBRARY` (a path or a soname; when set, nothing else is
//! tried), then an MPI library this process already mapped (mpi4py's), then the candidates the
//! Python side gave ([`set_library_candidates`]), then the default names. Two ABIs are spoken:
//! the MPI 5.0 standard ABI (`libmpi_abi.so.1`: handles are pointer-sized with fixed values)
//! and MPICH's own (`libmpi.so.12`: `int` handles); [`Abi`] says which, read from
//! `MPI_Abi_get_version` (the standard ABI answers a major version of 1 or more) or from the
//! MPICH symbols. Open MPI's own ABI (handles are addresses of its globals) is not spoken.
//!
//! MPI is initialized once, lazily (`MPI_Init_thread` asking for `MPI_THREAD_MULTIPLE`), or not
//! at all when someone else (mpi4py) already did. Every call into the library is made under
//! one process-wide lock, so `MPI_THREAD_SERIALIZED` is enough. Collectives are the
//! non-blocking ones (`MPI_Iallreduce`, ...), polled with `MPI_Test` until a deadline: a peer
//! that died makes the op fail with a timeout instead of hanging.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::tensor::DataType;

/// The environment variable naming the MPI library to load.
pub const LIBRARY_ENV: &str = "FERROCAFFE_MPI_LIBRARY";

/// The default names tried last, in order.
pub const DEFAULT_NAMES: [&str; 4] = [
    "libmpi_abi.so.1",
    "libmpi.so.12",
    "libmpi.so.40",
    "libmpi.so",
];

/// Which binary interface the loaded library speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// The MPI 5.0 standard ABI (`mpi_abi.h`).
    Standard,
    /// MPICH's ABI (`libmpi.so.12` of MPICH and its derivatives).
    Mpich,
}

/// The predefined handles and constants of one ABI (values from its `mpi.h`).
#[derive(Debug, Clone, Copy)]
pub struct Consts {
    comm_world: i64,
    comm_null: i64,
    request_null: i64,
    op_sum: i64,
    errors_return: i64,
    float: i64,
    double: i64,
    int32: i64,
    int64: i64,
    byte: i64,
    /// `MPI_ANY_SOURCE`.
    pub any_source: i32,
    /// `MPI_ANY_TAG`.
    pub any_tag: i32,
    in_place: usize,
    thread_serialized: c_int,
    thread_multiple: c_int,
    status_source: usize,
    status_tag: usize,
}

impl Abi {
    /// The constants of this ABI.
    pub fn consts(self) -> Consts {
        match self {
            Abi::Standard => Consts {
                comm_world: 0x101,
                comm_null: 0x100,
                request_null: 0x180,
                op_sum: 0x21,
                errors_return: 0x143,
                float: 0x210,
                double: 0x214,
                int32: 0x250,
                int64: 0x258,
                byte: 0x247,
                any_source: -1,
                any_tag: -2,
                in_place: 1,
                thread_serialized: 2048,
                thread_multiple: 4096,
                status_source: 0,
                status_tag: 1,
            },
            Abi::Mpich => Consts {
                comm_world: 0x4400_0000,
                comm_null: 0x0400_0000,
                request_null: 0x2c00_0000,
                op_sum: 0x5800_0003,
                errors_return: 0x5400_0001,
                float: 0x4c00_040a,
                double: 0x4c00_080b,
                int32: 0x4c00_0439,
                int64: 0x4c00_083a,
                byte: 0x4c00_010d,
                any_source: -2,
                any_tag: -1,
                in_place: usize::MAX,
                thread_serialized: 2,
                thread_multiple: 3,
                status_source: 2,
                status_tag: 3,
            },
        }
    }
}

impl Consts {
    /// The MPI datatype of a tensor element type, for the types reductions support.
    pub fn datatype(&self, dtype: DataType) -> Option<i64> {
        match dtype {
            DataType::Float => Some(self.float),
            DataType::Double => Some(self.double),
            DataType::Int32 => Some(self.int32),
            DataType::Int64 => Some(self.int64),
            _ => None,
        }
    }

    /// `MPI_BYTE`.
    pub fn byte(&self) -> i64 {
        self.byte
    }

    /// `MPI_IN_PLACE`.
    fn in_place(&self) -> *const c_void {
        self.in_place as *const c_void
    }
}

/// A handle of the library's own width: `int` for MPICH, a pointer for the standard ABI.
trait Handle: Copy + Send + Sync + 'static {
    fn from_raw(v: i64) -> Self;
    fn to_raw(self) -> i64;
}

impl Handle for c_int {
    fn from_raw(v: i64) -> Self {
        // Handles are produced by the same library at this width; constants fit.
        c_int::try_from(v).unwrap_or(0)
    }
    fn to_raw(self) -> i64 {
        i64::from(self)
    }
}

impl Handle for isize {
    fn from_raw(v: i64) -> Self {
        isize::try_from(v).unwrap_or(0)
    }
    fn to_raw(self) -> i64 {
        self as i64
    }
}

type Rc = c_int;
type Buf = *const c_void;
type BufMut = *mut c_void;

/// The entry points used, at the handle width `H`.
#[derive(Clone, Copy)]
struct Fns<H> {
    init_thread: unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, *mut c_int) -> Rc,
    initialized: unsafe extern "C" fn(*mut c_int) -> Rc,
    finalized: unsafe extern "C" fn(*mut c_int) -> Rc,
    finalize: unsafe extern "C" fn() -> Rc,
    query_thread: unsafe extern "C" fn(*mut c_int) -> Rc,
    comm_size: unsafe extern "C" fn(H, *mut c_int) -> Rc,
    comm_rank: unsafe extern "C" fn(H, *mut c_int) -> Rc,
    comm_idup: unsafe extern "C" fn(H, *mut H, *mut H) -> Rc,
    comm_free: unsafe extern "C" fn(*mut H) -> Rc,
    comm_set_errhandler: unsafe extern "C" fn(H, H) -> Rc,
    error_string: unsafe extern "C" fn(c_int, *mut c_char, *mut c_int) -> Rc,
    iallreduce: unsafe extern "C" fn(Buf, BufMut, c_int, H, H, H, *mut H) -> Rc,
    ibcast: unsafe extern "C" fn(BufMut, c_int, H, c_int, H, *mut H) -> Rc,
    ireduce: unsafe extern "C" fn(Buf, BufMut, c_int, H, H, c_int, H, *mut H) -> Rc,
    iallgather: unsafe extern "C" fn(Buf, c_int, H, BufMut, c_int, H, H, *mut H) -> Rc,
    ireduce_scatter: unsafe extern "C" fn(Buf, BufMut, *const c_int, H, H, H, *mut H) -> Rc,
    ibarrier: unsafe extern "C" fn(H, *mut H) -> Rc,
    isend: unsafe extern "C" fn(Buf, c_int, H, c_int, c_int, H, *mut H) -> Rc,
    irecv: unsafe extern "C" fn(BufMut, c_int, H, c_int, c_int, H, *mut H) -> Rc,
    test: unsafe extern "C" fn(*mut H, *mut c_int, *mut c_int) -> Rc,
    get_count: unsafe extern "C" fn(*const c_int, H, *mut c_int) -> Rc,
}

/// Resolves one symbol as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the C signature of `name` in the loaded library's ABI.
unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T> {
    let cname = format!("{name}\0");
    // SAFETY: per the function contract.
    let s: libloading::Symbol<'_, T> = unsafe { lib.get(cname.as_bytes()) }
        .map_err(|e| Error::Runtime(format!("the MPI library lacks {name}: {e}")))?;
    Ok(*s)
}

impl<H: Handle> Fns<H> {
    /// # Safety
    /// `H` must be the handle width of the library's ABI.
    unsafe fn load(lib: &libloading::Library) -> Result<Self> {
        // SAFETY: each signature is the one of the MPI standard, at this ABI's handle width.
        unsafe {
            Ok(Fns {
                init_thread: sym(lib, "MPI_Init_thread")?,
                initialized: sym(lib, "MPI_Initialized")?,
                finalized: sym(lib, "MPI_Finalized")?,
                finalize: sym(lib, "MPI_Finalize")?,
                query_thread: sym(lib, "MPI_Query_thread")?,
                comm_size: sym(lib, "MPI_Comm_size")?,
                comm_rank: sym(lib, "MPI_Comm_rank")?,
                comm_idup: sym(lib, "MPI_Comm_idup")?,
                comm_free: sym(lib, "MPI_Comm_free")?,
                comm_set_errhandler: sym(lib, "MPI_Comm_set_errhandler")?,
                error_string: sym(lib, "MPI_Error_string")?,
                iallreduce: sym(lib, "MPI_Iallreduce")?,
                ibcast: sym(lib, "MPI_Ibcast")?,
                ireduce: sym(lib, "MPI_Ireduce")?,
                iallgather: sym(lib, "MPI_Iallgather")?,
                ireduce_scatter: sym(lib, "MPI_Ireduce_scatter")?,
                ibarrier: sym(lib, "MPI_Ibarrier")?,
                isend: sym(lib, "MPI_Isend")?,
                irecv: sym(lib, "MPI_Irecv")?,
                test: sym(lib, "MPI_Test")?,
                get_count: sym(lib, "MPI_Get_count")?,
            })
        }
    }
}

#[derive(Clone, Copy)]
enum Api {
    Mpich(Fns<c_int>),
    Standard(Fns<isize>),
}

/// Calls `$f` of whichever ABI is loaded, converting the named handle arguments to its width:
/// `call!(api, fname(args...); handles h1, h2)` binds `h1`, `h2` as that width first.
macro_rules! with_fns {
    ($api:expr, |$f:ident, $H:ident| $body:expr) => {
        match $api {
            Api::Mpich($f) => {
                type $H = c_int;
                $body
            }
            Api::Standard($f) => {
                type $H = isize;
                $body
            }
        }
    };
}

/// A loaded, initialized MPI library.
pub struct Mpi {
    _library: libloading::Library,
    api: Api,
    /// The ABI spoken.
    pub abi: Abi,
    /// Its constants.
    pub consts: Consts,
    /// Where it was loaded from.
    pub path: String,
    /// Whether ferrocaffe called `MPI_Init_thread` (false when mpi4py or the host did).
    pub initialized_here: bool,
}

/// The outcome of one completed request.
#[derive(Debug, Clone, Copy)]
pub struct Status {
    /// `MPI_SOURCE`.
    pub source: i32,
    /// `MPI_TAG`.
    pub tag: i32,
    raw: [c_int; 8],
}

/// Why [`Mpi::wait`] returned without a completed request.
#[derive(Debug)]
pub enum WaitError {
    /// The deadline passed; the request is still pending (and must be leaked).
    TimedOut(Request),
    /// MPI reported an error (the message).
    Failed(String),
}

/// One outstanding non-blocking operation.
#[derive(Debug)]
#[must_use = "a request must be waited for"]
pub struct Request(i64);

static CANDIDATES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static MPI: OnceLock<std::result::Result<Mpi, String>> = OnceLock::new();
/// Set when a request was left pending (a timeout): MPI_Finalize could then wait for it.
static ABANDONED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Serializes every call into the library.
static CALL_LOCK: Mutex<()> = Mutex::new(());

/// Libraries to try after the environment variable and the already-mapped ones, before the
/// default names (the Python side passes the wheel's `lib/` files here).
pub fn set_library_candidates(paths: Vec<String>) {
    let mut c = CANDIDATES.lock().unwrap_or_else(|p| p.into_inner());
    *c = paths;
}

fn call_lock() -> MutexGuard<'static, ()> {
    CALL_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn not_found(tried: &[(String, String)]) -> String {
    let mut msg = String::from(
        "MPI was not found: the MPI engine loads an MPI library at run time and none could be \
         loaded. Install one (e.g. `pip install mpich mpi4py`, or your system's MPICH) and run \
         under `mpiexec`, or set FERROCAFFE_MPI_LIBRARY to the path of libmpi_abi.so.1 (MPI 5.0 \
         standard ABI) or MPICH's libmpi.so.12.",
    );
    if !tried.is_empty() {
        msg.push_str(" Tried: ");
        let parts: Vec<String> = tried.iter().map(|(n, e)| format!("{n} ({e})")).collect();
        msg.push_str(&parts.join("; "));
    }
    msg
}

fn open(name: &str) -> std::result::Result<libloading::Library, String> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: loading an MPI library runs its initializers, which have no preconditions.
        unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) }
            .map(Into::into)
            .map_err(|e| e.to_string())
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above.
        unsafe { libloading::Library::new(name) }.map_err(|e| e.to_string())
    }
}

/// An MPI library this process has already mapped (mpi4py's), by soname.
fn already_mapped() -> Option<String> {
    #[cfg(target_os = "linux")]
    {
        use libloading::os::unix::{Library, RTLD_LAZY};
        const RTLD_NOLOAD: c_int = 4;
        for name in DEFAULT_NAMES {
            // SAFETY: RTLD_NOLOAD only looks a loaded library up; nothing is initialized.
            if unsafe { Library::open(Some(name), RTLD_LAZY | RTLD_NOLOAD) }.is_ok() {
                return Some(name.to_string());
            }
        }
    }
    None
}

fn detect_abi(lib: &libloading::Library, path: &str) -> std::result::Result<Abi, String> {
    // SAFETY: MPI_Abi_get_version(int*, int*) may be called before MPI_Init.
    let abi_version: Option<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int> =
        unsafe { sym(lib, "MPI_Abi_get_version") }.ok();
    if let Some(f) = abi_version {
        let (mut major, mut minor) = (-1, -1);
        // SAFETY: two valid out-pointers.
        let rc = unsafe { f(&mut major, &mut minor) };
        if rc == 0 && major >= 1 {
            return Ok(Abi::Standard);
        }
    }
    let has = |s: &str| {
        // SAFETY: only the symbol's presence is checked.
        unsafe { lib.get::<*const c_void>(format!("{s}\0").as_bytes()) }.is_ok()
    };
    if has("MPIR_Err_return_comm") || has("MPICH_Abi_get_version") || path.contains("mpich") {
        return Ok(Abi::Mpich);
    }
    if has("ompi_mpi_comm_world") {
        return Err(format!(
            "{path} is Open MPI with its own ABI, which ferrocaffe does not speak; use an MPI \
             with the MPI 5.0 standard ABI (libmpi_abi.so.1, e.g. Open MPI 6 or MPICH 4.3+) or \
             MPICH's libmpi.so.12"
        ));
    }
    // MPICH derivatives (Intel MPI, Cray MPICH) export MPICH's internal symbols.
    if has("MPIR_Init_thread") || has("MPID_Init") {
        return Ok(Abi::Mpich);
    }
    Err(format!(
        "{path}: unknown MPI ABI (neither the MPI 5.0 standard ABI nor MPICH's)"
    ))
}

fn load() -> std::result::Result<Mpi, String> {
    let mut names: Vec<String> = Vec::new();
    let env = std::env::var(LIBRARY_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty());
    if let Some(p) = &env {
        names.push(p.trim().to_string());
    } else {
        names.extend(already_mapped());
        names.extend(
            CANDIDATES
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        names.extend(DEFAULT_NAMES.iter().map(|s| s.to_string()));
    }
    let mut tried = Vec::new();
    for name in names {
        match open(&name) {
            Ok(lib) => {
                let abi = detect_abi(&lib, &name)?;
                return init(lib, abi, name);
            }
            Err(e) => tried.push((name, e)),
        }
    }
    let mut msg = not_found(&tried);
    if let Some(p) = env {
        msg = format!("{msg} ({LIBRARY_ENV}={p} is set, so nothing else was tried.)");
    }
    Err(msg)
}

fn init(lib: libloading::Library, abi: Abi, path: String) -> std::result::Result<Mpi, String> {
    let consts = abi.consts();
    // SAFETY: the handle width matches the detected ABI.
    let api = unsafe {
        match abi {
            Abi::Mpich => Api::Mpich(Fns::load(&lib).map_err(|e| e.to_string())?),
            Abi::Standard => Api::Standard(Fns::load(&lib).map_err(|e| e.to_string())?),
        }
    };
    let _g = call_lock();
    let mut initialized_here = false;
    with_fns!(api, |f, H| {
        let (mut inited, mut fin) = (0, 0);
        // SAFETY: valid out-pointers; these two may be called at any time.
        unsafe {
            (f.initialized)(&mut inited);
            (f.finalized)(&mut fin);
        }
        if fin != 0 {
            return Err("MPI was already finalized in this process".to_string());
        }
        let mut provided: c_int = 0;
        if inited == 0 {
            // SAFETY: argc/argv may be null; `provided` is a valid out-pointer.
            let rc = unsafe {
                (f.init_thread)(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    consts.thread_multiple,
                    &mut provided,
                )
            };
            if rc != 0 {
                return Err(format!("MPI_Init_thread failed with code {rc} ({path})"));
            }
            initialized_here = true;
        } else {
            // SAFETY: valid out-pointer, MPI is initialized.
            unsafe { (f.query_thread)(&mut provided) };
        }
        if provided < consts.thread_serialized {
            return Err(format!(
                "MPI ({path}) was initialized with thread level {provided}; ferrocaffe runs \
                 collectives from worker threads and needs MPI_THREAD_SERIALIZED or \
                 MPI_THREAD_MULTIPLE (mpi4py: set mpi4py.rc.thread_level = 'multiple' before \
                 importing mpi4py.MPI)"
            ));
        }
        // Errors come back as codes instead of aborting the job.
        // SAFETY: predefined handles of this ABI.
        unsafe {
            (f.comm_set_errhandler)(
                H::from_raw(consts.comm_world),
                H::from_raw(consts.errors_return),
            )
        };
    });
    Ok(Mpi {
        _library: lib,
        api,
        abi,
        consts,
        path,
        initialized_here,
    })
}

/// The process's MPI, loaded and initialized on first use.
pub fn get() -> Result<&'static Mpi> {
    match MPI.get_or_init(load) {
        Ok(m) => Ok(m),
        Err(e) => Err(Error::Runtime(e.clone())),
    }
}

/// Whether an MPI library was loaded (without trying to load one).
pub fn loaded() -> Option<&'static Mpi> {
    MPI.get().and_then(|r| r.as_ref().ok())
}

/// Finalizes MPI at exit when ferrocaffe initialized it (mpi4py finalizes what it
/// initialized). Skipped when a request was abandoned after a timeout, since `MPI_Finalize`
/// could wait for it forever: the process then exits without it. Returns whether it ran.
pub fn finalize() -> bool {
    let Some(m) = loaded() else {
        return false;
    };
    if !m.initialized_here || ABANDONED.load(std::sync::atomic::Ordering::SeqCst) {
        return false;
    }
    let _g = call_lock();
    with_fns!(m.api, |f, _H| {
        let mut fin: c_int = 0;
        // SAFETY: valid out-pointer; MPI_Finalize runs once, guarded by MPI_Finalized.
        unsafe {
            (f.finalized)(&mut fin);
            if fin != 0 {
                return false;
            }
            (f.finalize)() == 0
        }
    })
}

/// A count as MPI's `int`.
pub fn count(n: usize, what: &str) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| {
        Error::InvalidArgument(format!(
            "{what}: {n} elements do not fit one MPI call (at most {})",
            c_int::MAX
        ))
    })
}

impl Mpi {
    fn check(&self, rc: c_int, what: &str) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let mut buf = vec![0 as c_char; 1024];
        let mut len: c_int = 0;
        with_fns!(self.api, |f, _H| {
            // SAFETY: the buffer holds MPI_MAX_ERROR_STRING (512) characters and more.
            unsafe { (f.error_string)(rc, buf.as_mut_ptr(), &mut len) };
        });
        let len = usize::try_from(len).unwrap_or(0).min(buf.len());
        let text: String = buf[..len].iter().map(|&c| c as u8 as char).collect();
        Err(Error::Runtime(format!(
            "{what} failed: {text} (MPI error {rc})"
        )))
    }

    /// `MPI_COMM_WORLD`.
    pub fn comm_world(&self) -> i64 {
        self.consts.comm_world
    }

    /// Rank and size of `comm`.
    pub fn rank_size(&self, comm: i64) -> Result<(i32, i32)> {
        let (mut rank, mut size) = (0, 0);
        let _g = call_lock();
        let (r1, r2) = with_fns!(self.api, |f, H| unsafe {
            // SAFETY: a communicator handle of this library and valid out-pointers.
            (
                (f.comm_rank)(H::from_raw(comm), &mut rank),
                (f.comm_size)(H::from_raw(comm), &mut size),
            )
        });
        self.check(r1, "MPI_Comm_rank")?;
        self.check(r2, "MPI_Comm_size")?;
        Ok((rank, size))
    }

    /// Starts duplicating `comm`; the new handle is valid once the request completes.
    pub fn comm_idup(&self, comm: i64) -> Result<(Box<i64>, Request)> {
        let _g = call_lock();
        let (rc, newcomm, req) = with_fns!(self.api, |f, H| {
            let mut newcomm = H::from_raw(self.consts.comm_null);
            let mut req = H::from_raw(self.consts.request_null);
            // SAFETY: valid handle and out-pointers; `newcomm` is read only after completion,
            // and MPI_Comm_idup writes it at the call (MPICH) or at completion: it lives in a
            // box returned to the caller that outlives the request.
            let rc = unsafe { (f.comm_idup)(H::from_raw(comm), &mut newcomm, &mut req) };
            (rc, newcomm.to_raw(), req.to_raw())
        });
        self.check(rc, "MPI_Comm_idup")?;
        Ok((Box::new(newcomm), Request(req)))
    }

    /// Frees a communicator (not `MPI_COMM_WORLD`).
    pub fn comm_free(&self, comm: i64) -> Result<()> {
        if comm == self.consts.comm_world {
            return Ok(());
        }
        let _g = call_lock();
        let rc = with_fns!(self.api, |f, H| {
            let mut h = H::from_raw(comm);
            // SAFETY: a communicator this library created.
            unsafe { (f.comm_free)(&mut h) }
        });
        self.check(rc, "MPI_Comm_free")
    }

    fn start(&self, what: &str, call: impl FnOnce(&Api, &mut i64) -> c_int) -> Result<Request> {
        let mut req = self.consts.request_null;
        let rc = {
            let _g = call_lock();
            call(&self.api, &mut req)
        };
        self.check(rc, what)?;
        Ok(Request(req))
    }

    /// Starts a sum all-reduce of `count` elements of `dtype`; `send` null means in place.
    ///
    /// # Safety
    /// The buffers must hold `count` elements and stay valid until the request completes.
    pub unsafe fn iallreduce(
        &self,
        send: Option<*const u8>,
        recv: *mut u8,
        count: c_int,
        dtype: i64,
        comm: i64,
    ) -> Result<Request> {
        let send = send.map_or(self.consts.in_place(), |p| p.cast());
        let op = self.consts.op_sum;
        self.start("MPI_Iallreduce", |api, req| {
            with_fns!(*api, |f, H| {
                let mut r = H::from_raw(*req);
                // SAFETY: per the function contract.
                let rc = unsafe {
                    (f.iallreduce)(
                        send,
                        recv.cast(),
                        count,
                        H::from_raw(dtype),
                        H::from_raw(op),
                        H::from_raw(comm),
                        &mut r,
                    )
                };
                *req = r.to_raw();
                rc
            })
        })
    }

    /// Starts a broadcast from `root`.
    ///
    /// # Safety
    /// As [`Mpi::iallreduce`].
    pub unsafe fn ibcast(
        &self,
        buf: *mut u8,
        count: c_int,
        dtype: i64,
        root: c_int,
        comm: i64,
    ) -> Result<Request> {
        self.start("MPI_Ibcast", |api, req| {
            with_fns!(*api, |f, H| {
                let mut r = H::from_raw(*req);
                // SAFETY: per the function contract.
                let rc = unsafe {
                    (f.ibcast)(
                        buf.cast(),
                        count,
                        H::from_raw(dtype),
                        root,
                        H::from_raw(comm),
                        &mut r,
                    )
                };
                *req = r.to_raw();
                rc
            })
        })
    }

    /// Starts a sum reduction onto `root`; `send` null means in place (root only).
    ///
    /// # Safety
    /// As [`Mpi::iallreduce`].
    pub unsafe fn ireduce(
        &self,
        send: Option<*const u8>,
        recv: *mut u8,
        count: c_int,
        dtype: i64,
        root: c_int,
        comm: i64,
    ) -> Result<Request> {
        let send = send.map_or(self.consts.in_place(), |p| p.cast());
        let op = self.consts.op_sum;
        self.start("MPI_Ireduce", |api, req| {
            with_fns!(*api, |f, H| {
                let mut r = H::from_raw(*req);
                // SAFETY: per the function contract.
                let rc = unsafe {
                    (f.ireduce)(
                        send,
                        recv.cast(),
                        count,
                        H::from_raw(dtype),
                        H::from_raw(op),
                        root,
                        H::from_raw(comm),
                        &mut r,
                    )
                };
                *req = r.to_raw();
                rc
            })
        })
    }

    /// Starts an all-gather of `count` elements per rank.
    ///
    /// # Safety
    /// `send` holds `count` elements, `recv` `count * size`; both valid until completion.
    pub unsafe fn iallgather(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: c_int,
        dtype: i64,
        comm: i64,
    ) -> Result<Request> {
        self.start("MPI_Iallgather", |api, req| {
            with_fns!(*api, |f, H| {
                let mut r = H::from_raw(*req);
                // SAFETY: per the function contract.
                let rc = unsafe {
                    (f.iallgather)(
                        send.cast(),
                        count,
                        H::from_raw(dtype),
                        recv.cast(),
                        count,
                        H::from_raw(dtype),
                        H::from_raw(comm),
                        &mut r,
                    )
                };
                *req = r.to_raw();
                rc
            })
        })
    }

    /// Starts a sum reduce-scatter: rank `r` receives `counts[r]` elements.
    ///
    /// # Safety
    /// `send` holds the sum of `counts`, `recv` this rank's count, `counts` one per rank; all
    /// valid until completion.
    pub unsafe fn ireduce_scatter(
        &self,
        send: *const u8,
        recv: *mut u8,
        counts: *const c_int,
        dtype: i64,
        comm: i64,
    ) -> Result<Request> {
        let op = self.consts.op_sum;
        self.start("MPI_Ireduce_scatter", |api, req| {
            with_fns!(*api, |f, H| {
                let mut r = H::from_raw(*req);
                // SAFETY: per the function contract.
                let rc = unsafe {
                    (f.ireduce_scatter)(
                        send.cast(),
                        recv.cast(),
                        counts,
                        H::from_raw(dtype),
                        H::from_raw(op),
                        H::from_raw(comm),
                        &mut r,
                    )
                };
                *req = r.to_raw();
                rc
            })
        })
    }

    /// Starts a barrier.
    pub fn ibarrier(&self, comm: i64) -> Result<Request> {
        self.start("MPI_Ibarrier", |api, req| {
            with_fns!(*api, |f, H| {
                let mut r = H::from_raw(*req);
                // SAFETY: a communicator handle and an out-pointer.
                let rc = unsafe { (f.ibarrier)(H::from_raw(comm), &mut r) };
                *req = r.to_raw();
                rc
            })
        })
    }

    /// Starts sending `count` elements to `dest`.
    ///
    /// # Safety
    /// As [`Mpi::iallreduce`].
    pub unsafe fn isend(
        &self,
        buf: *const u8,
        count: c_int,
        dtype: i64,
        dest: c_int,
        tag: c_int,
        comm: i64,
    ) -> Result<Request> {
        self.start("MPI_Isend", |api, req| {
            with_fns!(*api, |f, H| {
                let mut r = H::from_raw(*req);
                // SAFETY: per the function contract.
                let rc = unsafe {
                    (f.isend)(
                        buf.cast(),
                        count,
                        H::from_raw(dtype),
                        dest,
                        tag,
                        H::from_raw(comm),
                        &mut r,
                    )
                };
                *req = r.to_raw();
                rc
            })
        })
    }

    /// Starts receiving at most `count` elements from `source` (or `any_source`).
    ///
    /// # Safety
    /// As [`Mpi::iallreduce`].
    pub unsafe fn irecv(
        &self,
        buf: *mut u8,
        count: c_int,
        dtype: i64,
        source: c_int,
        tag: c_int,
        comm: i64,
    ) -> Result<Request> {
        self.start("MPI_Irecv", |api, req| {
            with_fns!(*api, |f, H| {
                let mut r = H::from_raw(*req);
                // SAFETY: per the function contract.
                let rc = unsafe {
                    (f.irecv)(
                        buf.cast(),
                        count,
                        H::from_raw(dtype),
                        source,
                        tag,
                        H::from_raw(comm),
                        &mut r,
                    )
                };
                *req = r.to_raw();
                rc
            })
        })
    }

    /// Number of `dtype` elements a completed receive got.
    pub fn get_count(&self, status: &Status, dtype: i64) -> Result<usize> {
        let mut n: c_int = 0;
        let _g = call_lock();
        let rc = with_fns!(self.api, |f, H| {
            // SAFETY: a status filled by MPI_Test and an out-pointer.
            unsafe { (f.get_count)(status.raw.as_ptr(), H::from_raw(dtype), &mut n) }
        });
        drop(_g);
        self.check(rc, "MPI_Get_count")?;
        usize::try_from(n).map_err(|_| Error::Runtime(format!("MPI_Get_count returned {n}")))
    }

    /// Polls `req` until it completes or `deadline` passes. On timeout the request is left
    /// pending (MPI cannot cancel a collective): the caller must keep its buffers alive for
    /// good and stop using the communicator.
    pub fn wait(&self, req: Request, deadline: Instant) -> std::result::Result<Status, WaitError> {
        let started = Instant::now();
        let mut raw_req = req.0;
        loop {
            let mut flag: c_int = 0;
            let mut raw = [0 as c_int; 8];
            let rc = {
                let _g = call_lock();
                with_fns!(self.api, |f, H| {
                    let mut r = H::from_raw(raw_req);
                    // SAFETY: a request of this library, valid out-pointers; the status
                    // buffer is larger than either ABI's MPI_Status.
                    let rc = unsafe { (f.test)(&mut r, &mut flag, raw.as_mut_ptr()) };
                    raw_req = r.to_raw();
                    rc
                })
            };
            if rc != 0 {
                return Err(WaitError::Failed(
                    self.check(rc, "MPI_Test")
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                ));
            }
            if flag != 0 {
                return Ok(Status {
                    source: raw[self.consts.status_source],
                    tag: raw[self.consts.status_tag],
                    raw,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                ABANDONED.store(true, std::sync::atomic::Ordering::SeqCst);
                return Err(WaitError::TimedOut(Request(raw_req)));
            }
            // Yield briefly (a collective between ranks on one machine completes within
            // microseconds when every rank has a core), then sleep: ranks that share cores
            // (more processes than cores) need those cores to make progress.
            if now.duration_since(started) < Duration::from_micros(100) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_follow_each_abi_header() {
        let s = Abi::Standard.consts();
        assert_eq!(s.comm_world, 0x101);
        assert_eq!(s.datatype(DataType::Float), Some(0x210));
        assert_eq!(s.datatype(DataType::Int64), Some(0x258));
        assert_eq!(s.datatype(DataType::String), None);
        assert_eq!((s.any_source, s.any_tag), (-1, -2));
        let m = Abi::Mpich.consts();
        assert_eq!(m.comm_world, 0x4400_0000);
        assert_eq!(m.datatype(DataType::Double), Some(0x4c00_080b));
        assert_eq!(m.datatype(DataType::Int32), Some(0x4c00_0439));
        assert_eq!((m.any_source, m.any_tag), (-2, -1));
        assert_eq!(m.in_place() as usize, usize::MAX);
    }

    #[test]
    fn handles_round_trip_at_both_widths() {
        assert_eq!(
            <c_int as Handle>::from_raw(0x4400_0000).to_raw(),
            0x4400_0000
        );
        assert_eq!(<isize as Handle>::from_raw(0x101).to_raw(), 0x101);
    }

    #[test]
    fn counts_past_int_are_refused() {
        assert_eq!(count(5, "x").unwrap(), 5);
        let e = count(usize::MAX, "Allreduce").unwrap_err().to_string();
        assert!(e.contains("do not fit one MPI call"), "{e}");
    }

    #[test]
    fn a_missing_library_names_what_to_do() {
        let msg = not_found(&[("/nonexistent".into(), "no such file".into())]);
        assert!(msg.starts_with("MPI was not found"), "{msg}");
        assert!(msg.contains("FERROCAFFE_MPI_LIBRARY"), "{msg}");
        assert!(msg.contains("pip install mpich"), "{msg}");
        assert!(msg.contains("/nonexistent (no such file)"), "{msg}");
        assert!(open("/nonexistent/libmpi.so").is_err());
    }
}
