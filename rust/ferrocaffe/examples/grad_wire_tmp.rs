use std::time::Instant;

use ferrocaffe::autodiff::net_bytes::{backward_pass_net_bytes, Extras};
use ferrocaffe::autodiff::{ys_list, BackwardOptions, GradientContext, Registry, UsedNetNames};
use ferrocaffe::proto::{NetDef, OperatorDef};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let iters: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let mut ops = Vec::new();
    let mut x = "x".to_string();
    for k in 0..n {
        let fc = format!("fc{k}");
        ops.push(OperatorDef::new("FC", [x.clone(), format!("W{k}"), format!("b{k}")], [fc.clone()]));
        let r = format!("r{k}");
        ops.push(OperatorDef::new("Relu", [fc], [r.clone()]));
        x = r;
    }
    ops.push(OperatorDef::new("SumElements", [x], ["loss"]));
    let bytes = ferrocaffe::proto::encode(&NetDef { op: ops, ..Default::default() });
    let reg = Registry::layered(Registry::builtin());
    let ys = ys_list(["loss"]);
    let options = BackwardOptions::default();
    let mut best = f64::MAX;
    for _ in 0..iters {
        let mut names = UsedNetNames::new();
        let mut cx = GradientContext { registry: &reg, net_names: &mut names, options: &options };
        let t = Instant::now();
        let out = backward_pass_net_bytes(&bytes, 0, &ys, &mut cx, Extras { state: false, output_names: true }).expect("bp");
        let e = t.elapsed().as_secs_f64() * 1e3;
        std::hint::black_box(&out);
        drop(out);
        best = best.min(e);
    }
    println!("{} ops: best {:.3} ms", 2 * n + 1, best);
}
