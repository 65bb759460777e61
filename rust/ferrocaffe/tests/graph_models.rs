//! Graph surgery on the deployed models of the golden corpus (`models/files/*/{init,predict}_net.pb`
//! under `tests/golden`, or `$FERROCAFFE_GOLDEN`).

#![allow(clippy::unwrap_used)]

use ferrocaffe::graph::{Graph, Ssa};
use ferrocaffe::proto::{self, NetDef};
mod golden_data;
use golden_data::golden_dir as golden;

fn models() -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let dir = golden().join("models/files");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let predict = std::fs::read(path.join("predict_net.pb")).unwrap();
        let init = std::fs::read(path.join("init_net.pb")).unwrap();
        out.push((path.display().to_string(), predict, init));
    }
    out.sort();
    assert_eq!(
        out.len(),
        3,
        "expected the three deployed models in {}",
        dir.display()
    );
    out
}

#[test]
fn untouched_nets_round_trip() {
    for (name, predict, init) in models() {
        let g = Graph::from_bytes(&predict)
            .unwrap()
            .with_init_net_bytes(&init)
            .unwrap();
        assert_eq!(g.net().to_bytes().unwrap(), predict, "{name}");
        assert_eq!(g.init_net().unwrap().to_bytes().unwrap(), init, "{name}");
        let decoded: NetDef = proto::decode(&predict).unwrap();
        assert_eq!(g.net().to_net_def().unwrap(), decoded, "{name}");
    }
}

#[test]
fn parameters_are_read_at_the_init_nets_version() {
    for (name, predict, init) in models() {
        let p: NetDef = proto::decode(&predict).unwrap();
        let i: NetDef = proto::decode(&init).unwrap();
        let g = Graph::new(&p).with_init_net(&i);
        let init_ssa = Ssa::of(&i);
        // Every parameter the init net fills is read by the predict net at its final init
        // version, and no predict op writes it.
        for op in 0..g.num_ops() {
            for (blob, version) in g.ssa().versioned_inputs(op) {
                if let Some(v) = init_ssa.version(blob) {
                    assert_eq!(version, v, "{name}: op #{op} reads {blob}");
                }
            }
        }
        // Deployed models have no dead ends.
        let mut g2 = Graph::new(&p);
        assert!(g2.remove_dead_end_ops().is_empty(), "{name}");
    }
}

#[test]
fn renaming_a_weight_updates_both_nets() {
    for (name, predict, init) in models() {
        let p: NetDef = proto::decode(&predict).unwrap();
        // The first op reading a blob the init net fills.
        let i: NetDef = proto::decode(&init).unwrap();
        let filled = Ssa::of(&i);
        let (op, input, weight) =
            p.op.iter()
                .enumerate()
                .find_map(|(k, op)| {
                    op.input
                        .iter()
                        .position(|b| b != "data" && filled.version(b).is_some())
                        .map(|j| (k, j, op.input[j].clone()))
                })
                .unwrap();
        let mut g = Graph::from_bytes(&predict)
            .unwrap()
            .with_init_net_bytes(&init)
            .unwrap();
        g.rename_op_input(op, input, "renamed_weight", false)
            .unwrap();
        let p2 = g.net().to_net_def().unwrap();
        let i2 = g.init_net().unwrap().to_net_def().unwrap();
        assert_eq!(p2.op[op].input[input], "renamed_weight", "{name}");
        assert!(
            p2.external_input.iter().any(|b| b == "renamed_weight"),
            "{name}"
        );
        assert!(!p2.external_input.contains(&weight), "{name}");
        assert!(
            i2.op
                .iter()
                .any(|o| o.output.iter().any(|b| b == "renamed_weight")),
            "{name}: init net must fill the renamed blob"
        );
        assert!(!i2.op.iter().any(|o| o.output.contains(&weight)), "{name}");
        // Everything else is unchanged.
        assert_eq!(p2.op.len(), p.op.len());
        for (a, b) in p2.op.iter().zip(&p.op) {
            assert_eq!(a.r#type, b.r#type);
            assert_eq!(a.arg, b.arg);
        }
    }
}
