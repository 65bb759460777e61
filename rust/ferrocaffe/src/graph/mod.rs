//! Graph algorithms over `NetDef`s: SSA versioning with Caffe2's exact semantics, and graph
//! surgery for deployment and export code.
//!
//! * [`Ssa`]: `core.get_ssa`, `get_undefined_blobs`, `get_output_producers`,
//!   `get_op_ids_in_path`.
//! * [`Graph`]: producer/consumer maps over versioned blobs, consistent renames across a
//!   predict net and its init net, dead-end removal, sub-graph boundaries, op-type chains.
//! * [`memonger`]: Caffe2's memory optimizer (blob recycling over op lifetimes, linear or over
//!   a DAG).
//! * [`NetIo`] and [`wire`]: the blob-level shape of a net, read from a message or straight from
//!   its serialized bytes (the fast path used by the Python binding).
//!
//! Every algorithm runs in linear time over interned blob ids ([`Names`], [`BlobId`]) and dense
//! value ids ([`ValueId`]: one per `(blob, version)` pair).
//!
//! ```
//! use ferrocaffe::graph::{Graph, Ssa};
//! use ferrocaffe::proto::{NetDef, OperatorDef};
//!
//! let mut net = NetDef::default();
//! net.external_input.push("x".into());
//! net.external_output.push("y".into());
//! net.op.push(OperatorDef::new("Relu", ["x"], ["y"]));
//! net.op.push(OperatorDef::new("Relu", ["y"], ["y"]));
//!
//! let ssa = Ssa::of(&net);
//! assert_eq!(ssa.versioned_outputs(1).collect::<Vec<_>>(), [("y", 2)]);
//!
//! let graph = Graph::new(&net);
//! assert_eq!(graph.versioned_external_outputs(), [("y", 2)]);
//! ```

pub mod intern;
pub mod memonger;
pub mod netio;
pub mod ssa;
mod ssa_wire;
pub mod surgery;
pub mod transform;
pub mod wire;

pub use intern::{BlobId, FxHashMap, FxHasher, Names};
pub use netio::NetIo;
pub use ssa::{Slot, Ssa, SsaBuilder, ValueId, Version};
pub use surgery::{EditedNet, Graph, OpSlot, SubGraphIo};
