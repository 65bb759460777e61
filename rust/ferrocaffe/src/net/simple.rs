//! The `simple` executor: every op in order, on the calling thread.

use std::sync::Arc;

use super::OpInstance;
use crate::error::Result;
use crate::workspace::Workspace;

/// Ops run one after another; the first error stops the run.
pub struct SimpleNet {
    pub(crate) ops: Vec<OpInstance>,
}

impl SimpleNet {
    /// Over instantiated ops.
    pub fn new(ops: Vec<OpInstance>) -> Self {
        SimpleNet { ops }
    }

    /// Runs every op once, in order.
    pub fn run(&mut self, ws: &Arc<Workspace>) -> Result<()> {
        for op in &mut self.ops {
            op.run(ws)?;
        }
        Ok(())
    }
}
