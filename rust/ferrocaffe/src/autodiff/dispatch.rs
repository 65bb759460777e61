//! Caffe2's `GradientRegistry.GetGradientForOp`: ask the native maker first; if there is none
//! or it fails, use the gradient function registered for the type; otherwise report
//! `Exception when creating gradient for [<type>]`.

use std::sync::Arc;

use super::maker::{GradRef, GradientContext, GradientMaker, GradientOutput};
use super::registry::{GradientKind, Registry};
use super::text;
use crate::error::{Error, Result};
use crate::proto::OperatorDef;
use crate::schema::{self, OpSchema};

/// The gradient operators and input gradients of `op` given the gradients of its outputs,
/// with Caffe2's dispatch between native makers and gradient functions.
pub fn gradient_for_op(
    op: &OperatorDef,
    g_output: &[GradRef],
    cx: &mut GradientContext<'_>,
) -> Result<GradientOutput> {
    let resolved = Resolved::new(cx.registry, op.r#type());
    gradient_for_op_resolved(op, &resolved, g_output, cx)
}

/// What the registry and the schemas hold for one op type, looked up once per type (a
/// backward pass asks for the same few types thousands of times).
pub(crate) struct Resolved {
    kind: Option<GradientKind>,
    function: Option<Arc<dyn GradientMaker>>,
    schema: Option<&'static OpSchema>,
}

impl Resolved {
    /// The registry's entries for `op_type` and its schema.
    pub(crate) fn new(registry: &Registry, op_type: &str) -> Self {
        Resolved {
            kind: registry.get(op_type).cloned(),
            function: registry.function(op_type).cloned(),
            schema: schema::lookup(op_type),
        }
    }

    /// Whether the type has a gradient function (which may call back into user code).
    pub(crate) fn has_function(&self) -> bool {
        self.function.is_some()
    }

    /// How the gradient may be made over ids: `Some(Some(maker))` with the native maker
    /// (which may still decline, see [`GradientMaker::make_interned`]), `Some(None)` for a
    /// type without gradient, `None` when only the named path applies.
    pub(crate) fn interned(&self) -> Option<Option<&dyn GradientMaker>> {
        match &self.kind {
            Some(GradientKind::Maker(m)) => Some(Some(m.as_ref())),
            Some(GradientKind::NoGradient) => Some(None),
            _ => None,
        }
    }

    /// The type's schema.
    pub(crate) fn schema(&self) -> Option<&'static OpSchema> {
        self.schema
    }
}

/// [`gradient_for_op`] with the registry entries and schema of `op`'s type looked up
/// beforehand (`resolved` must be [`Resolved::new`] of the context's registry and `op`'s
/// type).
pub(crate) fn gradient_for_op_resolved(
    op: &OperatorDef,
    resolved: &Resolved,
    g_output: &[GradRef],
    cx: &mut GradientContext<'_>,
) -> Result<GradientOutput> {
    let op_type = op.r#type();
    let native = match &resolved.kind {
        Some(kind) => match native_gradient(kind, resolved.schema, op, g_output, cx) {
            Ok(out) => return Ok(out),
            Err(reason) => reason,
        },
        None => format!(
            "GradientRegistry()->Has(def.type()) failed: no gradient is registered for \
             operator type {op_type}"
        ),
    };
    match &resolved.function {
        Some(f) => {
            let out = f.make_in(op, g_output, cx)?;
            if out.input_grads.len() > op.input.len() {
                return Err(Error::Type(format!(
                    "the gradient function of operator {op_type} returned {} input gradients \
                     for an operator with {} inputs",
                    out.input_grads.len(),
                    op.input.len()
                )));
            }
            Ok(out)
        }
        None => Err(Error::GradientMaker {
            op_type: op_type.to_string(),
            reason: native,
            op: text::op_text(op),
        }),
    }
}

/// Caffe2's C++ `GetGradientForOp`: the error is the reason only (the caller wraps it).
fn native_gradient(
    kind: &GradientKind,
    schema: Option<&'static OpSchema>,
    op: &OperatorDef,
    g_output: &[GradRef],
    cx: &mut GradientContext<'_>,
) -> std::result::Result<GradientOutput, String> {
    let op_type = op.r#type();
    match kind {
        GradientKind::ShouldNotDo => Err(format!(
            "One should not call gradient for operator {op_type}."
        )),
        GradientKind::NotImplemented => Err(format!(
            "Operator {op_type} should have a gradient but is not implemented yet."
        )),
        GradientKind::NoGradient => {
            verify_op(schema, op)?;
            Ok(GradientOutput {
                ops: Vec::new(),
                input_grads: vec![GradRef::None; op.input.len()],
            })
        }
        GradientKind::Maker(m) => {
            verify_op(schema, op)?;
            let wrapped: Vec<GradRef>;
            let g = if g_output.iter().any(needs_wrapping) {
                wrapped = g_output.iter().map(to_wrapper).collect();
                &wrapped[..]
            } else {
                g_output
            };
            let mut out = m.make_in(op, g, cx).map_err(|e| e.to_string())?;
            for g in &mut out.ops {
                g.is_gradient_op = Some(true);
            }
            if out.input_grads.len() != op.input.len() {
                return Err(format!(
                    "meta.g_input_.size() == def.input_size() failed: the maker returned {} \
                     input gradients for {} inputs",
                    out.input_grads.len(),
                    op.input.len()
                ));
            }
            for g in &mut out.input_grads {
                *g = from_wrapper(std::mem::take(g));
            }
            Ok(out)
        }
    }
}

/// Caffe2's `VerifyOp`: the forward op must pass its schema.
fn verify_op(
    schema: Option<&'static OpSchema>,
    op: &OperatorDef,
) -> std::result::Result<(), String> {
    match schema {
        Some(schema) if schema.verify(op).is_err() => Err(format!(
            "(GradientMaker) Operator def did not pass schema checking: {}",
            text::op_short(op)
        )),
        _ => Ok(()),
    }
}

fn needs_wrapping(g: &GradRef) -> bool {
    match g {
        GradRef::Dense(n) => n.is_empty() || (n.len() <= 8 && n.chars().count() == 2),
        GradRef::Sparse { indices, values } => indices.is_empty() && values.is_empty(),
        GradRef::None => false,
    }
}

/// How Caffe2's Python layer handed an output gradient to a C++ maker (`from_untyped`): a name
/// of exactly two characters unpacks as an `(indices, values)` pair, and an empty name is no
/// gradient.
pub fn to_wrapper(g: &GradRef) -> GradRef {
    match g {
        GradRef::Dense(n) if n.is_empty() => GradRef::None,
        GradRef::Dense(n) if n.chars().count() == 2 => {
            let mut cs = n.chars();
            let (a, b) = (cs.next(), cs.next());
            GradRef::Sparse {
                indices: a.map(String::from).unwrap_or_default(),
                values: b.map(String::from).unwrap_or_default(),
            }
        }
        other => from_wrapper(other.clone()),
    }
}

/// Caffe2's `to_untyped`: a C++ gradient with no name at all is no gradient.
fn from_wrapper(g: GradRef) -> GradRef {
    match g {
        GradRef::Dense(n) if n.is_empty() => GradRef::None,
        GradRef::Sparse { indices, values } if indices.is_empty() && values.is_empty() => {
            GradRef::None
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_character_names_become_slices() {
        assert_eq!(
            to_wrapper(&GradRef::Dense("dy".into())),
            GradRef::Sparse {
                indices: "d".into(),
                values: "y".into()
            }
        );
        assert_eq!(
            to_wrapper(&GradRef::Dense("y_grad".into())),
            GradRef::Dense("y_grad".into())
        );
        assert_eq!(
            to_wrapper(&GradRef::Dense("g".into())),
            GradRef::Dense("g".into())
        );
        assert_eq!(to_wrapper(&GradRef::Dense(String::new())), GradRef::None);
    }
}
