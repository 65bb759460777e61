//! # ferrocaffe
//!
//! The core of a Caffe2-compatible static-graph engine, usable as a plain Rust crate:
//! the wire format ([`proto`], [`wire`]), operator schemas ([`schema`]), graph algorithms
//! ([`graph`]), the backward-pass IR ([`autodiff`]) and the runtime.
//!
//! Runtime: [`device`] (device types, devices, device memory), [`tensor`] (tensors and their
//! storage rules), [`blas`] (single-precision GEMM), [`workspace`] (blobs, nets, locking, the
//! operator registry a workspace holds), [`ops`] (operator contract, registry, CPU kernels in
//! `ops::cpu`; see its guide to adding a kernel family), [`serialize`] (blob records as Caffe2
//! stores them), [`net`] (simple and dag executors, control ops), [`plan`] (execution steps),
//! [`rnn`] (recurrent networks), [`collective`] (collective ops over MPI loaded at run time) and
//! [`runtime`] (the default registry and
//! `Workspace::new`).
//!
//! The layers and the arrows between them are described in `docs/ARCHITECTURE.md` at the
//! repository root (and checked by the `layers` integration test).
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
pub mod collective;
pub mod cuda;
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
pub mod shape_infer;
pub mod tensor;
pub mod threads;
pub mod wire;
pub mod workspace;

pub use error::{Error, Result};
