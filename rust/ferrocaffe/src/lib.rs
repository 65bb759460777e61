//! # ferrocaffe
//!
//! The core of a Caffe2-compatible static-graph engine, usable as a plain Rust crate:
//! the wire format ([`proto`]), graph algorithms ([`graph`]) and more.
//!
//! ```
//! use ferrocaffe::proto::{NetDef, OperatorDef};
//!
//! let mut net = NetDef::default();
//! net.op.push(OperatorDef::new("Relu", ["x"], ["y"]));
//! let bytes = ferrocaffe::proto::encode(&net);
//! let back: NetDef = ferrocaffe::proto::decode(&bytes).unwrap();
//! assert_eq!(back, net);
//! ```

pub mod autodiff;
pub mod error;
pub mod graph;
pub mod kernels;
pub mod net;
pub mod ops;
pub mod plan;
pub mod proto;
pub mod rnn;
pub mod serialize;
pub mod tensor;
pub mod workspace;

pub use error::{Error, Result};
