//! The RNN step executor against the plain sequential runner: the dependency graph of an
//! unrolled step net, bit-identical results under thread counts, timestep bounds and reused
//! workspaces, the bound on timesteps in flight, and failures that name op and timestep.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ferrocaffe::net::instantiate_ops;
use ferrocaffe::proto::{Argument, NetDef, OperatorDef};
use ferrocaffe::rnn::analysis;
use ferrocaffe::rnn::config::{add_apply_link_ops, Link};
use ferrocaffe::rnn::executor::RnnExecutor;
use ferrocaffe::rnn::steps::set_timestep;
use ferrocaffe::tensor::Tensor;
use ferrocaffe::workspace::Workspace;

const T: usize = 6;
const N: usize = 2;
const H: usize = 3;

fn link(internal: &str, external: &str, offset: i64) -> Link {
    Link {
        internal: internal.into(),
        external: external.into(),
        offset,
        window: 1,
    }
}

/// Two stacked tanh-RNN layers: h1_t = tanh(fc(h1_{t-1}) + x_t), h2_t = tanh(fc(h2_{t-1}) +
/// h1_t). Layer 2 at t and layer 1 at t + 1 are independent.
fn step_net(layers: usize) -> NetDef {
    let mut net = NetDef {
        name: Some("step".into()),
        ..Default::default()
    };
    let mut links = vec![link("x_t", "input", 0)];
    for l in 1..=layers {
        let input = if l == 1 {
            "x_t".to_string()
        } else {
            format!("h{}_t", l - 1)
        };
        let mut fc = OperatorDef::new(
            "FC",
            [format!("h{l}_prev"), format!("W{l}"), format!("b{l}")],
            [format!("fc{l}")],
        );
        fc.arg.push(Argument::int("axis", 2));
        net.op.push(fc);
        net.op.push(OperatorDef::new(
            "Sum",
            [format!("fc{l}"), input],
            [format!("s{l}")],
        ));
        net.op.push(OperatorDef::new(
            "Tanh",
            [format!("s{l}")],
            [format!("h{l}_t")],
        ));
        links.push(link(&format!("h{l}_prev"), &format!("states{l}"), 0));
        links.push(link(&format!("h{l}_t"), &format!("states{l}"), 1));
    }
    add_apply_link_ops(&links, "timestep", None, &mut net);
    net
}

fn values(seed: u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000;
            x as f32 / 1000.0 - 0.5
        })
        .collect()
}

fn root(layers: usize) -> Arc<Workspace> {
    let ws = Workspace::new();
    ws.feed(
        "input",
        Tensor::from_vec(&[T, N, H], values(1, T * N * H)).unwrap(),
    );
    for l in 1..=layers {
        ws.feed(
            &format!("W{l}"),
            Tensor::from_vec(&[H, H], values(10 + l as u32, H * H)).unwrap(),
        );
        ws.feed(
            &format!("b{l}"),
            Tensor::from_vec(&[H], values(20 + l as u32, H)).unwrap(),
        );
        ws.feed(
            &format!("states{l}"),
            Tensor::from_vec(&[T + 1, N, H], values(30 + l as u32, (T + 1) * N * H)).unwrap(),
        );
    }
    ws
}

/// Runs the step nets one after another in fresh child workspaces; returns the states.
fn sequential(layers: usize) -> Vec<Vec<u8>> {
    let ws = root(layers);
    let net = step_net(layers);
    for t in 0..T {
        let step = Workspace::new_child(&ws);
        set_timestep(&step, "timestep", t).unwrap();
        step.run_net_once(&net).unwrap();
    }
    (1..=layers)
        .map(|l| ws.fetch(&format!("states{l}")).unwrap().bytes().to_vec())
        .collect()
}

fn with_executor(
    layers: usize,
    threads: usize,
    bound: usize,
    workspaces: usize,
    runs: usize,
) -> (Vec<Vec<u8>>, usize) {
    let ws = root(layers);
    let initial: Vec<Tensor> = (1..=layers)
        .map(|l| ws.fetch(&format!("states{l}")).unwrap())
        .collect();
    let steps: Vec<Arc<Workspace>> = (0..workspaces).map(|_| Workspace::new_child(&ws)).collect();
    let mut ex = RnnExecutor::new(step_net(layers), "timestep", threads, bound);
    let mut peak = 0;
    let mut out = Vec::new();
    for _ in 0..runs {
        for (l, t) in initial.iter().enumerate() {
            ws.feed(&format!("states{}", l + 1), t.deep_copy());
        }
        for t in 0..T {
            ex.ensure_timestep(t, &steps[t % workspaces]).unwrap();
        }
        ex.run(T, false).unwrap();
        peak = peak.max(ex.last_peak_span());
        let got: Vec<Vec<u8>> = (1..=layers)
            .map(|l| ws.fetch(&format!("states{l}")).unwrap().bytes().to_vec())
            .collect();
        if let Some(first) = out.first() {
            assert_eq!(first, &got);
        }
        out.push(got);
    }
    (out.swap_remove(0), peak)
}

#[test]
fn executor_is_bit_identical_to_sequential_runs() {
    for layers in [1, 2] {
        let expected = sequential(layers);
        for (threads, bound, workspaces) in [
            (1, 0, T),
            (4, 0, T),
            (3, 1, T),
            (2, 2, T),
            (8, 3, T),
            (4, 2, 2),
            (4, 1, 1),
            (3, 0, 3),
        ] {
            let (got, peak) = with_executor(layers, threads, bound, workspaces, 5);
            assert_eq!(
                got, expected,
                "layers {layers} threads {threads} bound {bound} workspaces {workspaces}"
            );
            if bound > 0 {
                assert!(peak <= bound, "peak {peak} > bound {bound}");
            }
            assert!(peak >= 1);
        }
    }
}

#[test]
fn graph_links_steps_through_rows_and_guards_reused_workspaces() {
    let ws = root(1);
    let net = step_net(1);
    // Ops: link x_t, link h1_prev, link h1_t, FC, Sum, Tanh.
    let per = net.op.len();
    assert_eq!(per, 6);
    let build = |shared: bool| {
        let one = Workspace::new_child(&ws);
        let steps: Vec<_> = (0..3)
            .map(|t| {
                let step = if shared {
                    one.clone()
                } else {
                    Workspace::new_child(&ws)
                };
                set_timestep(&step, "timestep", t).unwrap();
                let ops = instantiate_ops(&net, &step).unwrap();
                (
                    t,
                    ops.into_iter()
                        .map(parking_lot::Mutex::new)
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        let views: Vec<(usize, &[parking_lot::Mutex<_>])> =
            steps.iter().map(|(t, o)| (*t, o.as_slice())).collect();
        analysis::build(&views)
    };
    let g = build(false);
    assert!(!g.sequential);
    assert_eq!(g.num_tasks(), 3 * per);
    // Link ops of separate workspaces depend on nothing.
    assert_eq!(g.preds[per], 0);
    // FC at step 1 waits for its link and for the Tanh of step 0 (row 1 of the states).
    assert_eq!(g.preds[per + 3], 2);
    assert!(g.successors(5).contains(&((per + 3) as u32)));
    // Tanh at step 0 writes row 1 only: the Tanh of step 1 (row 2) does not wait for it.
    assert!(!g.successors(5).contains(&((per + 5) as u32)));

    // One workspace for every step: relinking h1_prev at step 1 must wait for the FC of
    // step 0 that read the old link (write after read).
    let g = build(true);
    assert!(g.successors(3).contains(&((per + 1) as u32)));
    assert!(g.preds[per + 1] >= 2);
}

fn rnn_op(enabled: i64, threads: i64) -> OperatorDef {
    let mut step = NetDef {
        name: Some("step".into()),
        ..Default::default()
    };
    let mut fc = OperatorDef::new("FC", ["h_prev", "W", "b"], ["fc"]);
    fc.arg.push(Argument::int("axis", 2));
    step.op.push(fc);
    step.op.push(OperatorDef::new("Sum", ["fc", "x_t"], ["s"]));
    step.op.push(OperatorDef::new("Tanh", ["s"], ["h_t"]));
    let mut op = OperatorDef::new(
        "RecurrentNetwork",
        ["input", "h0", "W", "b"],
        ["h_all", "h_last", "step_ws"],
    );
    let strings = |name: &str, v: &[&str]| Argument {
        name: Some(name.into()),
        strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    };
    let ints = |name: &str, v: &[i64]| Argument {
        name: Some(name.into()),
        ints: v.to_vec(),
        ..Default::default()
    };
    op.arg = vec![
        strings("alias_src", &["states", "states"]),
        strings("alias_dst", &["h_all", "h_last"]),
        ints("alias_offset", &[1, -1]),
        strings("recurrent_states", &["states"]),
        ints("initial_recurrent_state_ids", &[1]),
        strings("link_internal", &["h_prev", "h_t", "x_t"]),
        strings("link_external", &["states", "states", "input"]),
        ints("link_offset", &[0, 1, 0]),
        Argument::int("enable_rnn_executor", enabled),
        Argument::int("rnn_executor.num_threads", threads),
        Argument {
            name: Some("step_net".into()),
            n: Some(step),
            ..Default::default()
        },
    ];
    op
}

#[test]
fn recurrent_network_failures_name_op_and_timestep_and_it_runs_again() {
    for enabled in [1, 0] {
        let ws = root(1);
        ws.feed(
            "h0",
            Tensor::from_vec(&[1, N, H], values(5, N * H)).unwrap(),
        );
        ws.feed(
            "W",
            Tensor::from_vec(&[H, H + 1], values(6, H * (H + 1))).unwrap(),
        );
        ws.feed("b", Tensor::from_vec(&[H], values(7, H)).unwrap());
        let mut net = NetDef {
            name: Some("main".into()),
            ..Default::default()
        };
        net.op.push(rnn_op(enabled, 4));
        ws.create_net(&net, true).unwrap();
        let e = ws.run_net("main", 1).unwrap_err().to_string();
        assert!(e.contains("timestep 0"), "{e}");
        assert!(e.contains("type FC"), "{e}");
        ws.feed("W", Tensor::from_vec(&[H, H], values(6, H * H)).unwrap());
        ws.run_net("main", 2).unwrap();
        let all = ws.fetch("h_all").unwrap();
        assert_eq!(all.dims(), &[T, N, H]);
        let last = ws.fetch("h_last").unwrap();
        assert_eq!(last.dims(), &[1, N, H]);
        assert_eq!(last.bytes(), &all.bytes()[(T - 1) * N * H * 4..]);
        // The plain runner computes the same thing.
        let plain = Workspace::new();
        for name in ["input", "h0", "W", "b"] {
            plain.feed(name, ws.fetch(name).unwrap());
        }
        plain.run_operator_once(&rnn_op(0, 1)).unwrap();
        assert_eq!(plain.fetch("h_all").unwrap().bytes(), all.bytes());
    }
}
