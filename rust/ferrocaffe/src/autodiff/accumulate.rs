//! Gradient accumulation: when a blob version feeds several operators, the gradients their
//! gradient ops produce (the *generators*) are summed, exactly as Caffe2's IR did it.
//!
//! Dense gradients: every generating op output but the first is renamed
//! `_<name>_autosplit_<k>`, and one `Sum` writes the first name (in place: that name is swapped
//! to input 0). Sparse gradients: every generating op output is renamed and two `Concat` ops
//! (axis 0) join indices and values into `<base>_indices_concat` / `<base>_values_concat`.
//! The accumulation ops take the device option of the first generator and the
//! `is_auto_gen_sum_ops:1` tag.

use super::grad_ops::GradOpsAccess;
use super::maker::GradRef;
use super::scope::{int_arg, BackwardOptions};
use crate::device::DeviceType;
use crate::error::{Error, Result};
use crate::proto::{DeviceOption, OperatorDef};

/// Tag (in `DeviceOption.extra_info`, as `<tag>:1`) of the ops this module creates.
pub const IS_AUTO_GEN_SUM_OPS_TAG: &str = "is_auto_gen_sum_ops";
/// A generator whose device option carries `<tag>:1` makes the accumulation ops keep only
/// the `is_auto_gen_sum_ops` tag instead of copying the device option.
pub const ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG: &str = "only_keep_is_auto_gen_sum_ops_tag";

/// Where a gradient blob is written: `(index of the gradient op in the backward net, output
/// index)`.
pub type OpSlot = (usize, usize);

/// One source of the gradient of a blob version (Caffe2's `GradGenMeta` /
/// `SparseGradGenMeta`): a gradient op output, or a gradient passed straight through from an
/// output gradient (no op).
#[derive(Debug, Clone, PartialEq)]
pub enum Generator {
    /// A dense gradient.
    Dense {
        /// The op output that writes it, if an op does.
        op: Option<OpSlot>,
        /// The gradient blob's name as the maker gave it.
        gradient: String,
        /// The device option of the generating op (of the forward op for pass-through).
        device_option: DeviceOption,
    },
    /// A sparse gradient.
    Sparse {
        /// The op output that writes the indices, if an op does.
        indices_op: Option<OpSlot>,
        /// The op output that writes the values, if an op does.
        values_op: Option<OpSlot>,
        /// Indices blob as the maker gave it.
        indices: String,
        /// Values blob as the maker gave it.
        values: String,
        /// The device option of the generating op.
        device_option: DeviceOption,
    },
}

impl Generator {
    /// The generator's device option.
    pub fn device_option(&self) -> &DeviceOption {
        match self {
            Generator::Dense { device_option, .. } | Generator::Sparse { device_option, .. } => {
                device_option
            }
        }
    }

    fn is_sparse(&self) -> bool {
        matches!(self, Generator::Sparse { .. })
    }
}

/// Caffe2's `device_option_equal` (node name and random seed ignored): both CPU, or the same
/// device id.
pub fn device_option_equal(a: &DeviceOption, b: &DeviceOption) -> bool {
    let (ta, tb) = (
        DeviceType::of_option(Some(a)),
        DeviceType::of_option(Some(b)),
    );
    if ta == DeviceType::Cpu || tb == DeviceType::Cpu {
        return ta == tb;
    }
    a.device_id.unwrap_or(0) == b.device_id.unwrap_or(0)
}

/// Caffe2's `_VerifyGradientGenerators`: whether the generators of `input_name` need to be
/// summed; an error for a mix of sparse and dense gradients or different devices.
pub fn needs_sum(gens: &[Generator], input_name: &str) -> Result<bool> {
    let fail = |why: &str| {
        Err(Error::Runtime(format!(
            "Gradients for param ''{input_name}'' failed to verify: {why}"
        )))
    };
    let sparse = gens.iter().filter(|g| g.is_sparse()).count();
    if sparse != 0 && sparse != gens.len() {
        return fail(
            "Automatic aggregation of a mix of sparse and dense gradients is not supported yet",
        );
    }
    if gens.len() < 2 {
        return Ok(false);
    }
    let first = gens[0].device_option();
    if !gens[1..]
        .iter()
        .all(|g| device_option_equal(g.device_option(), first))
    {
        return fail("Unexpected behavior: not all grad ops have the same device option.");
    }
    Ok(true)
}

fn slot_name<O: GradOpsAccess + ?Sized>(ops: &O, (k, i): OpSlot) -> Result<String> {
    ops.op(k)
        .and_then(|op| op.output.get(i))
        .cloned()
        .ok_or_else(|| {
            Error::Runtime(format!(
                "gradient generator refers to output {i} of gradient op {k}, which does not exist"
            ))
        })
}

fn remove_suffix(s: String, suffix: &str) -> String {
    match s.strip_suffix(suffix) {
        Some(base) => base.to_string(),
        None => s,
    }
}

/// Caffe2's `_GetSumOpOutputName`.
fn sum_output_name<O: GradOpsAccess + ?Sized>(
    gens: &[Generator],
    ops: &O,
    input_name: &str,
) -> Result<String> {
    for g in gens {
        match g {
            Generator::Dense { op: Some(slot), .. } => return slot_name(ops, *slot),
            Generator::Sparse {
                indices_op,
                values_op,
                ..
            } => {
                if let Some(slot) = indices_op {
                    return Ok(remove_suffix(slot_name(ops, *slot)?, "_indices"));
                }
                if let Some(slot) = values_op {
                    return Ok(remove_suffix(slot_name(ops, *slot)?, "_values"));
                }
            }
            Generator::Dense { op: None, .. } => {}
        }
    }
    Ok(format!("{input_name}_grad"))
}

/// Renames output `idx` of gradient op `k` to `_<name>_autosplit_<cnt>` (inside the branch
/// nets too for an `If`); returns the new name and the next counter.
fn disambiguate<O: GradOpsAccess + ?Sized>(
    ops: &mut O,
    (k, idx): OpSlot,
    cnt: usize,
) -> Result<(String, usize)> {
    let old = slot_name(ops, (k, idx))?;
    let new = format!("_{old}_autosplit_{cnt}");
    let Some(op) = ops.op_mut(k) else {
        return Err(Error::Runtime(format!(
            "gradient generator refers to gradient op {k}, which cannot be changed"
        )));
    };
    if op.r#type() == "If" {
        rename_in_if_branches(op, &old, &new);
    }
    op.output[idx] = new.clone();
    Ok((new, cnt + 1))
}

/// Renames the outputs named `old` of the top-level ops of an `If` op's `then_net` and
/// `else_net` (the first argument of each name).
pub fn rename_in_if_branches(op: &mut OperatorDef, old: &str, new: &str) {
    for branch in ["then_net", "else_net"] {
        let arg = op.arg.iter_mut().find(|a| a.name() == branch);
        if let Some(net) = arg.and_then(|a| a.n.as_mut()) {
            for sub in &mut net.op {
                for o in &mut sub.output {
                    if o == old {
                        *o = new.to_string();
                    }
                }
            }
        }
    }
}

fn check_conflict(out_base: &str, g: &str) -> Result<()> {
    if out_base == g {
        return Err(Error::Runtime(
            "The gradient output of empty gradient op can not be the same as the normal name \
             of the current input gradient."
                .into(),
        ));
    }
    Ok(())
}

/// Caffe2's `_MakeSumOps`: the accumulation ops for the generators of one blob version and
/// the accumulated gradient. Renames generator outputs in `ops` (the backward net so far).
pub fn make_sum_ops<O: GradOpsAccess + ?Sized>(
    gens: &[Generator],
    input_name: &str,
    ops: &mut O,
    options: &BackwardOptions,
) -> Result<(Vec<OperatorDef>, GradRef)> {
    let out_base = sum_output_name(gens, ops, input_name)?;
    let (mut sum_ops, grad) = if gens.first().is_some_and(Generator::is_sparse) {
        sparse_sum(gens, &out_base, ops, options)?
    } else {
        dense_sum(gens, &out_base, ops, options)?
    };
    let only_keep_tag = format!("{ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG}:1");
    let only_keep = gens
        .iter()
        .any(|g| g.device_option().extra_info.contains(&only_keep_tag));
    let tag = format!("{IS_AUTO_GEN_SUM_OPS_TAG}:1");
    for op in &mut sum_ops {
        if only_keep {
            op.device_option
                .get_or_insert_with(DeviceOption::default)
                .extra_info
                .push(tag.clone());
        } else if let Some(first) = gens.first() {
            let mut d = first.device_option().clone();
            d.extra_info.push(tag.clone());
            op.device_option = Some(d);
        }
    }
    Ok((sum_ops, grad))
}

fn dense_sum<O: GradOpsAccess + ?Sized>(
    gens: &[Generator],
    out_base: &str,
    ops: &mut O,
    options: &BackwardOptions,
) -> Result<(Vec<OperatorDef>, GradRef)> {
    let mut inputs = Vec::with_capacity(gens.len());
    let mut cnt = 0;
    let mut first = true;
    for g in gens {
        if let Generator::Dense { op, gradient, .. } = g {
            match op {
                Some(slot) if first => {
                    first = false;
                    inputs.push(slot_name(ops, *slot)?);
                }
                Some(slot) => {
                    let (name, next) = disambiguate(ops, *slot, cnt)?;
                    cnt = next;
                    inputs.push(name);
                }
                None => {
                    check_conflict(out_base, gradient)?;
                    inputs.push(gradient.clone());
                }
            }
        }
    }
    if let Some(p) = inputs.iter().position(|x| x == out_base) {
        inputs.swap(0, p);
    }
    let sum = options.create_operator("Sum", inputs, vec![out_base.to_string()], vec![]);
    Ok((vec![sum], GradRef::Dense(out_base.to_string())))
}

fn sparse_sum<O: GradOpsAccess + ?Sized>(
    gens: &[Generator],
    out_base: &str,
    ops: &mut O,
    options: &BackwardOptions,
) -> Result<(Vec<OperatorDef>, GradRef)> {
    let mut ind_inputs = Vec::with_capacity(gens.len());
    let mut val_inputs = Vec::with_capacity(gens.len());
    let (mut cnt_i, mut cnt_v) = (0, 0);
    for g in gens {
        if let Generator::Sparse {
            indices_op,
            values_op,
            indices,
            values,
            ..
        } = g
        {
            match indices_op {
                Some(slot) => {
                    let (name, next) = disambiguate(ops, *slot, cnt_i)?;
                    cnt_i = next;
                    ind_inputs.push(name);
                }
                None => {
                    check_conflict(out_base, indices)?;
                    ind_inputs.push(indices.clone());
                }
            }
            match values_op {
                Some(slot) => {
                    let (name, next) = disambiguate(ops, *slot, cnt_v)?;
                    cnt_v = next;
                    val_inputs.push(name);
                }
                None => {
                    check_conflict(out_base, values)?;
                    val_inputs.push(values.clone());
                }
            }
        }
    }
    let ind_out = format!("{out_base}_indices_concat");
    let val_out = format!("{out_base}_values_concat");
    let concat = |inputs: Vec<String>, out: &str| {
        options.create_operator(
            "Concat",
            inputs,
            vec![out.to_string(), format!("{out}_split")],
            vec![int_arg("axis", 0)],
        )
    };
    let ops_out = vec![concat(ind_inputs, &ind_out), concat(val_inputs, &val_out)];
    Ok((
        ops_out,
        GradRef::Sparse {
            indices: ind_out,
            values: val_out,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(op: Option<OpSlot>, g: &str) -> Generator {
        Generator::Dense {
            op,
            gradient: g.into(),
            device_option: DeviceOption::default(),
        }
    }

    #[test]
    fn dense_sum_renames_all_but_the_first_and_swaps_in_place() -> Result<()> {
        let mut ops = vec![
            OperatorDef::new("ReluGradient", ["a", "a_grad"], ["x_grad"]),
            OperatorDef::new("SigmoidGradient", ["b", "b_grad"], ["x_grad"]),
        ];
        // Backward order: op 1 generated first.
        let gens = [dense(Some((1, 0)), "x_grad"), dense(Some((0, 0)), "x_grad")];
        assert!(needs_sum(&gens, "x")?);
        let (sum, g) = make_sum_ops(&gens, "x", &mut ops, &BackwardOptions::default())?;
        assert_eq!(g, GradRef::Dense("x_grad".into()));
        assert_eq!(ops[0].output[0], "_x_grad_autosplit_0");
        assert_eq!(ops[1].output[0], "x_grad");
        assert_eq!(sum[0].input, vec!["x_grad", "_x_grad_autosplit_0"]);
        assert_eq!(sum[0].output, vec!["x_grad"]);
        let d = sum[0].device_option.clone().unwrap_or_default();
        assert_eq!(d.extra_info, vec!["is_auto_gen_sum_ops:1"]);
        Ok(())
    }

    #[test]
    fn passthrough_equal_to_the_output_name_is_an_error() {
        let mut ops = vec![];
        let gens = [dense(None, "x_grad"), dense(None, "x_grad")];
        let err = make_sum_ops(&gens, "x", &mut ops, &BackwardOptions::default());
        assert!(matches!(err, Err(Error::Runtime(m)) if m.contains("empty gradient op")));
    }

    #[test]
    fn mixed_and_multi_device_generators_are_rejected() {
        let sparse = Generator::Sparse {
            indices_op: None,
            values_op: None,
            indices: "i".into(),
            values: "v".into(),
            device_option: DeviceOption::default(),
        };
        let err = needs_sum(&[dense(None, "g"), sparse], "emb");
        assert!(matches!(err, Err(Error::Runtime(m)) if m.contains("''emb''")));
        let gpu = |id| Generator::Dense {
            op: None,
            gradient: "g".into(),
            device_option: crate::device::Device::Cuda(id).to_option(),
        };
        assert!(needs_sum(&[gpu(0), gpu(0)], "w").is_ok());
        assert!(needs_sum(&[gpu(0), gpu(1)], "w").is_err());
        assert!(!needs_sum(&[gpu(0)], "w").unwrap_or(true));
    }

    #[test]
    fn sparse_sum_concats_and_renames_every_op_output() -> Result<()> {
        let mut ops = vec![OperatorDef::new(
            "X",
            Vec::<String>::new(),
            ["w_grad_indices", "w_grad_values"],
        )];
        let gens = [
            Generator::Sparse {
                indices_op: Some((0, 0)),
                values_op: Some((0, 1)),
                indices: "w_grad_indices".into(),
                values: "w_grad_values".into(),
                device_option: DeviceOption::default(),
            },
            Generator::Sparse {
                indices_op: None,
                values_op: None,
                indices: "ids".into(),
                values: "g".into(),
                device_option: DeviceOption::default(),
            },
        ];
        let (sum, g) = make_sum_ops(&gens, "w", &mut ops, &BackwardOptions::default())?;
        assert_eq!(
            ops[0].output,
            vec!["_w_grad_indices_autosplit_0", "_w_grad_values_autosplit_0"]
        );
        assert_eq!(sum.len(), 2);
        assert_eq!(
            sum[0].output,
            vec!["w_grad_indices_concat", "w_grad_indices_concat_split"]
        );
        assert_eq!(sum[1].input, vec!["_w_grad_values_autosplit_0", "g"]);
        assert_eq!(
            g,
            GradRef::Sparse {
                indices: "w_grad_indices_concat".into(),
                values: "w_grad_values_concat".into()
            }
        );
        Ok(())
    }
}
