//! Parameter gradients of a backward step net summed over all timesteps in one product, after
//! the steps, instead of one small product per step.
//!
//! An LSTM's backward step runs `FCGradient(h_prev, W, dG)`, whose `dW += dG^T h_prev` is a
//! `1024 x 256` accumulation of depth `N = 32`: each step reads and writes the whole gradient
//! for little arithmetic. Both operands are views of rows of buffers in the op's workspace
//! (`h_prev` of the forward state buffer, `dG` of the input-sequence gradient), so after the
//! steps the rows of all timesteps lie one after another: `dW += dG_all^T h_all` (depth
//! `T * N`) and `db += column sums of dG_all` give the same sums, in another order.
//!
//! It is done only where the rows hold, at the end of the run, exactly what that step's
//! `FCGradient` would have read: for `dW` or `db` that `FCGradient` adds into in place (the
//! parameter gradient has no other reader or writer: `accumulate_in_place`), with `X` and
//! `dY` each the step blob of a link of one row whose buffer no op writes by name, which no
//! other link writes through, and whose step blob no op writes after the `FCGradient`. Each
//! timestep then writes its own rows only, before its `FCGradient`, and nothing changes them.

use super::analysis::APPLY_LINK;
use super::config::Link;
use super::steps::tensor_of;
use crate::blas::GemmContext;
use crate::error::Result;
use crate::ops::cpu::fc;
use crate::proto::{Argument, NetDef, OperatorDef};
use crate::tensor::Tensor;
use crate::workspace::Workspace;
use crate::{bail, err};

/// One `FCGradient` whose parameter gradients are summed after the steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Deferred {
    /// The buffer of `X` and the row of timestep 0.
    x: (String, usize),
    /// The buffer of `dY` and the row of timestep 0.
    dy: (String, usize),
    /// `dW` and `db`, where deferred.
    dw: Option<String>,
    db: Option<String>,
    /// The `FCGradient`'s `axis` (`X` flattened to `M x K` there).
    axis: i64,
}

/// Finds the `FCGradient`s of `net` (the backward step net with its link ops) whose parameter
/// gradients can be deferred, and tells each to skip them ([`fc::DEFERRED_ARG`]).
pub fn plan(net: &mut NetDef, links: &[Link]) -> Vec<Deferred> {
    let mut plans = Vec::new();
    for i in 0..net.op.len() {
        let Some(d) = deferrable(net, links, i) else {
            continue;
        };
        let skipped: Vec<i64> = [d.dw.is_some(), d.db.is_some()]
            .iter()
            .enumerate()
            .filter(|(_, &on)| on)
            .map(|(j, _)| j as i64)
            .collect();
        net.op[i].arg.push(Argument {
            name: Some(fc::DEFERRED_ARG.to_string()),
            ints: skipped,
            ..Default::default()
        });
        plans.push(d);
    }
    plans
}

fn deferrable(net: &NetDef, links: &[Link], i: usize) -> Option<Deferred> {
    let op = &net.op[i];
    if op.r#type() != "FCGradient" || op.input.len() != 3 || op.output.len() < 2 {
        return None;
    }
    if op.arg.iter().any(|a| a.name() == "axis_w" && a.i() != 1) {
        return None;
    }
    let accumulated = op
        .arg
        .iter()
        .find(|a| a.name() == fc::ACCUMULATE_ARG)
        .map(|a| a.ints.clone())
        .unwrap_or_default();
    let grad = |j: usize| {
        accumulated
            .contains(&(j as i64))
            .then(|| op.output[j].clone())
    };
    let (dw, db) = (grad(0), grad(1));
    if dw.is_none() && db.is_none() {
        return None;
    }
    let (x, dy) = (&op.input[0], &op.input[2]);
    if x == dy {
        return None;
    }
    let axis = op
        .arg
        .iter()
        .find(|a| a.name() == "axis")
        .map_or(1, |a| a.i());
    if axis < 0 {
        return None;
    }
    Some(Deferred {
        x: settled_rows(net, links, i, x)?,
        dy: settled_rows(net, links, i, dy)?,
        dw,
        db,
        axis,
    })
}

/// The buffer and row offset behind step blob `blob` read by op `reader`, if at the end of
/// the run its rows hold what each timestep's op `reader` read (see the module docs).
fn settled_rows(
    net: &NetDef,
    links: &[Link],
    reader: usize,
    blob: &str,
) -> Option<(String, usize)> {
    let mut mine = links.iter().filter(|l| l.internal == blob);
    let link = mine.next()?;
    if mine.next().is_some() || link.window != 1 {
        return None;
    }
    let offset = usize::try_from(link.offset).ok()?;
    let writes = |op: &OperatorDef, name: &str| {
        op.r#type() != APPLY_LINK && op.output.iter().any(|o| o == name)
    };
    // Other views of the same buffer must only be read.
    let other_views: Vec<&str> = links
        .iter()
        .filter(|l| l.external == link.external && l.internal != blob)
        .map(|l| l.internal.as_str())
        .collect();
    for (j, op) in net.op.iter().enumerate() {
        if writes(op, &link.external)
            || (j > reader && writes(op, blob))
            || other_views.iter().any(|v| writes(op, v))
        {
            return None;
        }
    }
    Some((link.external.clone(), offset))
}

/// `rows` rows of `t` (rows along its first dimension) from row `first`, as one slice.
fn rows<'a>(t: &'a Tensor, name: &str, first: usize, count: usize) -> Result<&'a [f32]> {
    let total = t.dims().first().copied().unwrap_or(0);
    if first + count > total {
        bail!(
            ShapeMismatch: "{name} has {total} rows, the deferred parameter gradient needs rows \
             {first}..{}",
            first + count
        );
    }
    let row = t.size_from_dim(1);
    Ok(&t.as_slice::<f32>()?[first * row..(first + count) * row])
}

impl Deferred {
    /// Adds the sums over timesteps `0..steps` into the parameter gradients (in `ws`, the
    /// gradient op's workspace, after the steps ran).
    pub fn finish(&self, ws: &Workspace, steps: usize, gemm: &GemmContext) -> Result<()> {
        if steps == 0 {
            return Ok(());
        }
        let x_all = tensor_of(ws, &self.x.0)?;
        let dy_all = tensor_of(ws, &self.dy.0)?;
        let xs = rows(&x_all, &self.x.0, self.x.1, steps)?;
        let dys = rows(&dy_all, &self.dy.0, self.dy.1, steps)?;
        // One timestep's X is a row of the buffer, shaped [1, ...]: its K is the size from the
        // FC's axis on (an axis of 0 makes each row one M x K block with M = 1).
        let step_dims = &x_all.dims()[1..];
        let axis = usize::try_from(self.axis)
            .ok()
            .filter(|&a| a <= step_dims.len() + 1);
        let axis = axis.ok_or_else(|| {
            err!(
                BadArgument: "FCGradient axis {} out of range for X rows of shape {step_dims:?}",
                self.axis
            )
        })?;
        let k: usize = step_dims[axis.saturating_sub(1).min(step_dims.len())..]
            .iter()
            .product();
        let m = xs.len().checked_div(k).unwrap_or(0);
        if m == 0 || dys.len() % m != 0 {
            bail!(
                ShapeMismatch: "deferred FCGradient: {} rows of X ({} values) and of dY ({} \
                 values) do not make M x K and M x N matrices",
                steps,
                xs.len(),
                dys.len()
            );
        }
        let n = dys.len() / m;
        if let Some(name) = &self.dw {
            add_into(ws, name, n * k, |dw| {
                gemm.sgemm(true, false, n, k, m, 1.0, dys, xs, 1.0, dw)
            })?;
        }
        if let Some(name) = &self.db {
            add_into(ws, name, n, |db| fc::add_column_sums(dys, m, db))?;
        }
        Ok(())
    }
}

/// Runs `add` on the float gradient `name`, which must hold `len` values.
fn add_into(ws: &Workspace, name: &str, len: usize, add: impl FnOnce(&mut [f32])) -> Result<()> {
    let h = ws.blob(name)?;
    let mut b = h.write();
    let g = b.tensor_mut().as_mut_slice::<f32>()?;
    if g.len() != len {
        bail!(
            ShapeMismatch: "parameter gradient {name} has {} values, the deferred sum has {len}",
            g.len()
        );
    }
    add(g);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rnn::config::add_apply_link_ops;

    fn link(internal: &str, external: &str, offset: i64, window: i64) -> Link {
        Link::new(internal, external, offset, window)
    }

    fn fc_grad(x: &str, dy: &str, accumulate: &[i64]) -> OperatorDef {
        let mut op = OperatorDef::new("FCGradient", [x, "w", dy], ["dw", "db", "dx"]);
        op.arg.push(Argument {
            name: Some("axis".into()),
            i: Some(2),
            ..Default::default()
        });
        op.arg.push(Argument {
            name: Some(fc::ACCUMULATE_ARG.into()),
            ints: accumulate.to_vec(),
            ..Default::default()
        });
        op
    }

    /// An LSTM's backward step (as `rnn_cell.LSTM` builds it) with its links.
    fn lstm_step(extra: Vec<OperatorDef>, more_links: &[Link]) -> (NetDef, Vec<Link>) {
        let unit = OperatorDef::new(
            "LSTMUnitGradient",
            ["h_prev", "c_prev", "gates", "h", "c", "h_grad", "c_grad"],
            ["h_prev_grad", "c_prev_grad", "gates_grad"],
        );
        let sum = OperatorDef::new("Sum", ["h_prev_grad", "dx"], ["h_prev_grad"]);
        let mut ops = vec![unit, fc_grad("h_prev", "gates_grad", &[0, 1]), sum];
        ops.extend(extra);
        let mut links = vec![
            link("h_prev", "states", 0, 1),
            link("h", "states", 1, 1),
            link("h_grad", "states_grad", 1, 1),
            link("h_prev_grad", "states_grad", 0, 1),
            link("gates_grad", "input_grad", 0, 1),
        ];
        links.extend_from_slice(more_links);
        let mut net = NetDef {
            op: ops,
            ..Default::default()
        };
        add_apply_link_ops(&links, "timestep", None, &mut net);
        (net, links)
    }

    fn deferred_arg(net: &NetDef) -> Option<Vec<i64>> {
        let fc = net.op.iter().find(|o| o.r#type() == "FCGradient")?;
        let arg = fc.arg.iter().find(|a| a.name() == fc::DEFERRED_ARG)?;
        Some(arg.ints.clone())
    }

    #[test]
    fn an_lstm_step_defers_both_parameter_gradients() {
        let (mut net, links) = lstm_step(vec![], &[]);
        let plans = plan(&mut net, &links);
        assert_eq!(
            plans,
            [Deferred {
                x: ("states".into(), 0),
                dy: ("input_grad".into(), 0),
                dw: Some("dw".into()),
                db: Some("db".into()),
                axis: 2,
            }]
        );
        assert_eq!(deferred_arg(&net), Some(vec![0, 1]));
    }

    #[test]
    fn rows_that_could_change_after_the_fc_gradient_are_not_deferred() {
        let refused: Vec<(Vec<OperatorDef>, Vec<Link>)> = vec![
            // dY written again after the FCGradient.
            (
                vec![OperatorDef::new("Scale", ["x"], ["gates_grad"])],
                vec![],
            ),
            // The buffer written by name.
            (
                vec![OperatorDef::new("Scale", ["x"], ["input_grad"])],
                vec![],
            ),
            (vec![OperatorDef::new("Scale", ["x"], ["states"])], vec![]),
            // Another view of the buffer written through.
            (
                vec![OperatorDef::new("Scale", ["x"], ["other"])],
                vec![link("other", "input_grad", 1, 1)],
            ),
        ];
        for (extra, more) in refused {
            let (mut net, links) = lstm_step(extra.clone(), &more);
            assert!(plan(&mut net, &links).is_empty(), "{extra:?} {more:?}");
            assert_eq!(deferred_arg(&net), None);
        }
        // A window of two rows (neighbouring steps share rows), or dY not linked at all.
        for links in [
            vec![
                link("h_prev", "states", 0, 1),
                link("gates_grad", "input_grad", 0, 2),
            ],
            vec![link("h_prev", "states", 0, 1)],
        ] {
            let mut net = NetDef {
                op: vec![fc_grad("h_prev", "gates_grad", &[0, 1])],
                ..Default::default()
            };
            add_apply_link_ops(&links, "timestep", None, &mut net);
            assert!(plan(&mut net, &links).is_empty(), "{links:?}");
        }
        // Gradients that are not added into in place stay in the steps.
        let links = vec![
            link("h_prev", "states", 0, 1),
            link("gates_grad", "input_grad", 0, 1),
        ];
        let mut net = NetDef {
            op: vec![fc_grad("h_prev", "gates_grad", &[])],
            ..Default::default()
        };
        assert!(plan(&mut net, &links).is_empty());
        let mut net = NetDef {
            op: vec![fc_grad("h_prev", "gates_grad", &[1])],
            ..Default::default()
        };
        assert_eq!(plan(&mut net, &links)[0].dw, None);
        assert_eq!(deferred_arg(&net), Some(vec![1]));
    }

    #[test]
    fn the_deferred_sums_equal_the_per_step_sums() {
        // Small, and large enough for the column sums to be shared out in parts.
        sums_match(5, 3, 4, 6);
        sums_match(8, 32, 4, 1024);
    }

    fn sums_match(t: usize, n: usize, h: usize, g: usize) {
        let val = |i: usize, s: f32| ((i as f32 + s) * 0.7).sin();
        // States have T + 1 rows; X of step t is row t.
        let states: Vec<f32> = (0..(t + 1) * n * h).map(|i| val(i, 1.0)).collect();
        let dys: Vec<f32> = (0..t * n * g).map(|i| val(i, 2.0)).collect();
        let ws = Workspace::new();
        let put = |name: &str, dims: &[usize], v: Vec<f32>| {
            *ws.create_blob(name).write().tensor_mut() = Tensor::from_vec(dims, v).unwrap();
        };
        put("states", &[t + 1, n, h], states.clone());
        put("input_grad", &[t, n, g], dys.clone());
        put("dw", &[g, h], vec![1.0; g * h]);
        put("db", &[g], vec![0.5; g]);
        let d = Deferred {
            x: ("states".into(), 0),
            dy: ("input_grad".into(), 0),
            dw: Some("dw".into()),
            db: Some("db".into()),
            axis: 2,
        };
        d.finish(&ws, t, &GemmContext::current()).unwrap();
        let (mut dw, mut db) = (vec![1.0f64; g * h], vec![0.5f64; g]);
        for step in 0..t {
            for r in 0..n {
                for o in 0..g {
                    let dy = dys[(step * n + r) * g + o] as f64;
                    db[o] += dy;
                    for c in 0..h {
                        dw[o * h + c] += dy * states[(step * n + r) * h + c] as f64;
                    }
                }
            }
        }
        let got = |name: &str| {
            tensor_of(&ws, name)
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .to_vec()
        };
        for (a, b) in got("dw").iter().zip(&dw).chain(got("db").iter().zip(&db)) {
            assert!((*a as f64 - b).abs() < 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
        // Rows past the buffer are an error, not a silent partial sum.
        assert!(d.finish(&ws, t + 1, &GemmContext::current()).is_err());
    }
}
