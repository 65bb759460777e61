//! Operators: schemas (what each op type accepts) and, with the runtime, kernels.

pub mod args;
pub mod cpu;
pub mod operator;
pub mod registry;
pub mod schema;
mod schema_table;

pub use schema::{lookup, registered_types, OpSchema};
