//! Times gradient generation for an FC+Relu chain (`layers` FC+Relu pairs and a
//! SumElements) through the serialized-net entry point that `Net.AddGradientOperators` uses,
//! with no Python in the timing: the Rust side of `benchmarks/bench_gradients.py`.
//!
//! ```text
//! cargo run --release -p ferrocaffe --example gradient_chain -- [layers=2000] [repeat=20]
//! ```
use ferrocaffe::autodiff::net_bytes::{backward_pass_net_bytes, Extras};
use ferrocaffe::autodiff::{BackwardOptions, GradRef, GradientContext, Registry, UsedNetNames};
use ferrocaffe::proto::{NetDef, OperatorDef};
use prost::Message;
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let layers = args.first().copied().unwrap_or(2000);
    let repeat = args.get(1).copied().unwrap_or(20);
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
    let bytes = net.encode_to_vec();
    let ys = vec![("loss".to_string(), GradRef::None)];
    let registry = Registry::layered(Registry::builtin());
    let options = BackwardOptions::default();
    let mut best = f64::MAX;
    for _ in 0..repeat {
        let mut names = UsedNetNames::new();
        let mut cx = GradientContext {
            registry: &registry,
            net_names: &mut names,
            options: &options,
        };
        let t = Instant::now();
        let out =
            backward_pass_net_bytes(&bytes, 0, &ys, &mut cx, Extras::default()).expect("backward");
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
    }
    println!("{} ops: best {:.3} ms", net.op.len(), best * 1e3);
}
