//! Operators: the operator contract, the registry of kernels and the CPU kernels. The schemas
//! (what each op type accepts) live one layer down, in [`crate::schema`].

pub mod args;
pub mod cpu;
pub mod host;
pub mod operator;
pub mod registry;
