//! The one error type of the crate. Every fallible public function returns [`Result`].
//!
//! An [`Error`] has a kind ([`Error::kind`]): what went wrong, in the categories Caffe2
//! distinguishes (a schema violation, a shape or dtype mismatch, a missing blob, a bad argument
//! value...). Most kinds carry only their message; the message is the whole of what the error
//! displays, so that a kind can be chosen without changing a word users see.
//!
//! Errors are built with the macros [`err!`](crate::err), [`bail!`](crate::bail) and
//! [`ensure!`](crate::ensure), which name the kind first and then format the message:
//!
//! ```
//! use ferrocaffe::error::ErrorKind;
//! use ferrocaffe::{bail, ensure, err, Error, Result};
//!
//! fn rows(dims: &[usize], want: usize) -> Result<usize> {
//!     ensure!(!dims.is_empty(), ShapeMismatch: "the input must have at least one dimension");
//!     if dims[0] > want {
//!         bail!(BadArgument: "{} rows given, at most {want} allowed", dims[0]);
//!     }
//!     Ok(dims[0])
//! }
//!
//! let e = rows(&[], 3).unwrap_err();
//! assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
//! assert_eq!(e.to_string(), "the input must have at least one dimension");
//! let Err(Error::BadArgument(m)) = rows(&[5], 3) else { panic!() };
//! assert_eq!(m, "5 rows given, at most 3 allowed");
//! let e: Error = err!(MissingBlob: "Can't find blob: {}", "x");
//! assert_eq!(e.kind(), ErrorKind::MissingBlob);
//! ```
//!
//! Caffe2 reported most of these (`CAFFE_ENFORCE`, `CAFFE_THROW`) as one C++ exception,
//! `EnforceNotMet`, which Python saw as `RuntimeError`; [`ErrorKind::is_enforce_not_met`] says
//! which kinds those are.

/// Everything that can go wrong in ferrocaffe, with enough context to name the op, the blob and
/// what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bytes that are not a valid serialization of the expected protobuf message.
    #[error("malformed {message} protobuf: {reason}")]
    Decode {
        /// The message type that was being decoded, e.g. `caffe2.NetDef`.
        message: &'static str,
        /// What the decoder reported.
        reason: String,
    },
    /// A value given by the caller of the API is not acceptable (bad index, bad shape of a
    /// fed array...); Python sees a `ValueError`. An operator argument with a bad value is a
    /// [`Error::BadArgument`] instead (Caffe2 enforced those).
    #[error("{0}")]
    InvalidArgument(String),
    /// A blob, op, net or key that was asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A graph edit that would change what the net computes (e.g. renaming a blob version that
    /// other ops also read).
    #[error("{0}")]
    IllegalGraphTransform(String),
    /// An enforced condition that failed, of no more precise kind (Caffe2's `EnforceNotMet`,
    /// which Python saw as `RuntimeError`), e.g. a gradient operator that needs a blob version
    /// that was overwritten.
    #[error("{0}")]
    Runtime(String),
    /// An operator definition that does not fit what the op accepts: its schema rejects it
    /// (input or output counts, in-place rules), so the op cannot be created, or the kernel
    /// finds its inputs or outputs do not pair up (an odd number of `(X, weight)` inputs,
    /// outputs that must be distinct blobs).
    #[error("{0}")]
    Schema(String),
    /// Tensors whose shapes do not fit together, or a tensor of the wrong rank or size.
    #[error("{0}")]
    ShapeMismatch(String),
    /// A tensor (or blob) whose element type is not the one the op needs.
    #[error("{0}")]
    DtypeMismatch(String),
    /// No kernel for the requested device, or a device this build does not support.
    #[error("{0}")]
    Device(String),
    /// A blob that an op or a net needs is not in the workspace (or in the db it loads from).
    #[error("{0}")]
    MissingBlob(String),
    /// An operator argument (or an input read as one) whose value the op cannot use: a
    /// negative size, an unknown mode, an index out of range.
    #[error("{0}")]
    BadArgument(String),
    /// An allocation whose size the user chose (a shape, a length) could not be made; Python
    /// sees a `MemoryError`.
    #[error("{0}")]
    OutOfMemory(String),
    /// A feature, mode or type combination that is not implemented.
    #[error("{0}")]
    NotImplemented(String),
    /// A malformed operator that Caffe2 rejected with a failed `assert` (`AssertionError`), e.g. a
    /// `Do` op whose blob bindings are inconsistent.
    #[error("{0}")]
    Assertion(String),
    /// A value of the wrong kind (Caffe2 raised `TypeError`).
    #[error("{0}")]
    Type(String),
    /// The gradient maker of an operator failed; Caffe2's
    /// `Exception when creating gradient for [<type>]:<reason>` (a bare `Exception`).
    #[error("Exception when creating gradient for [{op_type}]:{reason}.\nOp: \n{op}")]
    GradientMaker {
        /// The forward operator's type.
        op_type: String,
        /// What the maker (or the registry) reported.
        reason: String,
        /// The forward operator in protobuf text format.
        op: String,
    },
    /// An error raised by code the engine called back (e.g. a gradient function written in
    /// Python); `source` is that code's own error.
    #[error("{context}: {source}")]
    External {
        /// What the engine was doing, naming the operator involved.
        context: String,
        /// The callback's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Shorthand for `std::result::Result<T, ferrocaffe::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// What kind of error an [`Error`] is: one value per variant, without the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// [`Error::Decode`].
    Decode,
    /// [`Error::InvalidArgument`].
    InvalidArgument,
    /// [`Error::NotFound`].
    NotFound,
    /// [`Error::IllegalGraphTransform`].
    IllegalGraphTransform,
    /// [`Error::Runtime`].
    Runtime,
    /// [`Error::Schema`].
    Schema,
    /// [`Error::ShapeMismatch`].
    ShapeMismatch,
    /// [`Error::DtypeMismatch`].
    DtypeMismatch,
    /// [`Error::Device`].
    Device,
    /// [`Error::MissingBlob`].
    MissingBlob,
    /// [`Error::BadArgument`].
    BadArgument,
    /// [`Error::OutOfMemory`].
    OutOfMemory,
    /// [`Error::NotImplemented`].
    NotImplemented,
    /// [`Error::Assertion`].
    Assertion,
    /// [`Error::Type`].
    Type,
    /// [`Error::GradientMaker`].
    GradientMaker,
    /// [`Error::External`].
    External,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::Decode,
        ErrorKind::InvalidArgument,
        ErrorKind::NotFound,
        ErrorKind::IllegalGraphTransform,
        ErrorKind::Runtime,
        ErrorKind::Schema,
        ErrorKind::ShapeMismatch,
        ErrorKind::DtypeMismatch,
        ErrorKind::Device,
        ErrorKind::MissingBlob,
        ErrorKind::BadArgument,
        ErrorKind::OutOfMemory,
        ErrorKind::NotImplemented,
        ErrorKind::Assertion,
        ErrorKind::Type,
        ErrorKind::GradientMaker,
        ErrorKind::External,
    ];

    /// Whether Caffe2 reported errors of this kind as its C++ `EnforceNotMet` (a failed
    /// `CAFFE_ENFORCE` or a `CAFFE_THROW`), which Python saw as `RuntimeError`.
    pub fn is_enforce_not_met(self) -> bool {
        matches!(
            self,
            ErrorKind::Runtime
                | ErrorKind::Schema
                | ErrorKind::ShapeMismatch
                | ErrorKind::DtypeMismatch
                | ErrorKind::Device
                | ErrorKind::MissingBlob
                | ErrorKind::BadArgument
                | ErrorKind::NotImplemented
        )
    }

    /// An error of this kind whose message is `msg`, for the kinds that are only a message;
    /// `None` for [`Decode`](ErrorKind::Decode), [`GradientMaker`](ErrorKind::GradientMaker)
    /// and [`External`](ErrorKind::External), which carry more.
    pub fn with_message(self, msg: impl Into<String>) -> Option<Error> {
        let msg = msg.into();
        Some(match self {
            ErrorKind::InvalidArgument => Error::InvalidArgument(msg),
            ErrorKind::NotFound => Error::NotFound(msg),
            ErrorKind::IllegalGraphTransform => Error::IllegalGraphTransform(msg),
            ErrorKind::Runtime => Error::Runtime(msg),
            ErrorKind::Schema => Error::Schema(msg),
            ErrorKind::ShapeMismatch => Error::ShapeMismatch(msg),
            ErrorKind::DtypeMismatch => Error::DtypeMismatch(msg),
            ErrorKind::Device => Error::Device(msg),
            ErrorKind::MissingBlob => Error::MissingBlob(msg),
            ErrorKind::BadArgument => Error::BadArgument(msg),
            ErrorKind::OutOfMemory => Error::OutOfMemory(msg),
            ErrorKind::NotImplemented => Error::NotImplemented(msg),
            ErrorKind::Assertion => Error::Assertion(msg),
            ErrorKind::Type => Error::Type(msg),
            ErrorKind::Decode | ErrorKind::GradientMaker | ErrorKind::External => return None,
        })
    }
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Decode { .. } => ErrorKind::Decode,
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::IllegalGraphTransform(_) => ErrorKind::IllegalGraphTransform,
            Error::Runtime(_) => ErrorKind::Runtime,
            Error::Schema(_) => ErrorKind::Schema,
            Error::ShapeMismatch(_) => ErrorKind::ShapeMismatch,
            Error::DtypeMismatch(_) => ErrorKind::DtypeMismatch,
            Error::Device(_) => ErrorKind::Device,
            Error::MissingBlob(_) => ErrorKind::MissingBlob,
            Error::BadArgument(_) => ErrorKind::BadArgument,
            Error::OutOfMemory(_) => ErrorKind::OutOfMemory,
            Error::NotImplemented(_) => ErrorKind::NotImplemented,
            Error::Assertion(_) => ErrorKind::Assertion,
            Error::Type(_) => ErrorKind::Type,
            Error::GradientMaker { .. } => ErrorKind::GradientMaker,
            Error::External { .. } => ErrorKind::External,
        }
    }

    /// The message of an error that is only a message; `None` for the kinds that carry more.
    pub fn message(&self) -> Option<&str> {
        match self {
            Error::InvalidArgument(m)
            | Error::NotFound(m)
            | Error::IllegalGraphTransform(m)
            | Error::Runtime(m)
            | Error::Schema(m)
            | Error::ShapeMismatch(m)
            | Error::DtypeMismatch(m)
            | Error::Device(m)
            | Error::MissingBlob(m)
            | Error::BadArgument(m)
            | Error::OutOfMemory(m)
            | Error::NotImplemented(m)
            | Error::Assertion(m)
            | Error::Type(m) => Some(m),
            Error::Decode { .. } | Error::GradientMaker { .. } | Error::External { .. } => None,
        }
    }

    /// The same message as an error of kind `kind`: for errors built by a helper that only
    /// knows [`Error::Runtime`] (an operator's `err`, which names the op). An error that is more
    /// than a message, or a `kind` that needs more than one, is returned unchanged.
    pub fn with_kind(self, kind: ErrorKind) -> Error {
        match self.message() {
            Some(m) => kind.with_message(m).unwrap_or(self),
            None => self,
        }
    }

    /// This error with its message rewritten by `f` (given the displayed text), e.g. to say
    /// where it happened. An error of a kind Caffe2 enforced ([`ErrorKind::is_enforce_not_met`])
    /// or an [`Error::OutOfMemory`] keeps its kind; an [`Error::External`] keeps its source
    /// (`f` rewrites its context); any other becomes an [`Error::Runtime`], as Caffe2's C++
    /// reported every failure inside a net it ran.
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> Error {
        // A callback's error keeps its source (the binding raises the original exception).
        if let Error::External { context, source } = self {
            return Error::External {
                context: f(context),
                source,
            };
        }
        let kind = self.kind();
        let msg = f(self.to_string());
        let keep = kind.is_enforce_not_met() || kind == ErrorKind::OutOfMemory;
        let kind = if keep { kind } else { ErrorKind::Runtime };
        kind.with_message(msg.clone())
            .unwrap_or(Error::Runtime(msg))
    }
}

/// The entry point named by `FERROCAFFE_TEST_PANIC` when the process started (read once), or
/// None: the hook by which tests check that a panic in the engine reaches Python as an
/// exception and not as pyo3's `PanicException`.
fn test_panic_target() -> Option<&'static str> {
    static TARGET: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    TARGET
        .get_or_init(|| {
            std::env::var("FERROCAFFE_TEST_PANIC")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// Whether `FERROCAFFE_TEST_PANIC` names some entry point (so that a caller can skip building
/// the name of a [`panic_hook_for_tests`] point when it does not).
pub fn test_panics_enabled() -> bool {
    test_panic_target().is_some()
}

/// Panics when the process was started with `FERROCAFFE_TEST_PANIC=<point>`; does nothing
/// otherwise (one load of a once-initialised value). The native module's entry points call it
/// inside their panic guard, so that tests can force the panic an engine bug would cause and
/// check what Python sees.
pub fn panic_hook_for_tests(point: &str) {
    if test_panic_target() == Some(point) {
        panic!("FERROCAFFE_TEST_PANIC: forced panic in {point}");
    }
}

/// A `Vec` of `n` copies of `value`, or an [`Error::OutOfMemory`] naming `what` when the
/// allocation fails (for buffers whose size comes from user input: a shape, a length).
pub fn try_vec<T: Clone>(n: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Error::OutOfMemory(format!(
            "out of memory allocating {what} of {n} elements of {} bytes",
            std::mem::size_of::<T>()
        ))
    })?;
    v.resize(n, value);
    Ok(v)
}

/// The number of elements of a tensor of shape `dims` whose elements take `elem_size` bytes, or
/// an [`Error::OutOfMemory`] naming `what` when no allocation could hold it (the count or the
/// byte size overflows, or the bytes exceed `isize::MAX`): a guard for shapes the user chose.
pub fn checked_numel(dims: &[usize], elem_size: usize, what: &str) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|n| {
            n.checked_mul(elem_size)
                .is_some_and(|b| isize::try_from(b).is_ok())
        })
        .ok_or_else(|| {
            Error::OutOfMemory(format!("{what} of shape {dims:?} is too large to allocate"))
        })
}

/// An [`Error`] of the named kind, its message formatted like `format!`.
///
/// `err!(Kind: "format", args...)` builds `Error::Kind(format!("format", args...))`; `Kind` is a
/// variant of [`Error`] that is only a message (`ShapeMismatch`, `DtypeMismatch`, `BadArgument`,
/// `MissingBlob`, `Schema`, `Device`, `OutOfMemory`, `NotImplemented`, `Runtime`, `Type`,
/// `Assertion`, `NotFound`, `InvalidArgument`, `IllegalGraphTransform`). The message may also be
/// one expression that is not a literal: `err!(Kind: text)`.
///
/// `err!(op = o, Kind: "format", args...)` asks `o.err(message)` for the error (an operator's
/// `OpInit` or `OpContext`, which adds what names the op) and gives it the kind `Kind`.
///
/// ```
/// use ferrocaffe::err;
/// use ferrocaffe::error::ErrorKind;
///
/// let (got, want) = (3, 4);
/// let e = err!(ShapeMismatch: "got {got} values, expected {}", want);
/// assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
/// assert_eq!(e.to_string(), "got 3 values, expected 4");
/// ```
#[macro_export]
macro_rules! err {
    (op = $op:expr, $kind:ident: $fmt:literal $($arg:tt)*) => {
        $op.err(::std::format!($fmt $($arg)*))
            .with_kind($crate::error::ErrorKind::$kind)
    };
    (op = $op:expr, $kind:ident: $msg:expr) => {
        $op.err($msg).with_kind($crate::error::ErrorKind::$kind)
    };
    ($kind:ident: $fmt:literal $($arg:tt)*) => {
        $crate::error::Error::$kind(::std::format!($fmt $($arg)*))
    };
    ($kind:ident: $msg:expr) => {
        $crate::error::Error::$kind(::std::string::ToString::to_string(&$msg))
    };
}

/// Returns early with an [`Error`] of the named kind: `bail!(Kind: "format", args...)` is
/// `return Err(err!(Kind: "format", args...).into())`. Takes every form of [`err!`](crate::err).
///
/// ```
/// use ferrocaffe::{bail, Error, Result};
///
/// fn mode(name: &str) -> Result<u8> {
///     match name {
///         "sum" => Ok(0),
///         "mean" => Ok(1),
///         other => bail!(BadArgument: "Unknown mode: {other}"),
///     }
/// }
/// assert!(matches!(mode("max"), Err(Error::BadArgument(m)) if m == "Unknown mode: max"));
/// ```
#[macro_export]
macro_rules! bail {
    ($($t:tt)+) => {
        return ::std::result::Result::Err(::std::convert::From::from($crate::err!($($t)+)))
    };
}

/// Returns early with an [`Error`] of the named kind unless a condition holds:
/// `ensure!(cond, Kind: "format", args...)` (any form of [`err!`](crate::err) after the
/// condition).
///
/// ```
/// use ferrocaffe::error::ErrorKind;
/// use ferrocaffe::{ensure, Result};
///
/// fn same_size(a: &[f32], b: &[f32]) -> Result<()> {
///     ensure!(a.len() == b.len(), ShapeMismatch: "sizes {} and {} differ", a.len(), b.len());
///     Ok(())
/// }
/// assert!(same_size(&[1.0], &[2.0]).is_ok());
/// assert_eq!(same_size(&[1.0], &[]).unwrap_err().kind(), ErrorKind::ShapeMismatch);
/// ```
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($t:tt)+) => {
        if !$cond {
            $crate::bail!($($t)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Op;
    impl Op {
        fn err(&self, msg: impl std::fmt::Display) -> Error {
            Error::Runtime(format!("{msg} (Error from operator: type T)"))
        }
    }

    fn checked(n: i64) -> Result<usize> {
        ensure!(n >= 0, BadArgument: "must not be negative, got {n}");
        ensure!(n < 10, ShapeMismatch: "{} is too large", n);
        if n == 7 {
            bail!(NotImplemented: "seven");
        }
        usize::try_from(n).map_err(|e| err!(Runtime: e))
    }

    #[test]
    fn macros_build_the_named_kind_with_the_formatted_message() {
        assert_eq!(checked(3).unwrap(), 3);
        let e = checked(-2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadArgument);
        assert_eq!(e.to_string(), "must not be negative, got -2");
        let e = checked(12).unwrap_err();
        assert!(matches!(&e, Error::ShapeMismatch(m) if m == "12 is too large"));
        assert_eq!(checked(7).unwrap_err().kind(), ErrorKind::NotImplemented);
        let text = String::from("a message built elsewhere");
        assert!(matches!(err!(Type: text), Error::Type(m) if m == "a message built elsewhere"));
        let e = err!(DtypeMismatch: "trailing comma {}", 1,);
        assert_eq!(e.to_string(), "trailing comma 1");
        let e = err!(Device: "named {dev} and {0:>3}", 7, dev = "CUDA");
        assert_eq!(e.to_string(), "named CUDA and   7");
    }

    #[test]
    fn op_form_keeps_the_ops_wording_and_sets_the_kind() {
        let op = Op;
        let e = err!(op = op, Schema: "{} inputs", 3);
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert_eq!(e.to_string(), "3 inputs (Error from operator: type T)");
        fn f(op: &Op) -> Result<()> {
            ensure!(false, op = op, Device: "no kernel");
            Ok(())
        }
        assert_eq!(f(&Op).unwrap_err().kind(), ErrorKind::Device);
    }

    #[test]
    fn kinds_and_messages_round_trip() {
        for kind in ErrorKind::ALL {
            match kind.with_message("m") {
                Some(e) => {
                    assert_eq!(e.kind(), kind);
                    assert_eq!(e.message(), Some("m"));
                    assert_eq!(e.to_string(), "m");
                }
                None => assert!(matches!(
                    kind,
                    ErrorKind::Decode | ErrorKind::GradientMaker | ErrorKind::External
                )),
            }
        }
        let d = Error::Decode {
            message: "caffe2.NetDef",
            reason: "eof".into(),
        };
        assert_eq!(d.kind(), ErrorKind::Decode);
        assert_eq!(d.message(), None);
        assert_eq!(
            d.with_kind(ErrorKind::ShapeMismatch).kind(),
            ErrorKind::Decode
        );
        let e = Error::Runtime("x".into()).with_kind(ErrorKind::MissingBlob);
        assert!(matches!(e, Error::MissingBlob(m) if m == "x"));
        let e = Error::Runtime("x".into()).with_kind(ErrorKind::External);
        assert_eq!(e.kind(), ErrorKind::Runtime);
    }

    #[test]
    fn enforce_kinds_are_the_runtime_error_ones() {
        let enforced: Vec<_> = ErrorKind::ALL
            .into_iter()
            .filter(|k| k.is_enforce_not_met())
            .collect();
        assert_eq!(
            enforced,
            [
                ErrorKind::Runtime,
                ErrorKind::Schema,
                ErrorKind::ShapeMismatch,
                ErrorKind::DtypeMismatch,
                ErrorKind::Device,
                ErrorKind::MissingBlob,
                ErrorKind::BadArgument,
                ErrorKind::NotImplemented,
            ]
        );
    }

    #[test]
    fn map_message_keeps_enforced_kinds_and_makes_the_rest_runtime() {
        let e = Error::External {
            context: "calling f".into(),
            source: "boom".into(),
        }
        .map_message(|m| format!("{m} [op]"));
        assert!(
            matches!(&e, Error::External { context, source } if context == "calling f [op]"
                && source.to_string() == "boom"),
            "{e}"
        );
        let e = Error::ShapeMismatch("bad".into()).map_message(|m| format!("{m} [step 3]"));
        assert!(matches!(e, Error::ShapeMismatch(m) if m == "bad [step 3]"));
        let e = Error::OutOfMemory("big".into()).map_message(|m| format!("{m}!"));
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        let e = Error::NotFound("k".into()).map_message(|m| format!("{m} [t]"));
        assert!(matches!(e, Error::Runtime(m) if m == "k [t]"));
        let d = Error::Decode {
            message: "caffe2.NetDef",
            reason: "eof".into(),
        };
        let e = d.map_message(|m| format!("{m} [t]"));
        assert!(matches!(e, Error::Runtime(m) if m == "malformed caffe2.NetDef protobuf: eof [t]"));
    }

    #[test]
    fn checked_numel_refuses_shapes_no_allocation_can_hold() {
        assert_eq!(checked_numel(&[2, 3, 4], 8, "x").unwrap(), 24);
        assert_eq!(checked_numel(&[], 4, "x").unwrap(), 1);
        assert_eq!(checked_numel(&[0, usize::MAX], 4, "x").unwrap(), 0);
        let e = checked_numel(&[1 << 40, 1 << 40], 4, "the output").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        assert_eq!(
            e.to_string(),
            "the output of shape [1099511627776, 1099511627776] is too large to allocate"
        );
        let big = usize::MAX / 4;
        assert!(checked_numel(&[big], 8, "x").is_err());
    }

    #[test]
    fn try_vec_allocates_or_reports_out_of_memory() {
        assert_eq!(try_vec(3, 1.5f32, "a buffer").unwrap(), vec![1.5; 3]);
        let e = try_vec(usize::MAX / 2, 0u64, "a buffer").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        assert!(e
            .to_string()
            .starts_with("out of memory allocating a buffer"));
    }
}
