//! The one error type of the crate. Every fallible public function returns [`Result`].

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
    /// A value given by the caller is not acceptable (bad argument, bad index, bad shape...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A blob, op, net or key that was asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A graph edit that would change what the net computes (e.g. renaming a blob version that
    /// other ops also read).
    #[error("{0}")]
    IllegalGraphTransform(String),
    /// An inconsistency found while generating gradients, e.g. a gradient operator that needs a
    /// blob version that was overwritten (Caffe2 raised `RuntimeError`).
    #[error("{0}")]
    Runtime(String),
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
