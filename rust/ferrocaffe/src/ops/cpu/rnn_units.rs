//! Recurrent cell units run once per timestep by recurrent step nets: LSTMUnit, GRUUnit and
//! their gradients. Shapes: hidden/cell `[1, N, D]`, gates `[1, N, 4D]` (LSTM: input, forget,
//! output, candidate) or `[1, N, 3D]` (GRU: reset, update, candidate). With
//! `sequence_lengths` (default 1) a `seq_lengths` input `[N]` marks rows whose sequence ended
//! (`timestep >= length`): they carry their state over, or zero it with `drop_states`.

use crate::error::{Error, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("LSTMUnit", |i| create(i, Cell::Lstm, false));
    r.cpu("LSTMUnitGradient", |i| create(i, Cell::Lstm, true));
    r.cpu("GRUUnit", |i| create(i, Cell::Gru, false));
    r.cpu("GRUUnitGradient", |i| create(i, Cell::Gru, true));
}

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Lstm,
    Gru,
}

struct Unit {
    cell: Cell,
    gradient: bool,
    forget_bias: f32,
    drop_states: bool,
    seq: bool,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn rt(msg: impl std::fmt::Display) -> Error {
    Error::Runtime(msg.to_string())
}

impl Unit {
    /// Which rows are still inside their sequence at this timestep.
    fn valid(&self, ctx: &OpContext<'_>, seq_i: usize, t_i: usize, n: usize) -> Result<Vec<bool>> {
        let t = ctx.input(t_i)?.to_i64_vec()?;
        let t = *t.first().ok_or_else(|| rt("timestep input is empty"))?;
        if !self.seq {
            return Ok(vec![true; n]);
        }
        let lens = ctx.input(seq_i)?.to_i64_vec()?;
        if lens.len() != n {
            return Err(rt(format!(
                "seq_lengths has {} values, expected N = {n}",
                lens.len()
            )));
        }
        Ok(lens.iter().map(|&l| t < l).collect())
    }

    fn read(ctx: &OpContext<'_>, i: usize) -> Result<(Vec<usize>, Vec<f32>)> {
        let t = ctx.input(i)?;
        Ok((t.dims().to_vec(), t.as_slice::<f32>()?.to_vec()))
    }

    fn lstm(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (hd, h_prev) = Self::read(ctx, 0)?;
        let (_, c_prev) = Self::read(ctx, 1)?;
        let (_, x) = Self::read(ctx, 2)?;
        let d = *hd
            .last()
            .ok_or_else(|| rt("hidden state must not be 0-d"))?;
        let n = h_prev.len().checked_div(d).unwrap_or(0);
        if c_prev.len() != n * d || x.len() != n * 4 * d {
            return Err(rt(format!(
                "LSTMUnit: cell must hold N x D and gates N x 4D values (N = {n}, D = {d})"
            )));
        }
        let off = self.seq as usize;
        let valid = self.valid(ctx, 3, 3 + off, n)?;
        if !self.gradient {
            let mut h = vec![0f32; n * d];
            let mut c = vec![0f32; n * d];
            for r in 0..n {
                for j in 0..d {
                    let k = r * d + j;
                    if !valid[r] {
                        if !self.drop_states {
                            h[k] = h_prev[k];
                            c[k] = c_prev[k];
                        }
                        continue;
                    }
                    let g = &x[r * 4 * d..(r + 1) * 4 * d];
                    let (ig, fg, og, cg) = (
                        sigmoid(g[j]),
                        sigmoid(g[d + j] + self.forget_bias),
                        sigmoid(g[2 * d + j]),
                        g[3 * d + j].tanh(),
                    );
                    c[k] = fg * c_prev[k] + ig * cg;
                    h[k] = og * c[k].tanh();
                }
            }
            ctx.output(0)?.ensure::<f32>(&hd).copy_from_slice(&h);
            ctx.output(1)?.ensure::<f32>(&hd).copy_from_slice(&c);
            return Ok(());
        }
        // Inputs after timestep: hidden_t, cell_t, hidden_t_grad, cell_t_grad.
        let b = 4 + off;
        let (_, c_t) = Self::read(ctx, b + 1)?;
        let (_, dh) = Self::read(ctx, b + 2)?;
        let (_, dc) = Self::read(ctx, b + 3)?;
        if c_t.len() != n * d || dh.len() != n * d || dc.len() != n * d {
            return Err(rt(
                "LSTMUnitGradient: state gradients must hold N x D values",
            ));
        }
        let mut dh_prev = vec![0f32; n * d];
        let mut dc_prev = vec![0f32; n * d];
        let mut dx = vec![0f32; n * 4 * d];
        for r in 0..n {
            for j in 0..d {
                let k = r * d + j;
                if !valid[r] {
                    if !self.drop_states {
                        dh_prev[k] = dh[k];
                        dc_prev[k] = dc[k];
                    }
                    continue;
                }
                let g = &x[r * 4 * d..(r + 1) * 4 * d];
                let (ig, fg, og, cg) = (
                    sigmoid(g[j]),
                    sigmoid(g[d + j] + self.forget_bias),
                    sigmoid(g[2 * d + j]),
                    g[3 * d + j].tanh(),
                );
                let tc = c_t[k].tanh();
                let c_term = dc[k] + dh[k] * og * (1.0 - tc * tc);
                dc_prev[k] = c_term * fg;
                let o = r * 4 * d;
                dx[o + j] = c_term * cg * ig * (1.0 - ig);
                dx[o + d + j] = c_term * c_prev[k] * fg * (1.0 - fg);
                dx[o + 2 * d + j] = dh[k] * tc * og * (1.0 - og);
                dx[o + 3 * d + j] = c_term * ig * (1.0 - cg * cg);
            }
        }
        let xd = ctx.input(2)?.dims().to_vec();
        ctx.output(0)?.ensure::<f32>(&hd).copy_from_slice(&dh_prev);
        ctx.output(1)?.ensure::<f32>(&hd).copy_from_slice(&dc_prev);
        ctx.output(2)?.ensure::<f32>(&xd).copy_from_slice(&dx);
        Ok(())
    }

    fn gru(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (hd, h_prev) = Self::read(ctx, 0)?;
        let (xd, x) = Self::read(ctx, 1)?;
        let d = *hd
            .last()
            .ok_or_else(|| rt("hidden state must not be 0-d"))?;
        let n = h_prev.len().checked_div(d).unwrap_or(0);
        if x.len() != n * 3 * d {
            return Err(rt(format!(
                "GRUUnit: gates must hold N x 3D values (N = {n}, D = {d})"
            )));
        }
        let off = self.seq as usize;
        let valid = self.valid(ctx, 2, 2 + off, n)?;
        if !self.gradient {
            let mut h = vec![0f32; n * d];
            for r in 0..n {
                for j in 0..d {
                    let k = r * d + j;
                    if !valid[r] {
                        if !self.drop_states {
                            h[k] = h_prev[k];
                        }
                        continue;
                    }
                    let g = &x[r * 3 * d..(r + 1) * 3 * d];
                    let u = sigmoid(g[d + j]);
                    h[k] = h_prev[k] * u + g[2 * d + j].tanh() * (1.0 - u);
                }
            }
            ctx.output(0)?.ensure::<f32>(&hd).copy_from_slice(&h);
            return Ok(());
        }
        // Inputs after timestep: hidden_t, hidden_t_grad.
        let (_, dh) = Self::read(ctx, 3 + off + 1)?;
        if dh.len() != n * d {
            return Err(rt("GRUUnitGradient: hidden_t_grad must hold N x D values"));
        }
        let mut dh_prev = vec![0f32; n * d];
        let mut dx = vec![0f32; n * 3 * d];
        for r in 0..n {
            for j in 0..d {
                let k = r * d + j;
                if !valid[r] {
                    if !self.drop_states {
                        dh_prev[k] = dh[k];
                    }
                    continue;
                }
                let g = &x[r * 3 * d..(r + 1) * 3 * d];
                let u = sigmoid(g[d + j]);
                let o = g[2 * d + j].tanh();
                dh_prev[k] = dh[k] * u;
                dx[r * 3 * d + d + j] = dh[k] * (h_prev[k] - o) * u * (1.0 - u);
                dx[r * 3 * d + 2 * d + j] = dh[k] * (1.0 - u) * (1.0 - o * o);
            }
        }
        ctx.output(0)?.ensure::<f32>(&hd).copy_from_slice(&dh_prev);
        ctx.output(1)?.ensure::<f32>(&xd).copy_from_slice(&dx);
        Ok(())
    }
}

impl Operator for Unit {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        match self.cell {
            Cell::Lstm => self.lstm(ctx),
            Cell::Gru => self.gru(ctx),
        }
    }
}

fn create(init: &OpInit<'_>, cell: Cell, gradient: bool) -> Result<Box<dyn Operator>> {
    Ok(Box::new(Unit {
        cell,
        gradient,
        forget_bias: init.args.float("forget_bias", 0.0)?,
        drop_states: init.args.bool("drop_states", false)?,
        seq: init.args.bool("sequence_lengths", true)?,
    }))
}
