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
}

/// Shorthand for `std::result::Result<T, ferrocaffe::Error>`.
pub type Result<T> = std::result::Result<T, Error>;
