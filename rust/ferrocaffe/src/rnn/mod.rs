//! Recurrent networks: the `RecurrentNetwork` operator, its gradient, and the threaded step
//! executor.
//!
//! `RecurrentNetwork` runs a *step net* once per timestep, each in its own child workspace
//! (the *step workspaces*, children of a shared workspace that is a child of the op's
//! workspace), and keeps those workspaces in its last output blob so that
//! `RecurrentNetworkGradient` can run the *backward step net* over them in reverse.
//!
//! * **Links** make a step blob a view of rows `t + offset .. t + offset + window` of a buffer
//!   in the op's workspace (the recurrent state buffers of T + 1 rows, the input sequence, and
//!   backward, their gradients): the `rnn_internal_apply_link` ops prepended to the step nets
//!   create these views, sharing storage with the buffer (no copies).
//! * **Aliases** publish views of the state buffers as the op's outputs (`offset` 1: rows
//!   1..; `-1`: the last row).
//! * The gradient op zeroes the parameter gradients, adds an accumulation per parameter to the
//!   backward step net (`<param_grad>_tmpstep` into `<param_grad>`, as Caffe2's `Sum`), an
//!   `rnn_internal_accumulate_gradient_input` per state whose `_all` output receives a
//!   gradient, and copies the initial-state gradients out at the end. Where an `FCGradient`
//!   adds into a parameter gradient from linked rows, the sum over timesteps is one product
//!   after the steps instead ([`deferred`]). Its step blobs live in
//!   child workspaces of the forward step workspaces, so the forward ones keep only what the
//!   forward pass made (what `RecurrentNetworkBlobFetcher` copies out).
//! * With `enable_rnn_executor` set, the steps run on [`executor::RnnExecutor`]: every (timestep,
//!   op) pair is a task, dependencies come from an analysis of the blobs and buffer rows each
//!   task reads and writes, and results equal the sequential run bit for bit.
//!
//! Everything registers from [`register`] (called by [`crate::runtime`] when it assembles the default registry).

pub mod analysis;
pub mod config;
pub mod deferred;
pub mod executor;
pub mod fetcher;
pub mod forward;
pub mod gradient;
pub mod link_ops;
pub mod steps;
pub mod text;

use crate::ops::registry::Registry;

/// Registers `RecurrentNetwork`, `RecurrentNetworkGradient`, `RecurrentNetworkBlobFetcher` and
/// the internal link ops.
pub fn register(r: &mut Registry) {
    r.cpu("RecurrentNetwork", forward::create);
    r.cpu("RecurrentNetworkGradient", gradient::create);
    r.cpu("RecurrentNetworkBlobFetcher", fetcher::create);
    r.cpu("rnn_internal_apply_link", link_ops::create_apply_link);
    r.cpu(
        "rnn_internal_accumulate_gradient_input",
        link_ops::create_accumulate_input_gradient,
    );
    r.cpu(
        analysis::ACCUMULATE_PARAM,
        link_ops::create_accumulate_param_gradient,
    );
}
