//! Criterion benches of what Rust callers use directly, so that a regression in Rust-only
//! code shows without Python:
//!
//! - `sgemm/*`: [`ferrocaffe::blas::sgemm`] on the products of an LSTM step (batch 32,
//!   hidden 256, gates 1024), with the weight also held constant as `RecurrentNetworkGradient`
//!   holds it, on one thread and on the default two, and on square FC products (256, 512,
//!   1024). Throughput: floating-point operations (`2 m n k`).
//! - `autodiff/*`: gradient generation for the 4,001-op FC+Relu chain of
//!   `examples/gradient_chain.rs`, through the serialized-net entry point that
//!   `Net.AddGradientOperators` uses and through [`backward_pass`] on decoded ops.
//!   Throughput: forward ops.
//! - `ssa/*`: `get_ssa` ([`Ssa::of`], [`Ssa::from_bytes`]) of the same chain. Throughput: ops.
//! - `lstm/*`: one training step of a one-layer LSTM (T 16, N 32, D 128, H 256) through the
//!   runtime: input FC, `RecurrentNetwork`, loss and the gradient ops that autodiff makes for
//!   them, with the RNN executor on and off. Throughput: the pass's matrix FLOPs.
//!
//! Criterion reports throughput in `elem/s`: for `sgemm/*` and `lstm/*` that is FLOP/s, for
//! `autodiff/*` and `ssa/*` forward ops per second.
//!
//! ```text
//! cargo bench -p ferrocaffe                       # full run (about two minutes of timing)
//! cargo bench -p ferrocaffe -- --quick            # seconds of timing, once built
//! cargo bench -p ferrocaffe -- sgemm/lstm_step    # the benches whose name matches a filter
//! ```
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use ferrocaffe::autodiff::net_bytes::{backward_pass_net_bytes, Extras};
use ferrocaffe::autodiff::{
    backward_pass, ys_list, BackwardOptions, GradRef, GradientContext, Registry, UsedNetNames,
};
use ferrocaffe::blas::{hold_constant, sgemm, single_threaded};
use ferrocaffe::graph::{Ssa, Version};
use ferrocaffe::net::Net;
use ferrocaffe::proto::{self, Argument, NetDef, OperatorDef};
use ferrocaffe::tensor::Tensor;
use ferrocaffe::workspace::Workspace;

/// Deterministic values in `[-scale, scale]`.
fn values(len: usize, seed: f32, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as f32 + seed) * 0.618).sin() * scale)
        .collect()
}

// ------------------------------------------------------------------------------------ sgemm

/// One `sgemm` case: `C (m x n) = op(A) op(B) + beta C`.
struct Gemm {
    name: &'static str,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    beta: f32,
}

impl Gemm {
    fn flops(&self) -> u64 {
        2 * (self.m * self.n * self.k) as u64
    }
}

fn bench_sgemm(c: &mut Criterion) {
    // An LSTM step: batch N = 32, hidden H = 256, gates G = 4H.
    let (n, h) = (32, 256);
    let g = 4 * h;
    let step = [
        // Forward: gates = h_prev W^T.
        Gemm {
            name: "h_Wt",
            trans_a: false,
            trans_b: true,
            m: n,
            n: g,
            k: h,
            beta: 0.0,
        },
        // Backward: dh_prev = dG W.
        Gemm {
            name: "dG_W",
            trans_a: false,
            trans_b: false,
            m: n,
            n: h,
            k: g,
            beta: 0.0,
        },
        // Backward: dW += dG^T h_prev (accumulated over the steps).
        Gemm {
            name: "dGt_h",
            trans_a: true,
            trans_b: false,
            m: g,
            n: h,
            k: n,
            beta: 1.0,
        },
    ];
    let mut group = c.benchmark_group("sgemm/lstm_step");
    for case in &step {
        let a = values(case.m * case.k, 1.0, 1.0);
        let b = values(case.k * case.n, 2.0, 1.0);
        let mut out = vec![0.0f32; case.m * case.n];
        group.throughput(Throughput::Elements(case.flops()));
        let mut run = || {
            let (ta, tb, m, nn, k, beta) = (
                case.trans_a,
                case.trans_b,
                case.m,
                case.n,
                case.k,
                case.beta,
            );
            sgemm(ta, tb, m, nn, k, 1.0, black_box(&a), &b, beta, &mut out);
        };
        group.bench_function(BenchmarkId::new(case.name, "two_threads"), |bench| {
            bench.iter(&mut run)
        });
        group.bench_function(BenchmarkId::new(case.name, "one_thread"), |bench| {
            single_threaded(|| bench.iter(&mut run))
        });
    }
    // dG W with W held constant, as RecurrentNetworkGradient holds its parameters over the
    // steps: the weight's column strips are cut once, not at every call.
    let held = Tensor::from_vec(&[g, h], values(g * h, 2.0, 1.0)).expect("a g x h tensor");
    let guard = hold_constant([held.snapshot()]);
    let w = held.as_slice::<f32>().expect("a float tensor");
    let dg = values(n * g, 1.0, 1.0);
    let mut dx = vec![0.0f32; n * h];
    group.throughput(Throughput::Elements(2 * (n * h * g) as u64));
    let mut run = || sgemm(false, false, n, h, g, 1.0, black_box(&dg), w, 0.0, &mut dx);
    group.bench_function(BenchmarkId::new("dG_W_held", "two_threads"), |bench| {
        bench.iter(&mut run)
    });
    group.bench_function(BenchmarkId::new("dG_W_held", "one_thread"), |bench| {
        single_threaded(|| bench.iter(&mut run))
    });
    drop(guard);
    group.finish();

    // FC layers: square products.
    let mut group = c.benchmark_group("sgemm/fc_square");
    for size in [256usize, 512, 1024] {
        let a = values(size * size, 1.0, 1.0);
        let b = values(size * size, 2.0, 1.0);
        let mut out = vec![0.0f32; size * size];
        group.throughput(Throughput::Elements(2 * (size * size * size) as u64));
        if size >= 1024 {
            // Tens of milliseconds an iteration: as many iterations in every sample.
            group.sampling_mode(SamplingMode::Flat).sample_size(20);
        }
        // FC computes X W^T.
        group.bench_function(BenchmarkId::from_parameter(size), |bench| {
            bench.iter(|| sgemm(false, true, size, size, size, 1.0, &a, &b, 0.0, &mut out))
        });
    }
    group.finish();
}

// ------------------------------------------------------------------------ gradient generation

/// The FC+Relu chain of `examples/gradient_chain.rs`: `layers` FC+Relu pairs and a
/// SumElements (`2 layers + 1` ops).
fn fc_relu_chain(layers: usize) -> NetDef {
    let mut net = NetDef::default();
    let mut x = "x".to_string();
    for k in 0..layers {
        let (fc, r) = (format!("fc{k}"), format!("r{k}"));
        let (w, b) = (format!("W{k}"), format!("b{k}"));
        net.op
            .push(OperatorDef::new("FC", [x.as_str(), &w, &b], [fc.as_str()]));
        net.op
            .push(OperatorDef::new("Relu", [fc.as_str()], [r.as_str()]));
        x = r;
    }
    net.op
        .push(OperatorDef::new("SumElements", [x.as_str()], ["loss"]));
    net
}

/// 2,000 layers: 4,001 ops.
const CHAIN_LAYERS: usize = 2000;

fn bench_autodiff(c: &mut Criterion) {
    let net = fc_relu_chain(CHAIN_LAYERS);
    let bytes = proto::encode(&net);
    let ys = vec![("loss".to_string(), GradRef::None)];
    let registry = Registry::layered(Registry::builtin());
    let options = BackwardOptions::default();
    let mut group = c.benchmark_group("autodiff/fc_relu_chain");
    group.throughput(Throughput::Elements(net.op.len() as u64));
    group.sample_size(20);
    group.bench_function(BenchmarkId::new("net_bytes", net.op.len()), |bench| {
        bench.iter(|| {
            let mut names = UsedNetNames::new();
            let mut cx = GradientContext {
                registry: &registry,
                net_names: &mut names,
                options: &options,
            };
            backward_pass_net_bytes(black_box(&bytes), 0, &ys, &mut cx, Extras::default())
                .expect("the chain's backward pass")
        })
    });
    group.bench_function(BenchmarkId::new("ops", net.op.len()), |bench| {
        bench.iter(|| backward_pass(black_box(&net.op), &ys, &registry).expect("backward pass"))
    });
    group.finish();
}

fn bench_ssa(c: &mut Criterion) {
    let net = fc_relu_chain(CHAIN_LAYERS);
    let bytes = proto::encode(&net);
    let mut group = c.benchmark_group("ssa/fc_relu_chain");
    group.throughput(Throughput::Elements(net.op.len() as u64));
    group.bench_function(BenchmarkId::new("net", net.op.len()), |bench| {
        bench.iter(|| Ssa::of(black_box(&net)))
    });
    group.bench_function(BenchmarkId::new("bytes", net.op.len()), |bench| {
        bench.iter(|| {
            Ssa::from_bytes(black_box(&bytes), std::iter::empty::<(&str, Version)>())
                .expect("the chain's SSA")
        })
    });
    group.finish();
}

// ------------------------------------------------------------------------------ LSTM training

/// Sizes of the LSTM bench: timesteps, batch, input width, hidden width.
#[derive(Clone, Copy)]
struct Lstm {
    t: usize,
    n: usize,
    d: usize,
    h: usize,
}

impl Lstm {
    /// Matrix FLOPs of one forward + backward pass: the input projection and the recurrent
    /// products, each three times (product, input gradient, weight gradient).
    fn flops(self) -> u64 {
        let Lstm { t, n, d, h } = self;
        (6 * t * n * 4 * h * (d + h)) as u64
    }
}

fn strings(name: &str, values: &[&str]) -> Argument {
    Argument {
        name: Some(name.into()),
        strings: values.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    }
}

fn ints(name: &str, values: &[i64]) -> Argument {
    Argument {
        name: Some(name.into()),
        ints: values.to_vec(),
        ..Default::default()
    }
}

fn net_arg(name: &str, net: NetDef) -> Argument {
    Argument {
        name: Some(name.into()),
        n: Some(net),
        ..Default::default()
    }
}

fn net(name: &str, ops: Vec<OperatorDef>, inputs: &[&str], outputs: &[&str]) -> NetDef {
    NetDef {
        name: Some(name.into()),
        op: ops,
        external_input: inputs.iter().map(|s| s.to_string()).collect(),
        external_output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn with_args(mut op: OperatorDef, args: impl IntoIterator<Item = Argument>) -> OperatorDef {
    op.arg.extend(args);
    op
}

/// `LSTMUnit` / `LSTMUnitGradient` arguments.
fn lstm_unit_args() -> [Argument; 3] {
    [
        Argument::float("forget_bias", 0.0),
        Argument::int("drop_states", 0),
        Argument::int("sequence_lengths", 1),
    ]
}

/// The training net `rnn_cell.LSTM` builds for one layer (as recorded from Caffe2 in
/// `tests/golden/rnn`): `i2h = FC(input)`, a `RecurrentNetwork` whose step net is
/// `FC(h_prev) + i2h_t -> LSTMUnit`, `loss = AveragedLoss(Sqr(hidden_all))`, then the gradient
/// ops made by this crate's autodiff.
fn lstm_training_net(executor: bool) -> NetDef {
    let step = net(
        "lstm",
        vec![
            with_args(
                OperatorDef::new("FC", ["h_prev", "gates_w", "gates_b"], ["gates"]),
                [Argument::int("axis", 2)],
            ),
            OperatorDef::new("Sum", ["gates", "input_t"], ["gates"]),
            with_args(
                OperatorDef::new(
                    "LSTMUnit",
                    ["h_prev", "c_prev", "gates", "seq_lengths", "timestep"],
                    ["h", "c"],
                ),
                lstm_unit_args(),
            ),
        ],
        &[
            "input_t",
            "timestep",
            "h_prev",
            "c_prev",
            "gates_w",
            "gates_b",
            "seq_lengths",
        ],
        &["h", "c"],
    );
    let mut unit_grad = with_args(
        OperatorDef::new(
            "LSTMUnitGradient",
            [
                "h_prev",
                "c_prev",
                "gates",
                "seq_lengths",
                "timestep",
                "h",
                "c",
                "h_grad",
                "c_grad",
            ],
            ["h_prev_grad", "c_prev_grad", "gates_grad"],
        ),
        lstm_unit_args(),
    );
    unit_grad.is_gradient_op = Some(true);
    let mut fc_grad = with_args(
        OperatorDef::new(
            "FCGradient",
            ["h_prev", "gates_w", "gates_grad"],
            ["gates_w_grad", "gates_b_grad", "h_prev_grad_split"],
        ),
        [Argument::int("axis", 2)],
    );
    fc_grad.is_gradient_op = Some(true);
    let backward_step = net(
        "RecurrentBackwardStep",
        vec![
            unit_grad,
            fc_grad,
            OperatorDef::new("Sum", ["h_prev_grad", "h_prev_grad_split"], ["h_prev_grad"]),
        ],
        &[
            "gates",
            "h_grad",
            "c_grad",
            "input_t",
            "timestep",
            "h_prev",
            "c_prev",
            "gates_w",
            "gates_b",
            "seq_lengths",
            "h",
            "c",
        ],
        &[],
    );
    let recurrent = with_args(
        OperatorDef::new(
            "RecurrentNetwork",
            ["i2h", "h0", "c0", "gates_w", "gates_b", "seq_lengths"],
            ["h_all", "h_last", "c_all", "c_last", "step_workspaces"],
        ),
        [
            strings(
                "alias_src",
                &["h_states", "h_states", "c_states", "c_states"],
            ),
            strings("alias_dst", &["h_all", "h_last", "c_all", "c_last"]),
            ints("alias_offset", &[1, -1, 1, -1]),
            strings("recurrent_states", &["h_states", "c_states"]),
            ints("initial_recurrent_state_ids", &[1, 2]),
            strings("link_internal", &["h_prev", "h", "c_prev", "c", "input_t"]),
            strings(
                "link_external",
                &["h_states", "h_states", "c_states", "c_states", "i2h"],
            ),
            ints("link_offset", &[0, 1, 0, 1, 0]),
            Argument::int("enable_rnn_executor", i64::from(executor)),
            net_arg("step_net", step),
            Argument::string("timestep", "timestep"),
            ints("param", &[3, 4]),
            strings(
                "backward_link_internal",
                &[
                    "h_grad",
                    "h_prev_grad",
                    "c_grad",
                    "c_prev_grad",
                    "gates_grad",
                ],
            ),
            strings(
                "backward_link_external",
                &[
                    "h_states_grad",
                    "h_states_grad",
                    "c_states_grad",
                    "c_states_grad",
                    "i2h_grad",
                ],
            ),
            ints("backward_link_offset", &[1, 0, 1, 0, 0]),
            ints("outputs_with_grads", &[0]),
            strings("param_grads", &["gates_w_grad", "gates_b_grad"]),
            net_arg("backward_step_net", backward_step),
        ],
    );
    let forward = vec![
        with_args(
            OperatorDef::new("FC", ["input", "i2h_w", "i2h_b"], ["i2h"]),
            [Argument::int("axis", 2)],
        ),
        recurrent,
        OperatorDef::new("Sqr", ["h_all"], ["sq"]),
        OperatorDef::new("AveragedLoss", ["sq"], ["loss"]),
    ];
    let (gradient, _) = backward_pass(&forward, &ys_list(["loss"]), &Registry::builtin())
        .expect("the LSTM net's gradient ops");
    let mut ops = forward;
    ops.extend(gradient);
    net(
        "lstm_training",
        ops,
        &[
            "input",
            "seq_lengths",
            "h0",
            "c0",
            "i2h_w",
            "i2h_b",
            "gates_w",
            "gates_b",
        ],
        &[],
    )
}

/// A workspace with the LSTM's inputs and parameters, and the training net instantiated in
/// it (run once, its loss and a weight gradient checked).
fn lstm_setup(size: Lstm, executor: bool) -> (Arc<Workspace>, Net) {
    let Lstm { t, n, d, h } = size;
    let g = 4 * h;
    let ws = Workspace::new();
    let feed = |name: &str, dims: &[usize], seed: f32, scale: f32| {
        let len = dims.iter().product();
        let tensor = Tensor::from_vec(dims, values(len, seed, scale)).expect("a float tensor");
        ws.feed(name, tensor);
    };
    feed("input", &[t, n, d], 1.0, 1.0);
    feed("h0", &[1, n, h], 2.0, 0.1);
    feed("c0", &[1, n, h], 3.0, 0.1);
    feed("i2h_w", &[g, d], 4.0, 0.1);
    feed("i2h_b", &[g], 5.0, 0.1);
    feed("gates_w", &[g, h], 6.0, 0.1);
    feed("gates_b", &[g], 7.0, 0.1);
    let lengths = Tensor::from_vec(&[n], vec![t as i32; n]).expect("an int tensor");
    ws.feed("seq_lengths", lengths);
    let mut net = Net::new(&lstm_training_net(executor), &ws).expect("the LSTM training net");
    net.run().expect("a training step");
    let loss = ws.fetch("loss").expect("the loss");
    let loss = loss.as_slice::<f32>().expect("a float loss")[0];
    assert!(loss.is_finite() && loss > 0.0, "loss {loss}");
    // The recurrent weight's gradient, and the initial state's: the backward pass went
    // through every step.
    for (name, len) in [("gates_w_grad", g * h), ("h0_grad", n * h)] {
        let grad = ws.fetch(name).expect("a gradient");
        let grad = grad.as_slice::<f32>().expect("a float gradient");
        assert_eq!(grad.len(), len, "{name}");
        let nonzero = grad.iter().any(|&v| v != 0.0);
        assert!(grad.iter().all(|v| v.is_finite()) && nonzero, "{name}");
    }
    (ws, net)
}

fn bench_lstm(c: &mut Criterion) {
    let size = Lstm {
        t: 16,
        n: 32,
        d: 128,
        h: 256,
    };
    let mut group = c.benchmark_group("lstm/train_step");
    group.throughput(Throughput::Elements(size.flops()));
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    for (label, executor) in [("executor", true), ("sequential", false)] {
        let (_ws, mut net) = lstm_setup(size, executor);
        let id = format!("T{}_N{}_D{}_H{}", size.t, size.n, size.d, size.h);
        group.bench_function(BenchmarkId::new(label, id), |bench| {
            bench.iter(|| net.run().expect("a training step"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_sgemm, bench_autodiff, bench_ssa, bench_lstm);
criterion_main!(benches);
