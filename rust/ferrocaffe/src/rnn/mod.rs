//! Recurrent networks: `RecurrentNetwork` runs its step net once per timestep in per-step child
//! workspaces, wiring inputs and states through links (views at `t + offset`) and exposing
//! results through aliases (views of the state buffers); `RecurrentNetworkGradient` runs the
//! backward step net in reverse, accumulating parameter and recurrent-input gradients;
//! `RecurrentNetworkBlobFetcher` copies the step workspaces' blobs out.
//!
//! Timesteps run one after another (results are what Caffe2's threaded RNN executor gives: it
//! only reorders independent work). With `enable_rnn_executor` the timestep blob of step `t`
//! is named `<timestep>_rnnexec_t<t>`, as that executor names it, and backward blobs live in a
//! child of each step workspace, so the step workspaces hold forward blobs only.

pub mod network;

use crate::ops::registry::Registry;

/// Registers the recurrent ops.
pub fn register(r: &mut Registry) {
    network::register(r);
}
