//! Prints a NetDef the way the graph algorithms see it: ops, external inputs and outputs, the
//! SSA versions of every op's inputs and outputs, the final blob versions, undefined blobs and
//! dead-end ops.
//!
//! ```text
//! cargo run --example inspect_net -- path/to/predict_net.pb
//! cargo run --example inspect_net            # a small net built here
//! ```

use ferrocaffe::graph::{Graph, Ssa};
use ferrocaffe::proto::{self, NetDef, OperatorDef};

fn demo_net() -> NetDef {
    let mut net = NetDef {
        name: Some("demo".into()),
        external_input: vec!["data".into(), "fc_w".into(), "fc_b".into()],
        external_output: vec!["prob".into()],
        ..Default::default()
    };
    net.op
        .push(OperatorDef::new("FC", ["data", "fc_w", "fc_b"], ["fc"]));
    net.op.push(OperatorDef::new("Relu", ["fc"], ["fc"]));
    net.op
        .push(OperatorDef::new("Mul", ["fc", "scale"], ["scaled"]));
    net.op
        .push(OperatorDef::new("Softmax", ["scaled"], ["prob"]));
    net.op
        .push(OperatorDef::new("Print", ["fc"], Vec::<String>::new()));
    net
}

fn versioned<'a>(items: impl Iterator<Item = (&'a str, i64)>) -> String {
    items
        .map(|(n, v)| format!("{n}@{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (source, bytes) = match std::env::args().nth(1) {
        Some(path) => {
            let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
            (path, bytes)
        }
        None => (
            "(built-in demo net)".to_string(),
            proto::encode(&demo_net()),
        ),
    };
    let net: NetDef = proto::decode(&bytes)?;

    println!(
        "net {:?} from {source}: {} ops, {} bytes",
        net.name.as_deref().unwrap_or(""),
        net.op.len(),
        bytes.len()
    );
    println!("external inputs:  {}", net.external_input.join(", "));
    println!("external outputs: {}", net.external_output.join(", "));

    let ssa = Ssa::of(&net);
    println!("\nops (inputs -> outputs, as name@version):");
    for (i, op) in net.op.iter().enumerate() {
        println!(
            "  #{i:<4} {:<20} {} -> {}",
            op.r#type.as_deref().unwrap_or(""),
            versioned(ssa.versioned_inputs(i)),
            versioned(ssa.versioned_outputs(i)),
        );
    }

    println!("\nblob versions: {}", versioned(ssa.blob_versions()));
    let mut undefined: Vec<&str> = ssa.undefined_blobs().iter().map(|&b| ssa.name(b)).collect();
    undefined.sort_unstable();
    println!(
        "undefined blobs (read at version 0): {}",
        undefined.join(", ")
    );

    let mut graph = Graph::from_bytes(&bytes)?;
    println!(
        "final external outputs: {}",
        versioned(graph.versioned_external_outputs().into_iter())
    );
    let dead = graph.remove_dead_end_ops();
    println!(
        "dead-end ops (reach no external output): {}",
        if dead.is_empty() {
            "none".to_string()
        } else {
            dead.iter()
                .map(|i| format!("#{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    Ok(())
}
