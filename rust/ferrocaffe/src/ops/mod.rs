//! Operators: schemas (what each op type accepts) and, with the runtime, kernels.

pub mod schema;
mod schema_table;

pub use schema::{lookup, registered_types, OpSchema};
