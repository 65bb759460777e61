//! Times gradient generation for an FC+Relu chain (a quick profiling aid).
use std::time::Instant;

use ferrocaffe::autodiff::{backward_pass, ys_list, Ir, Registry};
use ferrocaffe::proto::OperatorDef;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let mut ops = Vec::new();
    let mut x = "data".to_string();
    for k in 0..n {
        let fc = format!("fc{k}");
        ops.push(OperatorDef::new(
            "FC",
            [x.clone(), format!("w{k}"), format!("b{k}")],
            [fc.clone()],
        ));
        let r = format!("r{k}");
        ops.push(OperatorDef::new("Relu", [fc], [r.clone()]));
        x = r;
    }
    ops.push(OperatorDef::new("SumElements", [x], ["loss"]));
    let reg = Registry::builtin();
    let ys = ys_list(["loss"]);
    for _ in 0..3 {
        let t = Instant::now();
        let ir = Ir::new(&ops);
        let t1 = t.elapsed();
        drop(ir);
        let t = Instant::now();
        let (g, m) = backward_pass(&ops, &ys, &reg).expect("backward pass");
        let t2 = t.elapsed();
        let t = Instant::now();
        let bytes = ferrocaffe::proto::encode(&ferrocaffe::proto::NetDef {
            op: g,
            ..Default::default()
        });
        let t3 = t.elapsed();
        println!(
            "{} ops: play {:?}, backward {:?}, encode {:?} ({} bytes, {} grads)",
            ops.len(),
            t1,
            t2,
            t3,
            bytes.len(),
            m.len()
        );
    }
}
