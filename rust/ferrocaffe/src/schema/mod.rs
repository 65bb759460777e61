//! Operator schemas: the static facts about an operator type that can be checked without
//! running it (how many inputs and outputs, which may or must be computed in place).
//!
//! A layer of its own, below both the autodiff pass (which reads the in-place rules) and the
//! runtime (which checks every op against its schema when it is created); it depends only on
//! [`crate::proto`].

mod table;

use crate::bail;
use crate::error::Result;
use crate::proto::OperatorDef;

/// In-place pairs were recorded for input and output indices below this bound.
const INPLACE_PROBE_LIMIT: u32 = 6;

/// Static description of one operator type.
#[derive(Debug, Clone, Copy)]
pub struct OpSchema {
    /// Operator type name, e.g. `"FC"`.
    pub name: &'static str,
    /// Inclusive (min, max) number of inputs; `u32::MAX` means unbounded.
    pub inputs: (u32, u32),
    /// Inclusive (min, max) number of outputs; `u32::MAX` means unbounded.
    pub outputs: (u32, u32),
    /// When non-zero, bit `n` says whether exactly `n` inputs (n ≤ 6) are allowed, for ops whose
    /// allowed counts are not a contiguous range.
    pub input_count_mask: u8,
    /// Same as `input_count_mask`, for outputs.
    pub output_count_mask: u8,
    /// (input, output) index pairs that may share a blob.
    pub inplace_allowed: &'static [(u32, u32)],
    /// (input, output) index pairs that must share a blob.
    pub inplace_enforced: &'static [(u32, u32)],
    /// Documented input names.
    pub input_names: &'static [&'static str],
    /// Documented output names.
    pub output_names: &'static [&'static str],
    /// Documented argument names.
    pub args: &'static [&'static str],
    /// Whether the schema is marked private (internal helper op).
    pub private: bool,
}

impl OpSchema {
    /// A schema that accepts any number of inputs and outputs (types known by name only).
    pub const fn open(name: &'static str) -> Self {
        OpSchema {
            name,
            inputs: (0, u32::MAX),
            outputs: (0, u32::MAX),
            input_count_mask: 0,
            output_count_mask: 0,
            inplace_allowed: &[],
            inplace_enforced: &[],
            input_names: &[],
            output_names: &[],
            args: &[],
            private: false,
        }
    }

    /// Whether `input` and `output` may share a blob. The table was probed on indices below
    /// [`INPLACE_PROBE_LIMIT`]; a schema that allowed every probed pair (Caffe2's
    /// `AllowInplace` returning true, as for If/Do/While) allows the pairs past it too.
    fn inplace_ok(&self, input: u32, output: u32) -> bool {
        let pair = (input, output);
        if self.inplace_allowed.contains(&pair) || self.inplace_enforced.contains(&pair) {
            return true;
        }
        let n = INPLACE_PROBE_LIMIT;
        (input >= n || output >= n) && self.inplace_allowed.len() as u32 >= n * n
    }

    fn count_ok(n: usize, (lo, hi): (u32, u32), mask: u8) -> bool {
        if mask != 0 && n <= 6 {
            return mask & (1 << n) != 0;
        }
        n as u64 >= u64::from(lo) && n as u64 <= u64::from(hi)
    }

    /// Checks an operator definition against this schema: input/output counts and in-place
    /// rules. The error, an [`Error::Schema`](crate::error::Error::Schema), names the op and
    /// what was expected.
    pub fn verify(&self, op: &OperatorDef) -> Result<()> {
        let what = || format!("operator {} (type {})", op.name(), op.r#type());
        let (ni, no) = (op.input.len(), op.output.len());
        if !Self::count_ok(ni, self.inputs, self.input_count_mask) {
            bail!(Schema: "{}: {} inputs given, expected {}", what(), ni, range_text(self.inputs));
        }
        if !Self::count_ok(no, self.outputs, self.output_count_mask) {
            bail!(
                Schema: "{}: {} outputs given, expected {}",
                what(),
                no,
                range_text(self.outputs)
            );
        }
        for &(i, o) in self.inplace_enforced {
            if let (Some(a), Some(b)) = (op.input.get(i as usize), op.output.get(o as usize)) {
                if a != b {
                    bail!(
                        Schema: "{}: input {i} ('{a}') and output {o} ('{b}') must be the same \
                         blob (in-place op)",
                        what()
                    );
                }
            }
        }
        for (o, out) in op.output.iter().enumerate() {
            for (i, inp) in op.input.iter().enumerate() {
                if inp == out
                    && !self.inplace_ok(i as u32, o as u32)
                    && self.input_count_mask == 0
                    && self.inputs != (0, u32::MAX)
                {
                    bail!(
                        Schema: "{}: input {i} and output {o} are both '{out}', but this op \
                         cannot run in place",
                        what()
                    );
                }
            }
        }
        Ok(())
    }
}

fn range_text((lo, hi): (u32, u32)) -> String {
    match (lo, hi) {
        (lo, u32::MAX) => format!("at least {lo}"),
        (lo, hi) if lo == hi => format!("exactly {lo}"),
        (lo, hi) => format!("between {lo} and {hi}"),
    }
}

/// The schema of `op_type`, if the type is known.
pub fn lookup(op_type: &str) -> Option<&'static OpSchema> {
    let table = table::SCHEMAS;
    table
        .binary_search_by(|s| s.name.cmp(op_type))
        .ok()
        .map(|i| &table[i])
}

/// Every known operator type name, sorted.
pub fn registered_types() -> impl Iterator<Item = &'static str> {
    table::SCHEMAS.iter().map(|s| s.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        let names: Vec<_> = registered_types().collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn fc_needs_three_inputs() {
        let fc = lookup("FC").expect("FC is known");
        assert!(fc
            .verify(&OperatorDef::new("FC", ["x", "w", "b"], ["y"]))
            .is_ok());
        let err = fc
            .verify(&OperatorDef::new("FC", ["x", "w"], ["y"]))
            .unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::Schema);
        let err = err.to_string();
        assert!(err.contains("2 inputs given, expected exactly 3"), "{err}");
        assert!(lookup("NoSuchOp").is_none());
    }

    #[test]
    fn relu_may_run_in_place_fc_may_not() {
        let relu = lookup("Relu").expect("known");
        assert!(relu.verify(&OperatorDef::new("Relu", ["x"], ["x"])).is_ok());
        let fc = lookup("FC").expect("known");
        assert!(fc
            .verify(&OperatorDef::new("FC", ["x", "w", "b"], ["x"]))
            .is_err());
    }

    #[test]
    fn control_flow_ops_run_in_place_past_the_probed_indices() {
        // If/Do/While allow any in-place pair; the table lists the probed 6x6 square only.
        let mut ins: Vec<String> = (0..7).map(|i| format!("i{i}")).collect();
        ins[6] = "ws".into();
        let outs = ["y", "a", "b", "ws"];
        for t in ["If", "Do", "While"] {
            let op = OperatorDef::new(t, ins.clone(), outs);
            assert!(lookup(t).expect("known").verify(&op).is_ok(), "{t}");
        }
        // An op with specific pairs keeps rejecting the others.
        let fc = lookup("FC").expect("known");
        assert!(fc
            .verify(&OperatorDef::new("FC", ["x", "w", "b"], ["b"]))
            .is_err());
    }
}
