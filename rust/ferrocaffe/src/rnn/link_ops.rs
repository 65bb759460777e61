//! The two internal ops that recurrent step nets get prepended:
//!
//! * `rnn_internal_apply_link(timestep, external) -> (internal, external)`, args `offset`,
//!   `window`: makes `internal` a view of rows `t + offset .. t + offset + window` of
//!   `external` (sharing its storage). `external` is also an output only so that dependency
//!   analyses see the link; the op does not change it.
//! * `rnn_internal_accumulate_gradient_input(timestep, og, g) -> g`, arg `offset`: adds row `t`
//!   of `og` to row `t + offset` of `g` (the gradient arriving from outside the recurrent op for
//!   the states it publishes, added to the state gradient flowing back through time).
//! * `rnn_internal_accumulate_param_gradient(g, step_g) -> g`: `g += step_g` (same shape), the
//!   per-step parameter gradient added into the total (Caffe2 appends a `Sum` for this; the
//!   result is the same, element by element).

use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::tensor::Tensor;
use crate::workspace::Blob;
use crate::{bail, err};

/// The timestep value held by a timestep blob (int32 or int64, one value).
pub fn timestep_value(t: &Tensor) -> Result<i64> {
    let v = t.to_i64_vec()?;
    v.first()
        .copied()
        .ok_or_else(|| err!(ShapeMismatch: "the timestep blob holds no value"))
}

/// Rows `start .. start + window` of `external` as a view, checking the bounds.
pub fn row_view(external: &Tensor, start: i64, window: i64) -> Result<Tensor> {
    let rows = external.dims().first().copied().unwrap_or(0);
    if external.numel() == 0 || rows == 0 {
        bail!(ShapeMismatch: "cannot link into an empty tensor of shape {:?}", external.dims());
    }
    if start < 0 || window < 0 || (start + window) as u64 > rows as u64 {
        bail!(
            ShapeMismatch: "link rows [{start}, {}) are outside a tensor of {rows} rows (shape \
             {:?})",
            start + window,
            external.dims()
        );
    }
    let row = external.numel() / rows;
    let mut dims = external.dims().to_vec();
    dims[0] = window as usize;
    external.view(start as usize * row, &dims)
}

struct ApplyLink {
    offset: i64,
    window: i64,
}

impl Operator for ApplyLink {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if ctx.is_inplace(0, 0) || ctx.is_inplace(1, 0) {
            bail!(op = ctx, Schema: "the linked blob must differ from the timestep and the buffer");
        }
        let t = timestep_value(ctx.input(0)?)?;
        let view = row_view(ctx.output(1)?, t + self.offset, self.window)?;
        *ctx.output_blob(0)? = Blob::Tensor(view);
        Ok(())
    }
}

/// Factory of `rnn_internal_apply_link`.
pub fn create_apply_link(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let offset = init.args.int("offset", -1)?;
    let window = init.args.int("window", -1)?;
    if offset < 0 {
        bail!(op = init, BadArgument: "offset not set");
    }
    if window < 0 {
        bail!(op = init, BadArgument: "window not set");
    }
    Ok(Box::new(ApplyLink { offset, window }))
}

struct AccumulateInputGradient {
    offset: i64,
}

impl Operator for AccumulateInputGradient {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (ins, mut outs) = ctx.split();
        let t = timestep_value(ins.tensor(0)?)?;
        let og = ins.tensor(1)?;
        let g = outs.tensor(0)?;
        let rows = g.dims().first().copied().unwrap_or(0);
        if rows == 0 {
            bail!(ShapeMismatch: "accumulation destination is empty");
        }
        let step = g.numel() / rows;
        let dst = (t + self.offset) as usize * step;
        let src = t as usize * step;
        if t < 0 || dst + step > g.numel() {
            bail!(ShapeMismatch: "Accumulation destination address over bounds");
        }
        if src + step > og.numel() {
            bail!(ShapeMismatch: "Accumulation source address out of bounds");
        }
        let from = &og.as_slice::<f32>()?[src..src + step];
        for (d, s) in g.as_mut_slice::<f32>()?[dst..dst + step]
            .iter_mut()
            .zip(from)
        {
            *d += *s;
        }
        Ok(())
    }
}

/// Factory of `rnn_internal_accumulate_gradient_input`.
pub fn create_accumulate_input_gradient(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let offset = init.args.int("offset", -1)?;
    if offset < 0 {
        bail!(op = init, BadArgument: "Offset not set");
    }
    Ok(Box::new(AccumulateInputGradient { offset }))
}

struct AccumulateParamGradient;

impl Operator for AccumulateParamGradient {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if !ctx.is_inplace(0, 0) || ctx.is_inplace(1, 0) {
            bail!(op = ctx, Schema: "expects (g, step_g) -> g with g in place");
        }
        let (ins, mut outs) = ctx.split();
        let step = ins.tensor(1)?;
        let g = outs.tensor(0)?;
        if g.dims() != step.dims() {
            bail!(
                ShapeMismatch: "parameter gradient of shape {:?} cannot take a step gradient of \
                 shape {:?}",
                g.dims(),
                step.dims()
            );
        }
        let src = step.as_slice::<f32>()?;
        for (d, s) in g.as_mut_slice::<f32>()?.iter_mut().zip(src) {
            *d += *s;
        }
        Ok(())
    }
}

/// Factory of `rnn_internal_accumulate_param_gradient`.
pub fn create_accumulate_param_gradient(_: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(AccumulateParamGradient))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Argument, OperatorDef};
    use crate::workspace::Workspace;

    fn with_args(mut op: OperatorDef, args: &[(&str, i64)]) -> OperatorDef {
        for (n, v) in args {
            op.arg.push(Argument {
                name: Some(n.to_string()),
                i: Some(*v),
                ..Default::default()
            });
        }
        op
    }

    #[test]
    fn apply_link_makes_a_view_and_checks_bounds() {
        let ws = Workspace::new();
        ws.feed("t", Tensor::from_vec(&[1], vec![1i32]).unwrap());
        ws.feed(
            "ext",
            Tensor::from_vec(&[3, 2], vec![0f32, 1., 2., 3., 4., 5.]).unwrap(),
        );
        let op = with_args(
            OperatorDef::new("rnn_internal_apply_link", ["t", "ext"], ["int", "ext"]),
            &[("offset", 1), ("window", 1)],
        );
        ws.run_operator_once(&op).unwrap();
        let h = ws.blob("int").unwrap();
        {
            let mut b = h.write();
            let v = b.tensor_mut();
            assert_eq!(v.dims(), &[1, 2]);
            v.as_mut_slice::<f32>().unwrap()[0] = 9.0;
        }
        assert_eq!(
            ws.fetch("ext").unwrap().as_slice::<f32>().unwrap(),
            &[0., 1., 2., 3., 9., 5.]
        );
        ws.feed("t", Tensor::from_vec(&[1], vec![2i32]).unwrap());
        let e = ws.run_operator_once(&op).unwrap_err().to_string();
        assert!(e.contains("outside a tensor of 3 rows"), "{e}");
        let bad = with_args(
            OperatorDef::new("rnn_internal_apply_link", ["t", "ext"], ["int", "ext"]),
            &[("window", 1)],
        );
        assert!(ws
            .run_operator_once(&bad)
            .unwrap_err()
            .to_string()
            .contains("offset not set"));
    }

    #[test]
    fn accumulate_adds_row_t_into_row_t_plus_offset() {
        let ws = Workspace::new();
        ws.feed("t", Tensor::from_vec(&[1], vec![0i32]).unwrap());
        ws.feed(
            "og",
            Tensor::from_vec(&[2, 1, 2], vec![1f32, 2., 3., 4.]).unwrap(),
        );
        ws.feed("g", Tensor::from_vec(&[3, 1, 2], vec![1f32; 6]).unwrap());
        let op = with_args(
            OperatorDef::new(
                "rnn_internal_accumulate_gradient_input",
                ["t", "og", "g"],
                ["g"],
            ),
            &[("offset", 1)],
        );
        ws.run_operator_once(&op).unwrap();
        assert_eq!(
            ws.fetch("g").unwrap().as_slice::<f32>().unwrap(),
            &[1., 1., 2., 3., 1., 1.]
        );
        ws.feed("t", Tensor::from_vec(&[1], vec![2i32]).unwrap());
        assert!(ws
            .run_operator_once(&op)
            .unwrap_err()
            .to_string()
            .contains("over bounds"));
    }
}
