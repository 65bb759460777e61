//! # ferrocaffe
//!
//! The core of a Caffe2-compatible static-graph engine, usable as a plain Rust crate:
//! the wire format ([`proto`]), graph algorithms ([`graph`]) and more.
//!
//! Runtime: [`tensor`] (tensors and their storage rules), [`workspace`] (blobs, nets, locking),
//! [`ops`] (operator contract, registry, CPU kernels in `ops::cpu`; see its guide to adding a
//! kernel family), [`net`] (simple and dag executors, control ops), [`plan`] (execution steps),
//! [`rnn`] (recurrent networks), [`serialize`] / [`wire`] (blob records as Caffe2 stores them),
//! and [`kernels::registry`] (the global operator registry).
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
pub mod blas;
pub mod device;
pub mod error;
pub mod graph;
pub mod net;
pub mod ops;
pub mod plan;
pub mod proto;
pub mod rnn;
pub mod runtime;
pub mod schema;
pub mod serialize;
pub mod tensor;
pub mod wire;
pub mod workspace;

pub use error::{Error, Result};
