//! Recurrent cell units run once per timestep by recurrent step nets: LSTMUnit, GRUUnit and
//! their gradients. Shapes: hidden/cell `[1, N, D]`, gates `[1, N, 4D]` (LSTM: input, forget,
//! output, candidate) or `[1, N, 3D]` (GRU: reset, update, candidate). With
//! `sequence_lengths` (default 1) a `seq_lengths` input `[N]` marks rows whose sequence ended
//! (`timestep >= length`): they carry their state over, or zero it with `drop_states`.
//!
//! As in Caffe2, `sigmoid(x) = 1 / (1 + e^-x)` and `tanh(x) = 2 sigmoid(2x) - 1`; `e^x` is a
//! branch-free polynomial (within 2 ulp of the exact value over the clamped range) so the
//! loops over a row vectorize. Inputs are read in place, without copies.

use crate::blas::{for_each_part, part_len};
use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

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

/// `e^x` for f32, branch-free: `x = n ln2 + r` with `|r| <= ln2 / 2`, a degree-6 polynomial
/// for `e^r`, `2^n` built in the exponent bits. `x` is clamped to `[-87, 88]`. Explicit fused
/// multiply-adds (one rounding each, so every SIMD level gives the same bits; 1.5x faster rows
/// than separate multiplies and adds on AVX-512; a CPU without FMA computes them in software).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and removing 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let p = r.mul_add(1.0 / 720.0, 1.0 / 120.0);
    let p = r.mul_add(p, 1.0 / 24.0);
    let p = r.mul_add(p, 1.0 / 6.0);
    let p = r.mul_add(p, 0.5);
    let p = r.mul_add(p, 1.0);
    let p = r.mul_add(p, 1.0);
    // The low bits of `t` hold n (t = 1.5 * 2^23 + n): the exponent field of 2^n is n + 127,
    // computed in integer lanes (a float-to-int cast would not vectorize).
    let e = t.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127) << 23;
    p * f32::from_bits(e)
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[inline(always)]
fn tanh(x: f32) -> f32 {
    2.0 * sigmoid(2.0 * x) - 1.0
}

/// One LSTM row of `d` units: new cell and hidden state from the previous ones and the gates.
/// (Compiled per SIMD level and chosen at run time, as is the gradient row: the same
/// arithmetic, so every level gives the same bits.)
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn lstm_row(c_prev: &[f32], g: &[f32], forget_bias: f32, h: &mut [f32], c: &mut [f32]) {
    let d = h.len();
    let (gi, rest) = g[..4 * d].split_at(d);
    let (gf, rest) = rest.split_at(d);
    let (go, gc) = rest.split_at(d);
    // Zipped iterators over slices of exactly `d` values: no bounds checks in the loop, so
    // the whole row vectorizes (indexing kept the last vector's worth of values scalar).
    let ins = c_prev[..d].iter().zip(gi).zip(gf).zip(go).zip(gc);
    let outs = h.iter_mut().zip(&mut c[..d]);
    for (((((&cp, &xi), &xf), &xo), &xc), (h, c)) in ins.zip(outs) {
        let i = sigmoid(xi);
        let f = sigmoid(xf + forget_bias);
        let o = sigmoid(xo);
        let cand = tanh(xc);
        let cj = f * cp + i * cand;
        *c = cj;
        *h = o * tanh(cj);
    }
}

/// One LSTM row of the gradient.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
#[allow(clippy::too_many_arguments)]
fn lstm_grad_row(
    c_prev: &[f32],
    g: &[f32],
    c_t: &[f32],
    dh: &[f32],
    dc: &[f32],
    forget_bias: f32,
    dc_prev: &mut [f32],
    dx: &mut [f32],
) {
    let d = c_prev.len();
    let (gi, rest) = g[..4 * d].split_at(d);
    let (gf, rest) = rest.split_at(d);
    let (go, gc) = rest.split_at(d);
    let (dxi, rest) = dx[..4 * d].split_at_mut(d);
    let (dxf, rest) = rest.split_at_mut(d);
    let (dxo, dxc) = rest.split_at_mut(d);
    // Exact-length zipped iterators, as in `lstm_row`.
    let ins = c_prev.iter().zip(gi).zip(gf).zip(go).zip(gc);
    let ins = ins.zip(&c_t[..d]).zip(&dh[..d]).zip(&dc[..d]);
    let outs = dc_prev[..d].iter_mut().zip(dxi).zip(dxf).zip(dxo).zip(dxc);
    for ((((((((&cp, &xi), &xf), &xo), &xc), &ct), &dh), &dc), ((((dcp, dxi), dxf), dxo), dxc)) in
        ins.zip(outs)
    {
        let i = sigmoid(xi);
        let f = sigmoid(xf + forget_bias);
        let o = sigmoid(xo);
        let cand = tanh(xc);
        let tc = tanh(ct);
        let c_term = dc + dh * o * (1.0 - tc * tc);
        *dcp = c_term * f;
        *dxi = c_term * cand * i * (1.0 - i);
        *dxf = c_term * cp * f * (1.0 - f);
        *dxo = dh * tc * o * (1.0 - o);
        *dxc = c_term * i * (1.0 - cand * cand);
    }
}

impl Unit {
    /// Which rows are still inside their sequence at this timestep.
    fn valid(&self, ctx: &OpContext<'_>, seq_i: usize, t_i: usize, n: usize) -> Result<Vec<bool>> {
        let t = ctx.input(t_i)?.to_i64_vec()?;
        let t = *t
            .first()
            .ok_or_else(|| err!(ShapeMismatch: "timestep input is empty"))?;
        if !self.seq {
            return Ok(vec![true; n]);
        }
        let lens = ctx.input(seq_i)?.to_i64_vec()?;
        if lens.len() != n {
            bail!(ShapeMismatch: "seq_lengths has {} values, expected N = {n}", lens.len());
        }
        Ok(lens.iter().map(|&l| t < l).collect())
    }

    /// (dims of the hidden state, N, D), checking the gates hold N x `gates` D values.
    fn sizes(
        ctx: &OpContext<'_>,
        gates_i: usize,
        gates: usize,
    ) -> Result<(Vec<usize>, usize, usize)> {
        let hd = ctx.input(0)?.dims().to_vec();
        let d = *hd
            .last()
            .ok_or_else(|| err!(ShapeMismatch: "hidden state must not be 0-d"))?;
        // N is the product of the leading dims (not numel / D, which is undefined for D = 0);
        // it is exact whenever the state holds values, and only compared otherwise.
        let n = hd[..hd.len() - 1]
            .iter()
            .try_fold(1usize, |a, &v| a.checked_mul(v))
            .unwrap_or(usize::MAX);
        if ctx.input(gates_i)?.numel() != n.saturating_mul(gates).saturating_mul(d) {
            bail!(
                ShapeMismatch: "gates must hold N x {gates}D values (N = {n}, D = {d}), got shape \
                 {:?}",
                ctx.input(gates_i)?.dims()
            );
        }
        Ok((hd, n, d))
    }

    /// With no row or no hidden unit there is nothing to compute: every output gets its
    /// (empty) shape, as in Caffe2. True when that was the case.
    fn empty_run(ctx: &mut OpContext<'_>, n: usize, d: usize, shapes: &[&[usize]]) -> Result<bool> {
        if n != 0 && d != 0 {
            return Ok(false);
        }
        for (j, dims) in shapes.iter().enumerate().take(ctx.num_outputs()) {
            ctx.output(j)?.try_ensure::<f32>(dims)?;
        }
        Ok(true)
    }

    fn check_len(ctx: &OpContext<'_>, i: usize, len: usize, what: &str) -> Result<()> {
        if ctx.input(i)?.numel() != len {
            bail!(
                ShapeMismatch: "{what} must hold N x D = {len} values, got shape {:?}",
                ctx.input(i)?.dims()
            );
        }
        Ok(())
    }

    fn lstm(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (hd, n, d) = Self::sizes(ctx, 2, 4)?;
        Self::check_len(ctx, 1, n.saturating_mul(d), "the cell state")?;
        let off = self.seq as usize;
        let xd = ctx.input(2)?.dims().to_vec();
        let shapes: &[&[usize]] = if self.gradient {
            &[&hd, &hd, &xd]
        } else {
            &[&hd, &hd]
        };
        if Self::empty_run(ctx, n, d, shapes)? {
            return Ok(());
        }
        let valid = self.valid(ctx, 3, 3 + off, n)?;
        let (fb, drop) = (self.forget_bias, self.drop_states);
        if !self.gradient {
            let (ins, mut outs) = ctx.split();
            let h_prev = ins.tensor(0)?.as_slice::<f32>()?;
            let c_prev = ins.tensor(1)?.as_slice::<f32>()?;
            let x = ins.tensor(2)?.as_slice::<f32>()?;
            let mut hs = outs.tensors();
            let [h, c] = hs.as_mut_slice() else {
                bail!(Schema: "LSTMUnit needs two distinct outputs");
            };
            let h = h.ensure::<f32>(&hd);
            let c = c.ensure::<f32>(&hd);
            // Rows in parts shared with the GEMM helper thread (each row is independent).
            let per = part_len(n, n * 4 * d);
            let parts: Vec<_> = (h.chunks_mut(per * d).zip(c.chunks_mut(per * d)))
                .enumerate()
                .collect();
            for_each_part(parts, &|(p, (h, c))| {
                for j in 0..h.len() / d {
                    let r = p * per + j;
                    let (rows, mine) = (r * d..(r + 1) * d, j * d..(j + 1) * d);
                    if valid[r] {
                        lstm_row(
                            &c_prev[rows],
                            &x[r * 4 * d..(r + 1) * 4 * d],
                            fb,
                            &mut h[mine.clone()],
                            &mut c[mine],
                        );
                    } else if drop {
                        h[mine.clone()].fill(0.0);
                        c[mine].fill(0.0);
                    } else {
                        h[mine.clone()].copy_from_slice(&h_prev[rows.clone()]);
                        c[mine].copy_from_slice(&c_prev[rows]);
                    }
                }
            });
            return Ok(());
        }
        // Inputs after timestep: hidden_t, cell_t, hidden_t_grad, cell_t_grad.
        let b = 4 + off;
        for (i, what) in [
            (b + 1, "cell_t"),
            (b + 2, "hidden_t_grad"),
            (b + 3, "cell_t_grad"),
        ] {
            Self::check_len(ctx, i, n * d, what)?;
        }
        let (ins, mut outs) = ctx.split();
        let c_prev = ins.tensor(1)?.as_slice::<f32>()?;
        let x = ins.tensor(2)?.as_slice::<f32>()?;
        let c_t = ins.tensor(b + 1)?.as_slice::<f32>()?;
        let dh = ins.tensor(b + 2)?.as_slice::<f32>()?;
        let dc = ins.tensor(b + 3)?.as_slice::<f32>()?;
        let mut gs = outs.tensors();
        let [dh_prev, dc_prev, dx] = gs.as_mut_slice() else {
            bail!(Schema: "LSTMUnitGradient needs three distinct outputs");
        };
        let dh_prev = dh_prev.ensure::<f32>(&hd);
        let dc_prev = dc_prev.ensure::<f32>(&hd);
        let dx = dx.ensure::<f32>(&xd);
        let per = part_len(n, n * 4 * d);
        let parts: Vec<_> = (dh_prev.chunks_mut(per * d))
            .zip(dc_prev.chunks_mut(per * d))
            .zip(dx.chunks_mut(per * 4 * d))
            .enumerate()
            .collect();
        for_each_part(parts, &|(p, ((dh_prev, dc_prev), dx))| {
            for j in 0..dh_prev.len() / d {
                let r = p * per + j;
                let (rows, mine) = (r * d..(r + 1) * d, j * d..(j + 1) * d);
                let xr = j * 4 * d..(j + 1) * 4 * d;
                if valid[r] {
                    dh_prev[mine.clone()].fill(0.0);
                    lstm_grad_row(
                        &c_prev[rows.clone()],
                        &x[r * 4 * d..(r + 1) * 4 * d],
                        &c_t[rows.clone()],
                        &dh[rows.clone()],
                        &dc[rows],
                        fb,
                        &mut dc_prev[mine],
                        &mut dx[xr],
                    );
                } else {
                    dx[xr].fill(0.0);
                    if drop {
                        dh_prev[mine.clone()].fill(0.0);
                        dc_prev[mine].fill(0.0);
                    } else {
                        dh_prev[mine.clone()].copy_from_slice(&dh[rows.clone()]);
                        dc_prev[mine].copy_from_slice(&dc[rows]);
                    }
                }
            }
        });
        Ok(())
    }

    fn gru(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (hd, n, d) = Self::sizes(ctx, 1, 3)?;
        let off = self.seq as usize;
        let xd = ctx.input(1)?.dims().to_vec();
        let shapes: &[&[usize]] = if self.gradient { &[&hd, &xd] } else { &[&hd] };
        if Self::empty_run(ctx, n, d, shapes)? {
            return Ok(());
        }
        let valid = self.valid(ctx, 2, 2 + off, n)?;
        let drop = self.drop_states;
        if !self.gradient {
            let (ins, mut outs) = ctx.split();
            let h_prev = ins.tensor(0)?.as_slice::<f32>()?;
            let x = ins.tensor(1)?.as_slice::<f32>()?;
            let h = outs.tensor(0)?.ensure::<f32>(&hd);
            for (r, &ok) in valid.iter().enumerate() {
                let rows = r * d..(r + 1) * d;
                if !ok {
                    if drop {
                        h[rows].fill(0.0);
                    } else {
                        h[rows.clone()].copy_from_slice(&h_prev[rows]);
                    }
                    continue;
                }
                let g = &x[r * 3 * d + d..(r + 1) * 3 * d];
                let (gu, go) = g.split_at(d);
                let (hp, hr) = (&h_prev[rows.clone()], &mut h[rows]);
                for j in 0..d {
                    let u = sigmoid(gu[j]);
                    hr[j] = hp[j] * u + tanh(go[j]) * (1.0 - u);
                }
            }
            return Ok(());
        }
        // Inputs after timestep: hidden_t, hidden_t_grad.
        let dh_i = 3 + off + 1;
        Self::check_len(ctx, dh_i, n * d, "hidden_t_grad")?;
        let (ins, mut outs) = ctx.split();
        let h_prev = ins.tensor(0)?.as_slice::<f32>()?;
        let x = ins.tensor(1)?.as_slice::<f32>()?;
        let dh = ins.tensor(dh_i)?.as_slice::<f32>()?;
        let mut gs = outs.tensors();
        let [dh_prev, dx] = gs.as_mut_slice() else {
            bail!(Schema: "GRUUnitGradient needs two distinct outputs");
        };
        let dh_prev = dh_prev.ensure::<f32>(&hd);
        let dx = dx.ensure::<f32>(&xd);
        for (r, &ok) in valid.iter().enumerate() {
            let rows = r * d..(r + 1) * d;
            let xr = r * 3 * d..(r + 1) * 3 * d;
            if !ok {
                dx[xr].fill(0.0);
                if drop {
                    dh_prev[rows].fill(0.0);
                } else {
                    dh_prev[rows.clone()].copy_from_slice(&dh[rows]);
                }
                continue;
            }
            let g = &x[xr.clone()];
            let (_, gu, go) = (&g[..d], &g[d..2 * d], &g[2 * d..]);
            let dxr = &mut dx[xr];
            let (dxr_reset, rest) = dxr.split_at_mut(d);
            let (dxu, dxo) = rest.split_at_mut(d);
            dxr_reset.fill(0.0);
            let (hp, dhr, dhp) = (&h_prev[rows.clone()], &dh[rows.clone()], &mut dh_prev[rows]);
            for j in 0..d {
                let u = sigmoid(gu[j]);
                let o = tanh(go[j]);
                dhp[j] = dhr[j] * u;
                dxu[j] = dhr[j] * (hp[j] - o) * u * (1.0 - u);
                dxo[j] = dhr[j] * (1.0 - u) * (1.0 - o * o);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_within_two_ulp() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), (x as f64).exp());
            let rel = ((got as f64 - want) / want).abs();
            assert!(rel < 2.5e-7, "exp({x}) = {got}, want {want}");
            x += 0.0137;
        }
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
        assert!(exp(1000.0).is_finite());
        assert!((tanh(0.3) - 0.3f64.tanh() as f32).abs() < 1e-7);
        assert_eq!(sigmoid(-200.0), sigmoid(-100.0));
    }

    /// The vectorized rows (every lane count, with a tail) equal the formulas element by
    /// element, bit for bit.
    #[test]
    fn lstm_rows_equal_the_scalar_formulas() {
        let val = |k: usize, s: f32| ((k * 37 % 101) as f32 / 101.0 - 0.5) * s;
        for d in [1, 5, 16, 37, 64] {
            let c_prev: Vec<f32> = (0..d).map(|k| val(k, 3.0)).collect();
            let g: Vec<f32> = (0..4 * d).map(|k| val(k + 7, 9.0)).collect();
            let (mut h, mut c) = (vec![0.0; d], vec![0.0; d]);
            lstm_row(&c_prev, &g, 0.5, &mut h, &mut c);
            let dh: Vec<f32> = (0..d).map(|k| val(k + 3, 1.0)).collect();
            let dc: Vec<f32> = (0..d).map(|k| val(k + 5, 1.0)).collect();
            let (mut dcp, mut dx) = (vec![0.0; d], vec![0.0; 4 * d]);
            lstm_grad_row(&c_prev, &g, &c, &dh, &dc, 0.5, &mut dcp, &mut dx);
            for j in 0..d {
                let i = sigmoid(g[j]);
                let f = sigmoid(g[d + j] + 0.5);
                let o = sigmoid(g[2 * d + j]);
                let cand = tanh(g[3 * d + j]);
                let cj = f * c_prev[j] + i * cand;
                assert_eq!(c[j].to_bits(), cj.to_bits(), "d {d} c[{j}]");
                assert_eq!(h[j].to_bits(), (o * tanh(cj)).to_bits(), "d {d} h[{j}]");
                let tc = tanh(cj);
                let ct = dc[j] + dh[j] * o * (1.0 - tc * tc);
                let want = [
                    ct * f,
                    ct * cand * i * (1.0 - i),
                    ct * c_prev[j] * f * (1.0 - f),
                    dh[j] * tc * o * (1.0 - o),
                    ct * i * (1.0 - cand * cand),
                ];
                let got = [dcp[j], dx[j], dx[d + j], dx[2 * d + j], dx[3 * d + j]];
                for (w, g) in want.iter().zip(got) {
                    assert_eq!(w.to_bits(), g.to_bits(), "d {d} gradient at {j}");
                }
            }
        }
    }
}
