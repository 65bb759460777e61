//! Caffe2's registered net transforms (`workspace.ApplyTransform`): named rewrites of a
//! `NetDef` that keep what it computes and change how (which engine runs an op).
//!
//! * `ConvToNNPack`: every `Conv` on the CPU runs with engine `NNPACK` (kernels without that
//!   engine fall back to the default one, as in Caffe2).

use crate::error::Result;
use crate::proto::NetDef;

/// The names of the registered transforms.
pub const TRANSFORMS: [&str; 1] = ["ConvToNNPack"];

/// `net` rewritten by the transform registered as `name`; an unknown name is an error
/// naming the registered ones.
pub fn apply(name: &str, net: &NetDef) -> Result<NetDef> {
    let mut out = net.clone();
    match name {
        "ConvToNNPack" => {
            for op in &mut out.op {
                let on_cpu = op
                    .device_option
                    .as_ref()
                    .is_none_or(|d| d.device_type() == 0);
                if op.r#type() == "Conv" && on_cpu && op.engine() != "NNPACK" {
                    op.engine = Some("NNPACK".into());
                }
            }
        }
        _ => crate::bail!(
            Runtime: "no transform is registered as '{name}' (registered: {})",
            TRANSFORMS.join(", ")
        ),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::proto::{DeviceOption, OperatorDef};

    #[test]
    fn conv_to_nnpack_sets_the_engine_of_cpu_convs_only() {
        let mut net = NetDef::default();
        net.op.push(OperatorDef::new("Conv", ["x", "w"], ["y"]));
        net.op.push(OperatorDef::new("Relu", ["y"], ["y"]));
        let mut gpu = OperatorDef::new("Conv", ["x", "w"], ["z"]);
        gpu.device_option = Some(DeviceOption {
            device_type: Some(1),
            ..Default::default()
        });
        net.op.push(gpu);
        let mut cudnn = OperatorDef::new("Conv", ["x", "w"], ["u"]);
        cudnn.engine = Some("CUDNN".into());
        net.op.push(cudnn);
        let out = apply("ConvToNNPack", &net).unwrap();
        let engines: Vec<&str> = out.op.iter().map(|o| o.engine()).collect();
        assert_eq!(engines, ["NNPACK", "", "", "NNPACK"]);
        // The input is not changed.
        assert_eq!(net.op[0].engine(), "");
    }

    #[test]
    fn an_unknown_transform_is_refused() {
        let e = apply("not_a_transform", &NetDef::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Runtime);
        assert!(e.to_string().contains("not_a_transform"), "{e}");
        assert!(e.to_string().contains("ConvToNNPack"), "{e}");
    }
}
