//! Group normalization: GroupNorm and GroupNormGradient.
//!
//! `GroupNorm(X, gamma, beta) -> Y[, mean, rsig]`: X is `[N, C, *]` (`order` NCHW, the
//! default) or `[N, *, C]` (NHWC); the C channels form `group` groups (default 32, must divide
//! C) of `K = C / group` channels. For each sample n and group g, over the `K * HxW` values of
//! the group: `mean`, the population variance `var`, and `rsig = 1 / sqrt(var + epsilon)`
//! (epsilon 1e-5); `Y = gamma[c] * (X - mean) * rsig + beta[c]`. mean and rsig (the inverse
//! std, named "std" in Caffe2's schema) have shape `[N, group]`. With `is_test` = 0 (Caffe2's
//! default is 1) the op must have all three outputs.
//!
//! `GroupNormGradient(dY, X, gamma, beta, mean, rsig) -> (dX, dgamma, dbeta)`, the `group`
//! and `order` arguments of the forward op: with `ds = sum(gamma * dY * X)` and
//! `db = sum(gamma * dY)` over each (n, g) group of `D = K * HxW` values,
//! `dX = gamma * dY * rsig + ((db * mean - ds) * (X - mean) * rsig^3 - db * rsig) / D`,
//! `dgamma[c] = sum(dY * (X - mean) * rsig)`, `dbeta[c] = sum(dY)`.

use super::conv_args::Order;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("GroupNorm", create_forward);
    r.cpu("GroupNormGradient", create_backward);
}

fn read_order(init: &OpInit<'_>) -> Result<Order> {
    match init.args.string("order", "NCHW")?.as_str() {
        "NCHW" => Ok(Order::Nchw),
        "NHWC" => Ok(Order::Nhwc),
        other => Err(err!(
            op = init,
            BadArgument: "order should be either \"NCHW\" or \"NHWC\", got \"{other}\""
        )),
    }
}

fn read_group(init: &OpInit<'_>) -> Result<usize> {
    let g = init.args.int("group", 32)?;
    usize::try_from(g)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| err!(op = init, BadArgument: "group must be positive, got {g}"))
}

/// The layout of one GroupNorm input.
#[derive(Clone, Copy, Debug)]
struct Layout {
    n: usize,
    c: usize,
    hxw: usize,
    g: usize,
    order: Order,
}

impl Layout {
    fn new(dims: &[usize], g: usize, order: Order) -> Result<Layout> {
        if dims.len() < 2 {
            bail!(ShapeMismatch: "GroupNorm needs an input of at least 2 dimensions, got {dims:?}");
        }
        let n = dims[0];
        let c = match order {
            Order::Nchw => dims[1],
            Order::Nhwc => dims[dims.len() - 1],
        };
        if c % g != 0 {
            bail!(ShapeMismatch: "the number of channels {c} must be a multiple of group {g}");
        }
        let hxw = dims
            .iter()
            .product::<usize>()
            .checked_div(n * c)
            .unwrap_or(0);
        Ok(Layout {
            n,
            c,
            hxw,
            g,
            order,
        })
    }

    /// `(group row n * G + g, channel)` of flat element `i`.
    fn at(&self, i: usize) -> (usize, usize) {
        let k = self.c / self.g;
        let (n, c) = match self.order {
            Order::Nchw => (i / (self.c * self.hxw), (i / self.hxw) % self.c),
            Order::Nhwc => (i / (self.c * self.hxw), i % self.c),
        };
        (n * self.g + c / k, c)
    }

    /// Values per (n, g) group.
    fn group_size(&self) -> usize {
        self.c / self.g * self.hxw
    }
}

fn check_channels(ctx: &OpContext<'_>, l: &Layout, inputs: &[usize]) -> Result<()> {
    for &i in inputs {
        let t = ctx.input(i)?;
        if t.numel() != l.c {
            bail!(
                op = ctx,
                ShapeMismatch: "input {i} ('{}') must hold {} values (one per channel), got shape \
                 {:?}",
                ctx.input_name(i),
                l.c,
                t.dims()
            );
        }
    }
    Ok(())
}

fn create_forward(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let group = read_group(init)?;
    let order = read_order(init)?;
    let eps = init.args.float("epsilon", 1e-5)?;
    let is_test = init.args.bool("is_test", true)?;
    if !is_test && init.num_outputs() != 3 {
        bail!(
            op = init,
            Schema: "GroupNorm with is_test=0 needs 3 outputs (Y, mean, rsig), got {}",
            init.num_outputs()
        );
    }
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        forward(ctx, group, order, eps)
    })))
}

fn forward(ctx: &mut OpContext<'_>, group: usize, order: Order, eps: f32) -> Result<()> {
    let dims = ctx.input(0)?.dims().to_vec();
    let l = Layout::new(&dims, group, order)?;
    check_channels(ctx, &l, &[1, 2])?;
    let rows = l.n * l.g;
    let d = l.group_size() as f64;
    let (y, mean, rsig) = {
        let x = ctx.input(0)?.as_slice::<f32>()?;
        let gamma = ctx.input(1)?.as_slice::<f32>()?;
        let beta = ctx.input(2)?.as_slice::<f32>()?;
        let mut sum = vec![0f64; rows];
        let mut sq = vec![0f64; rows];
        for (i, &v) in x.iter().enumerate() {
            let (r, _) = l.at(i);
            sum[r] += v as f64;
            sq[r] += v as f64 * v as f64;
        }
        let mut mean = vec![0f32; rows];
        let mut rsig = vec![0f32; rows];
        for r in 0..rows {
            let mu = if d > 0.0 { sum[r] / d } else { 0.0 };
            let var = if d > 0.0 {
                (sq[r] / d - mu * mu).max(0.0)
            } else {
                0.0
            };
            mean[r] = mu as f32;
            rsig[r] = (1.0 / (var + eps as f64).sqrt()) as f32;
        }
        let y: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let (r, c) = l.at(i);
                gamma[c] * (v - mean[r]) * rsig[r] + beta[c]
            })
            .collect();
        (y, mean, rsig)
    };
    ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&y);
    if ctx.num_outputs() == 3 {
        ctx.output(1)?
            .ensure::<f32>(&[l.n, l.g])
            .copy_from_slice(&mean);
        ctx.output(2)?
            .ensure::<f32>(&[l.n, l.g])
            .copy_from_slice(&rsig);
    }
    Ok(())
}

fn create_backward(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let group = read_group(init)?;
    let order = read_order(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        backward(ctx, group, order)
    })))
}

fn backward(ctx: &mut OpContext<'_>, group: usize, order: Order) -> Result<()> {
    let dims = ctx.input(1)?.dims().to_vec();
    let l = Layout::new(&dims, group, order)?;
    check_channels(ctx, &l, &[2, 3])?;
    let rows = l.n * l.g;
    for i in [4, 5] {
        if ctx.input(i)?.numel() != rows {
            bail!(
                op = ctx,
                ShapeMismatch: "input {i} ('{}') must have shape [{}, {}], got {:?}",
                ctx.input_name(i),
                l.n,
                l.g,
                ctx.input(i)?.dims()
            );
        }
    }
    if ctx.input(0)?.dims() != dims.as_slice() {
        bail!(
            op = ctx,
            ShapeMismatch: "dY {:?} must have the shape of X {dims:?}",
            ctx.input(0)?.dims()
        );
    }
    let (dx, dgamma, dbeta) = {
        let dy = ctx.input(0)?.as_slice::<f32>()?;
        let x = ctx.input(1)?.as_slice::<f32>()?;
        let gamma = ctx.input(2)?.as_slice::<f32>()?;
        let mean = ctx.input(4)?.as_slice::<f32>()?;
        let rsig = ctx.input(5)?.as_slice::<f32>()?;
        let mut ds = vec![0f32; rows];
        let mut db = vec![0f32; rows];
        for i in 0..x.len() {
            let (r, c) = l.at(i);
            ds[r] += gamma[c] * dy[i] * x[i];
            db[r] += gamma[c] * dy[i];
        }
        let denom = 1.0 / l.group_size().max(1) as f32;
        let mut dx = vec![0f32; x.len()];
        let mut dgamma = vec![0f32; l.c];
        let mut dbeta = vec![0f32; l.c];
        for i in 0..x.len() {
            let (r, c) = l.at(i);
            let centered = x[i] - mean[r];
            let u = (db[r] * mean[r] - ds[r]) * centered * rsig[r] * rsig[r] * rsig[r];
            let v = db[r] * rsig[r];
            dx[i] = gamma[c] * dy[i] * rsig[r] + (u - v) * denom;
            dgamma[c] += dy[i] * centered * rsig[r];
            dbeta[c] += dy[i];
        }
        (dx, dgamma, dbeta)
    };
    let g_dims = ctx.input(2)?.dims().to_vec();
    let b_dims = ctx.input(3)?.dims().to_vec();
    ctx.output(0)?.ensure::<f32>(&dims).copy_from_slice(&dx);
    ctx.output(1)?
        .ensure::<f32>(&g_dims)
        .copy_from_slice(&dgamma);
    ctx.output(2)?
        .ensure::<f32>(&b_dims)
        .copy_from_slice(&dbeta);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    fn get(ws: &Workspace, n: &str) -> Vec<f32> {
        ws.fetch(n).unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    #[test]
    fn normalizes_each_group() {
        let ws = Workspace::new();
        // N=1, C=2, HxW=2, one group: values 1, 2, 3, 4.
        ws.feed(
            "X",
            Tensor::from_vec(&[1, 2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
        );
        ws.feed("g", Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap());
        ws.feed("b", Tensor::from_vec(&[2], vec![0.0f32, 1.0]).unwrap());
        let mut op = OperatorDef::new("GroupNorm", ["X", "g", "b"], ["Y", "mu", "rsig"]);
        op.arg.push(Argument::int("group", 1));
        op.arg.push(Argument::int("is_test", 0));
        ws.run_operator_once(&op).unwrap();
        let rs = 1.0 / (1.25f64 + 1e-5).sqrt();
        assert_eq!(get(&ws, "mu"), vec![2.5]);
        assert_eq!(ws.fetch("rsig").unwrap().dims(), &[1, 1]);
        assert!((get(&ws, "rsig")[0] as f64 - rs).abs() < 1e-6);
        let want = [
            -1.5 * rs,
            -0.5 * rs,
            2.0 * 0.5 * rs + 1.0,
            2.0 * 1.5 * rs + 1.0,
        ];
        for (a, b) in get(&ws, "Y").iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-5);
        }
        // NHWC with two groups: each channel is its own group.
        let mut op = OperatorDef::new("GroupNorm", ["X", "g", "b"], ["Y"]);
        op.arg.push(Argument::int("group", 2));
        op.arg.push(Argument::string("order", "NHWC"));
        ws.run_operator_once(&op).unwrap();
        // Channels (last axis): c0 = {1, 3}, c1 = {2, 4}, var 1 each.
        let r = 1.0 / (1.0f64 + 1e-5).sqrt();
        let want = [-r, 2.0 * -r + 1.0, r, 2.0 * r + 1.0];
        for (a, b) in get(&ws, "Y").iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} {b}");
        }
    }

    #[test]
    fn errors() {
        let ws = Workspace::new();
        ws.feed("X", Tensor::from_vec(&[1, 3, 2], vec![0.0f32; 6]).unwrap());
        ws.feed("g", Tensor::from_vec(&[3], vec![1.0f32; 3]).unwrap());
        ws.feed("b", Tensor::from_vec(&[2], vec![1.0f32; 2]).unwrap());
        let mut op = OperatorDef::new("GroupNorm", ["X", "g", "b"], ["Y"]);
        op.arg.push(Argument::int("group", 2));
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("multiple of group"), "{e}");
        op.arg[0] = Argument::int("group", 3);
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("one per channel"), "{e}");
        op.arg.push(Argument::int("is_test", 0));
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("needs 3 outputs"), "{e}");
        let mut op = OperatorDef::new("GroupNorm", ["X", "g", "g"], ["Y"]);
        op.arg.push(Argument::string("order", "CHWN"));
        assert!(ws.run_operator_once(&op).is_err());
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let x: Vec<f32> = (0..12).map(|i| ((i * 7 % 12) as f32) / 5.0 - 1.0).collect();
        let gamma = vec![0.5f32, -1.0, 2.0, 1.5];
        let beta = vec![0.1f32, 0.2, 0.3, 0.4];
        let dy: Vec<f32> = (0..12).map(|i| ((i * 5 % 7) as f32) / 3.0 - 1.0).collect();
        // loss = <dY, Y(X)>; dX from the gradient op vs central differences.
        let run = |x: &[f32]| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let ws = Workspace::new();
            ws.feed("X", Tensor::from_vec(&[1, 4, 3], x.to_vec()).unwrap());
            ws.feed("g", Tensor::from_vec(&[4], gamma.clone()).unwrap());
            ws.feed("b", Tensor::from_vec(&[4], beta.clone()).unwrap());
            ws.feed("dY", Tensor::from_vec(&[1, 4, 3], dy.clone()).unwrap());
            let mut op = OperatorDef::new("GroupNorm", ["X", "g", "b"], ["Y", "mu", "rs"]);
            op.arg.push(Argument::int("group", 2));
            ws.run_operator_once(&op).unwrap();
            let mut gop = OperatorDef::new(
                "GroupNormGradient",
                ["dY", "X", "g", "b", "mu", "rs"],
                ["dX", "dg", "db"],
            );
            gop.arg.push(Argument::int("group", 2));
            ws.run_operator_once(&gop).unwrap();
            (get(&ws, "Y"), get(&ws, "dX"), get(&ws, "dg"))
        };
        let (_, dx, dg) = run(&x);
        let loss = |x: &[f32]| -> f64 {
            let (y, _, _) = run(x);
            y.iter()
                .zip(&dy)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum()
        };
        for i in 0..x.len() {
            let (mut a, mut b) = (x.clone(), x.clone());
            a[i] += 1e-2;
            b[i] -= 1e-2;
            let est = (loss(&a) - loss(&b)) / 2e-2;
            assert!((est - dx[i] as f64).abs() < 2e-3, "{i}: {est} vs {}", dx[i]);
        }
        assert_eq!(dg.len(), 4);
    }
}
