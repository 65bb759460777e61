//! `SequenceMask`: replaces the entries of a tensor that a mask selects with `fill_val`
//! (default -inf; 0 with `grad`, which is how its gradient runs: the same op on the output
//! gradient).
//!
//! The input is seen as a matrix `[rows, cols]` split at `axis` (rows: the dims before it,
//! cols: the dims from it on), or, with `batch`, as `[B, rows, cols]` where `B` is the product
//! of the dims up to and including `batch` and the mask (computed on `rows x cols`) is the same
//! for every batch entry. The `mode` decides which `(i, j)` are masked:
//! - `sequence`: `j >= lengths[i]` (input 1: int32 lengths, one per row);
//! - `window`: `|j - centers[i]| > radius` (input 1: int32 centers);
//! - `upper` / `lower`: `j > i` / `j < i`; `upperdiag` / `lowerdiag`: `j >= i` / `j <= i`.
//!
//! With `repeat_from_axis` (sequence mode), the dims from that axis on are a block repeated
//! per column: column `j` of the mask covers `size_from(repeat_from_axis)` contiguous values.

use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, ensure, Result};

pub fn register(r: &mut Registry) {
    r.cpu("SequenceMask", create);
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Sequence,
    Window,
    Upper,
    Lower,
    UpperDiag,
    LowerDiag,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "sequence" => Mode::Sequence,
            "window" => Mode::Window,
            "upper" => Mode::Upper,
            "lower" => Mode::Lower,
            "upperdiag" => Mode::UpperDiag,
            "lowerdiag" => Mode::LowerDiag,
            _ => return None,
        })
    }

    fn needs_input(self) -> bool {
        matches!(self, Mode::Sequence | Mode::Window)
    }
}

struct Config {
    mode: Mode,
    axis: i64,
    batch: Option<i64>,
    repeat_from: Option<i64>,
    radius: i64,
    fill: f32,
}

fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let name = init.args.string("mode", "sequence")?;
    let Some(mode) = Mode::parse(&name) else {
        bail!(op = init, BadArgument: "Unsupported mode for SequenceMaskOp: {name}");
    };
    let grad = init.args.bool("grad", false)?;
    let cfg = Config {
        mode,
        axis: init.args.int("axis", 1)?,
        batch: init
            .args
            .has("batch")
            .then(|| init.args.int("batch", -1))
            .transpose()?,
        repeat_from: init
            .args
            .has("repeat_from_axis")
            .then(|| init.args.int("repeat_from_axis", -1))
            .transpose()?,
        radius: init.args.int("radius", 10)?,
        fill: if grad {
            0.0
        } else {
            init.args.float("fill_val", f32::NEG_INFINITY)?
        },
    };
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        run(&cfg, ctx)
    })))
}

fn canonical(axis: i64, nd: usize, what: &str) -> Result<usize> {
    let n = i64::try_from(nd).unwrap_or(i64::MAX);
    let a = if axis < 0 {
        axis.saturating_add(n)
    } else {
        axis
    };
    ensure!(
        (0..n).contains(&a),
        BadArgument: "{what} {axis} out of range for a tensor of {nd} dimensions"
    );
    Ok(a as usize)
}

fn product(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| crate::err!(ShapeMismatch: "tensor size overflows"))
}

fn run(cfg: &Config, ctx: &mut OpContext<'_>) -> Result<()> {
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    let dims = x.dims().to_vec();
    let nd = dims.len();
    let axis = canonical(cfg.axis, nd, "axis")?;
    let batch = cfg.batch.map(|b| canonical(b, nd, "batch")).transpose()?;
    if let Some(b) = batch {
        ensure!(b < axis, BadArgument: "batch ({b}) must come before axis ({axis})");
    }
    let (blocks, rows) = match batch {
        Some(b) => (product(&dims[..=b])?, product(&dims[b + 1..axis])?),
        None => (1, product(&dims[..axis])?),
    };
    let cols_all = product(&dims[axis..])?;
    let repeat = match cfg.repeat_from {
        Some(r) if cfg.mode == Mode::Sequence => {
            let r = canonical(r, nd, "repeat_from_axis")?;
            ensure!(r >= axis, BadArgument: "repeat_from_axis ({r}) must not precede axis ({axis})");
            product(&dims[r..])?
        }
        _ => 1,
    };
    let cols = cols_all.checked_div(repeat).unwrap_or(0);
    let keys: Vec<i32> = if cfg.mode.needs_input() {
        ensure!(
            ins.len() > 1,
            Schema: "SequenceMask in mode {:?} needs a second input (lengths or window centers)",
            cfg.mode
        );
        let k = ins.tensor(1)?;
        k.as_slice::<i32>()?.to_vec()
    } else {
        Vec::new()
    };
    if cfg.mode.needs_input() && rows > keys.len() {
        bail!(
            ShapeMismatch: "Out of bound: {} rows to mask, {} lengths or window centers",
            rows,
            keys.len()
        );
    }
    let xs = x.as_slice::<f32>()?.to_vec();
    let out = outs.tensor(0)?.ensure::<f32>(&dims);
    let (mode, radius) = (cfg.mode, cfg.radius);
    let masked = |i: usize, j: usize| -> bool {
        let (ii, jj) = (i as i64, j as i64);
        match mode {
            Mode::Sequence => jj >= i64::from(keys[i]),
            Mode::Window => {
                let c = i64::from(keys[i]);
                jj > c.saturating_add(radius) || jj < c.saturating_sub(radius)
            }
            Mode::Upper => jj > ii,
            Mode::Lower => jj < ii,
            Mode::UpperDiag => jj >= ii,
            Mode::LowerDiag => jj <= ii,
        }
    };
    let block = rows * cols * repeat;
    for b in 0..blocks {
        for i in 0..rows {
            for j in 0..cols {
                let start = b * block + (i * cols + j) * repeat;
                let src = &xs[start..start + repeat];
                let dst = &mut out[start..start + repeat];
                if masked(i, j) {
                    dst.fill(cfg.fill);
                } else {
                    dst.copy_from_slice(src);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn run(args: Vec<Argument>, x: Tensor, lengths: Option<Vec<i32>>) -> crate::Result<Vec<f32>> {
        let ws = Workspace::new();
        ws.feed("x", x);
        let mut inputs = vec!["x"];
        if let Some(l) = lengths {
            let n = l.len();
            ws.feed("l", Tensor::from_vec(&[n], l)?);
            inputs.push("l");
        }
        let mut op = OperatorDef::new("SequenceMask", inputs, ["y"]);
        op.arg = args;
        ws.run_operator_once(&op)?;
        Ok(ws.fetch("y")?.as_slice::<f32>()?.to_vec())
    }

    fn x23() -> Tensor {
        Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap_or_default()
    }

    #[test]
    fn sequence_masks_past_each_length() -> crate::Result<()> {
        let y = run(
            vec![Argument::float("fill_val", -7.0)],
            x23(),
            Some(vec![1, 2]),
        )?;
        assert_eq!(y, vec![1.0, -7.0, -7.0, 4.0, 5.0, -7.0]);
        let g = run(vec![Argument::int("grad", 1)], x23(), Some(vec![0, 3]))?;
        assert_eq!(g, vec![0.0, 0.0, 0.0, 4.0, 5.0, 6.0]);
        Ok(())
    }

    #[test]
    fn triangles_and_window() -> crate::Result<()> {
        let up = run(
            vec![
                Argument::string("mode", "upper"),
                Argument::float("fill_val", 0.0),
            ],
            x23(),
            None,
        )?;
        assert_eq!(up, vec![1.0, 0.0, 0.0, 4.0, 5.0, 0.0]);
        let ld = run(
            vec![
                Argument::string("mode", "lowerdiag"),
                Argument::float("fill_val", 0.0),
            ],
            x23(),
            None,
        )?;
        assert_eq!(ld, vec![0.0, 2.0, 3.0, 0.0, 0.0, 6.0]);
        let w = run(
            vec![
                Argument::string("mode", "window"),
                Argument::int("radius", 0),
                Argument::float("fill_val", 0.0),
            ],
            x23(),
            Some(vec![2, 0]),
        )?;
        assert_eq!(w, vec![0.0, 0.0, 3.0, 4.0, 0.0, 0.0]);
        Ok(())
    }

    #[test]
    fn errors_are_reported() {
        assert!(run(vec![Argument::string("mode", "diagonal")], x23(), None).is_err());
        assert!(run(vec![], x23(), Some(vec![1])).is_err());
        assert!(run(vec![], x23(), None).is_err());
        assert!(run(vec![Argument::int("axis", 5)], x23(), Some(vec![1, 1])).is_err());
    }
}
