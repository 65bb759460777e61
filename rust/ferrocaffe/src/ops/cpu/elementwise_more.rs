//! IsMemberOf (a bool per element: is it one of the `value` argument's values) and ScaleBlobs
//! (each of N inputs times `scale` into the matching output, in place allowed).

use std::collections::HashSet;

use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::DataType;
use crate::{bail, ensure};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("IsMemberOf", create_is_member_of);
    r.cpu("ScaleBlobs", create_scale_blobs);
}

fn create_is_member_of(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    if !init.args.has("value") {
        bail!(op = init, BadArgument: "IsMemberOf needs the 'value' argument (the set to test against)");
    }
    let ints: HashSet<i64> = init.args.ints("value").into_iter().collect();
    let strings: HashSet<Vec<u8>> = init.args.byte_strings("value").into_iter().collect();
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let x = ctx.input(0)?;
        let dims = x.dims().to_vec();
        let hits: Vec<bool> = match x.dtype() {
            DataType::Int32 => x
                .as_slice::<i32>()?
                .iter()
                .map(|&v| ints.contains(&i64::from(v)))
                .collect(),
            DataType::Int64 => x
                .as_slice::<i64>()?
                .iter()
                .map(|v| ints.contains(v))
                .collect(),
            DataType::Bool => x
                .as_slice::<bool>()?
                .iter()
                .map(|&v| ints.contains(&i64::from(v)))
                .collect(),
            DataType::String => x
                .as_strings()?
                .iter()
                .map(|v| strings.contains(v))
                .collect(),
            other => bail!(
                op = ctx,
                DtypeMismatch: "IsMemberOf takes int32, int64, bool or string input, got {other}"
            ),
        };
        ctx.output(0)?.ensure::<bool>(&dims).copy_from_slice(&hits);
        Ok(())
    })))
}

fn create_scale_blobs(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let scale = init.args.float("scale", 1.0)?;
    let (ni, no) = (init.num_inputs(), init.num_outputs());
    ensure!(
        ni > 0 && ni == no,
        op = init,
        Schema: "ScaleBlobs needs as many outputs as inputs (at least one), got {ni} inputs and \
         {no} outputs"
    );
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        for i in 0..ctx.num_inputs() {
            let x = ctx.input(i)?;
            let dims = x.dims().to_vec();
            let scaled: Vec<f32> = x.as_slice::<f32>()?.iter().map(|v| v * scale).collect();
            ctx.output(i)?.ensure::<f32>(&dims).copy_from_slice(&scaled);
        }
        Ok(())
    })))
}

#[cfg(test)]
mod tests {
    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::Tensor;
    use crate::workspace::Workspace;

    #[test]
    fn is_member_of_ints_and_missing_value() {
        let ws = Workspace::new();
        ws.feed("X", Tensor::from_vec(&[4], vec![0i64, 3, 5, 8]).unwrap());
        let mut op = OperatorDef::new("IsMemberOf", ["X"], ["Y"]);
        op.arg.push(Argument {
            name: Some("value".into()),
            ints: vec![0, 3, 4],
            ..Default::default()
        });
        ws.run_operator_once(&op).unwrap();
        assert_eq!(
            ws.fetch("Y").unwrap().as_slice::<bool>().unwrap(),
            &[true, true, false, false]
        );
        let e = ws
            .run_operator_once(&OperatorDef::new("IsMemberOf", ["X"], ["Y"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'value'"), "{e}");
    }

    #[test]
    fn scale_blobs_scales_each_input_in_place_too() {
        let ws = Workspace::new();
        ws.feed("A", Tensor::from_vec(&[2], vec![1.0f32, -2.0]).unwrap());
        ws.feed("B", Tensor::from_vec(&[1], vec![4.0f32]).unwrap());
        let mut op = OperatorDef::new("ScaleBlobs", ["A", "B"], ["A", "C"]);
        op.arg.push(Argument::float("scale", 0.5));
        ws.run_operator_once(&op).unwrap();
        assert_eq!(
            ws.fetch("A").unwrap().as_slice::<f32>().unwrap(),
            &[0.5, -1.0]
        );
        assert_eq!(ws.fetch("C").unwrap().as_slice::<f32>().unwrap(), &[2.0]);
        let bad = OperatorDef::new("ScaleBlobs", ["A", "B"], ["A"]);
        assert!(ws.run_operator_once(&bad).is_err());
    }
}
