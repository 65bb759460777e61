//! `RecurrentNetworkBlobFetcher(step_workspaces) -> names`, arg `prefix` (default `rnn`):
//! copies every tensor of every step workspace `i` into the op's workspace as
//! `<prefix>_<blob><i>` and outputs the new names (a string tensor).

use std::sync::Arc;

use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::tensor::Tensor;
use crate::workspace::Blob;
use crate::{bail, err};

struct Fetcher {
    prefix: String,
}

impl Operator for Fetcher {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let b = ctx.input_blob(0)?;
        let stack = super::steps::scratch_of(b).ok_or_else(|| {
            err!(
                op = ctx,
                DtypeMismatch: "input {} should hold the step workspaces of a RecurrentNetwork \
                 op, found {}",
                ctx.input_name(0),
                b.type_name()
            )
        })?;
        let workspaces = stack.lock().workspaces.clone();
        let mut names = Vec::new();
        for (i, step) in workspaces.iter().enumerate() {
            for name in step.local_blob_names() {
                let Some(h) = step.get_blob(&name) else {
                    continue;
                };
                let copy = match &*h.read() {
                    Blob::Tensor(t) => t.deep_copy(),
                    _ => continue,
                };
                let new_name = format!("{}_{name}{i}", self.prefix);
                let dst = ctx.ws.create_blob(&new_name);
                if Arc::ptr_eq(&dst, ctx.input_handle(0)) || Arc::ptr_eq(&dst, ctx.output_handle(0))
                {
                    bail!(
                        op = ctx,
                        BadArgument: "fetched blob name {new_name} collides with the op's own blobs"
                    );
                }
                *dst.write() = Blob::Tensor(copy);
                names.push(new_name.into_bytes());
            }
        }
        *ctx.output(0)? = Tensor::from_strings(&[names.len()], names)?;
        Ok(())
    }
}

/// Factory of `RecurrentNetworkBlobFetcher`.
pub fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(Fetcher {
        prefix: init.args.string("prefix", "rnn")?,
    }))
}
