//! Times gradient generation for FC+Relu chains (`layers` FC+Relu pairs and a SumElements)
//! through the serialized-net entry point that `Net.AddGradientOperators` uses, with no Python
//! in the timing: the Rust side of `benchmarks/bench_gradients.py`.
//!
//! ```text
//! cargo run --release -p ferrocaffe --example gradient_chain -- [layers...] [--repeat N]
//! ```
//!
//! Without `layers`, times the 4,001-op chain (2,000 layers) and the 100,001-op chain
//! (50,000 layers), and prints the growth between them (1.0 = linear). Each line is the best
//! of `repeat` runs (20 by default, fewer for large nets) and their median.
use ferrocaffe::autodiff::net_bytes::{backward_pass_net_bytes, Extras};
use ferrocaffe::autodiff::{BackwardOptions, GradRef, GradientContext, Registry, UsedNetNames};
use ferrocaffe::proto::{NetDef, OperatorDef};
use prost::Message;
use std::time::Instant;

fn chain(layers: usize) -> NetDef {
    let mut net = NetDef::default();
    let mut x = "x".to_string();
    for k in 0..layers {
        let (fc, r) = (format!("fc{k}"), format!("r{k}"));
        net.op.push(OperatorDef::new(
            "FC",
            [x.as_str(), &format!("W{k}"), &format!("b{k}")],
            [fc.as_str()],
        ));
        net.op
            .push(OperatorDef::new("Relu", [fc.as_str()], [r.as_str()]));
        x = r;
    }
    net.op
        .push(OperatorDef::new("SumElements", [x.as_str()], ["loss"]));
    net
}

/// Best and median seconds of `repeat` backward passes of `net`.
fn time(net: &NetDef, repeat: usize) -> (f64, f64) {
    let bytes = net.encode_to_vec();
    let ys = vec![("loss".to_string(), GradRef::None)];
    let registry = Registry::layered(Registry::builtin());
    let options = BackwardOptions::default();
    let mut times = Vec::with_capacity(repeat);
    for _ in 0..repeat.max(1) {
        let mut names = UsedNetNames::new();
        let mut cx = GradientContext {
            registry: &registry,
            net_names: &mut names,
            options: &options,
        };
        let t = Instant::now();
        let out =
            backward_pass_net_bytes(&bytes, 0, &ys, &mut cx, Extras::default()).expect("backward");
        times.push(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
    }
    times.sort_by(f64::total_cmp);
    (times[0], times[times.len() / 2])
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut layers = Vec::new();
    let mut repeat = None;
    while let Some(a) = args.next() {
        if a == "--repeat" {
            repeat = args.next().and_then(|r| r.parse().ok());
        } else if let Ok(n) = a.parse::<usize>() {
            layers.push(n);
        }
    }
    if layers.is_empty() {
        layers = vec![2000, 50000];
    }
    let mut prev: Option<(usize, f64)> = None;
    for n in layers {
        let net = chain(n);
        let ops = net.op.len();
        let repeat = repeat.unwrap_or(if ops > 20_001 { 5 } else { 20 });
        let (best, median) = time(&net, repeat);
        let growth = prev.map_or(String::new(), |(p_ops, p_best)| {
            format!(
                ", growth {:.2}",
                (best / p_best) / (ops as f64 / p_ops as f64)
            )
        });
        println!(
            "{ops} ops: best {:.3} ms, median {:.3} ms ({:.3} ms per 1k ops{growth})",
            best * 1e3,
            median * 1e3,
            best * 1e6 / ops as f64
        );
        prev = Some((ops, best));
    }
}
