//! Copying and bookkeeping ops: Copy, EnsureCPUOutput, CopyFromCPUInput, StopGradient, Alias,
//! Print, Free, ZeroGradient.

use std::io::Write;

use crate::err;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::{DataType, Tensor};
use crate::workspace::Blob;

/// Registers the copy family.
pub fn register(r: &mut Registry) {
    r.cpu_many(
        &[
            "Copy",
            "EnsureCPUOutput",
            "CopyFromCPUInput",
            "StopGradient",
            "EnsureDense",
        ],
        create_copy,
    );
    r.cpu("Alias", create_alias);
    r.cpu("Print", create_print);
    r.cpu("Free", create_free);
    r.cpu("ZeroGradient", |_| {
        Ok(Box::new(FnOp(|_: &mut OpContext<'_>| Ok(()))))
    });
}

/// Output 0 becomes a copy of input 0 (its own data; in place does nothing).
fn copy_kernel(ctx: &mut OpContext<'_>) -> Result<()> {
    if ctx.is_inplace(0, 0) {
        return Ok(());
    }
    let (ins, mut outs) = ctx.split();
    let src = ins.tensor(0)?;
    outs.tensor(0)?.copy_from(src);
    Ok(())
}

fn create_copy(_: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(copy_kernel)))
}

fn create_alias(_: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
        if ctx.is_inplace(0, 0) {
            return Ok(());
        }
        let (ins, mut outs) = ctx.split();
        let view = ins.tensor(0)?.alias();
        *outs.blob(0)? = Blob::Tensor(view);
        Ok(())
    })))
}

struct PrintOp {
    to_file: bool,
    limit: usize,
    every_n: usize,
    count: usize,
}

fn format_values(t: &Tensor, limit: usize) -> String {
    let n = t.numel().min(limit);
    if t.dtype() == DataType::String {
        let s = t.as_strings().unwrap_or(&[]);
        return s
            .iter()
            .take(n)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect::<Vec<_>>()
            .join(",");
    }
    (0..n)
        .map(|i| t.get_f64(i).map(|v| v.to_string()).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(",")
}

impl Operator for PrintOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        self.count += 1;
        if self.every_n > 1 && !(self.count - 1).is_multiple_of(self.every_n) {
            return Ok(());
        }
        let name = ctx.input_name(0).to_string();
        let line = match ctx.input_blob(0)? {
            Blob::Tensor(t) => format!(
                "{name} ({t:?}): {}",
                format_values(
                    t,
                    if self.limit == 0 {
                        usize::MAX
                    } else {
                        self.limit
                    }
                )
            ),
            other => format!("{name}: blob holds {}", other.type_name()),
        };
        if self.to_file {
            let path = std::path::Path::new(&ctx.ws.root_folder()).join(format!("{name}.log"));
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| err!(op = ctx, Runtime: "cannot open {}: {e}", path.display()))?;
            writeln!(f, "{line}").map_err(|e| err!(op = ctx, Runtime: e))?;
        } else {
            eprintln!("{line}");
        }
        Ok(())
    }
}

fn create_print(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(PrintOp {
        to_file: init.args.bool("to_file", false)?,
        limit: init.args.usize("limit", 0)?,
        every_n: init.args.usize("every_n", 1)?,
        count: 0,
    }))
}

fn create_free(_: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
        for j in 0..ctx.num_outputs() {
            *ctx.output_blob(j)? = Blob::Empty;
        }
        Ok(())
    })))
}
