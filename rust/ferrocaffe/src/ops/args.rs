//! Typed access to an operator's arguments, with Caffe2's rules (an int argument is read from
//! `i`, a float from `f`, a string from `s`, lists from `ints`/`floats`/`strings`) and errors
//! that name the op and the argument.

use crate::err;
use crate::error::{Error, Result};
use crate::proto::{Argument, NetDef, OperatorDef};

/// The arguments of one operator.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    def: &'a OperatorDef,
}

impl<'a> Args<'a> {
    /// Arguments of `def`.
    pub fn new(def: &'a OperatorDef) -> Self {
        Args { def }
    }

    /// The argument called `name` (the last one if repeated).
    pub fn get(&self, name: &str) -> Option<&'a Argument> {
        self.def.arg.iter().rev().find(|a| a.name() == name)
    }

    /// Whether the argument is present.
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn err(&self, name: &str, what: &str) -> Error {
        err!(
            BadArgument: "Argument {name} of operator {} (type {}) {what}",
            display_name(self.def),
            self.def.r#type()
        )
    }

    /// An integer argument (`i`), or `default` when absent.
    pub fn int(&self, name: &str, default: i64) -> Result<i64> {
        match self.get(name) {
            None => Ok(default),
            Some(a) => {
                a.i.ok_or_else(|| self.err(name, "does not have the right field: expected field i"))
            }
        }
    }

    /// An integer argument that must fit an `i32`.
    pub fn int32(&self, name: &str, default: i32) -> Result<i32> {
        let v = self.int(name, default as i64)?;
        i32::try_from(v).map_err(|_| self.err(name, &format!("value {v} does not fit int32")))
    }

    /// A non-negative integer argument as usize.
    pub fn usize(&self, name: &str, default: usize) -> Result<usize> {
        let v = self.int(name, default as i64)?;
        usize::try_from(v).map_err(|_| self.err(name, &format!("must not be negative, got {v}")))
    }

    /// A bool argument (`i`, non-zero is true).
    pub fn bool(&self, name: &str, default: bool) -> Result<bool> {
        Ok(self.int(name, default as i64)? != 0)
    }

    /// A float argument (`f`), or `default` when absent.
    pub fn float(&self, name: &str, default: f32) -> Result<f32> {
        match self.get(name) {
            None => Ok(default),
            Some(a) => {
                a.f.ok_or_else(|| self.err(name, "does not have the right field: expected field f"))
            }
        }
    }

    /// A float argument that may also be given as an int (`f` or `i`).
    pub fn number(&self, name: &str, default: f64) -> Result<f64> {
        match self.get(name) {
            None => Ok(default),
            Some(a) => match (a.f, a.i) {
                (Some(f), _) => Ok(f as f64),
                (None, Some(i)) => Ok(i as f64),
                _ => Err(self.err(name, "has neither field f nor field i")),
            },
        }
    }

    /// A string argument (`s`, UTF-8), or `default` when absent.
    pub fn string(&self, name: &str, default: &str) -> Result<String> {
        match self.get(name) {
            None => Ok(default.to_string()),
            Some(a) => match &a.s {
                Some(s) => {
                    String::from_utf8(s.clone()).map_err(|_| self.err(name, "is not valid UTF-8"))
                }
                None => Err(self.err(name, "does not have the right field: expected field s")),
            },
        }
    }

    /// An integer list (`ints`); empty when absent.
    pub fn ints(&self, name: &str) -> Vec<i64> {
        self.get(name).map(|a| a.ints.clone()).unwrap_or_default()
    }

    /// A list of non-negative integers as sizes (a shape); error on negatives.
    pub fn sizes(&self, name: &str) -> Result<Vec<usize>> {
        self.ints(name)
            .into_iter()
            .map(|v| {
                usize::try_from(v)
                    .map_err(|_| self.err(name, &format!("must not hold negative values, got {v}")))
            })
            .collect()
    }

    /// A float list (`floats`); empty when absent.
    pub fn floats(&self, name: &str) -> Vec<f32> {
        self.get(name).map(|a| a.floats.clone()).unwrap_or_default()
    }

    /// A byte-string list (`strings`); empty when absent.
    pub fn byte_strings(&self, name: &str) -> Vec<Vec<u8>> {
        self.get(name)
            .map(|a| a.strings.clone())
            .unwrap_or_default()
    }

    /// A string list (`strings`, UTF-8); empty when absent.
    pub fn strings(&self, name: &str) -> Result<Vec<String>> {
        self.byte_strings(name)
            .into_iter()
            .map(|s| String::from_utf8(s).map_err(|_| self.err(name, "is not valid UTF-8")))
            .collect()
    }

    /// A net argument (`n`).
    pub fn net(&self, name: &str) -> Option<&'a NetDef> {
        self.get(name).and_then(|a| a.n.as_ref())
    }
}

/// `name` of an op for messages (`''` quoted when empty).
pub fn display_name(def: &OperatorDef) -> String {
    format!("'{}'", def.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(name: &str) -> Argument {
        Argument {
            name: Some(name.into()),
            ..Default::default()
        }
    }

    #[test]
    fn typed_reads_follow_caffe2_fields() {
        let mut op = OperatorDef::new("ConstantFill", Vec::<String>::new(), ["y"]);
        op.arg.push(Argument {
            i: Some(3),
            ..arg("dtype")
        });
        op.arg.push(Argument {
            f: Some(1.5),
            ..arg("value")
        });
        op.arg.push(Argument {
            ints: vec![2, 3],
            ..arg("shape")
        });
        let a = Args::new(&op);
        assert_eq!(a.int("dtype", 1).unwrap(), 3);
        assert_eq!(a.int("missing", 7).unwrap(), 7);
        assert_eq!(a.float("value", 0.0).unwrap(), 1.5);
        assert_eq!(a.sizes("shape").unwrap(), vec![2, 3]);
        let e = a.int("value", 0).unwrap_err().to_string();
        assert!(
            e.contains("Argument value") && e.contains("ConstantFill"),
            "{e}"
        );
        assert!(a.float("dtype", 0.0).is_err());
        assert_eq!(a.number("dtype", 0.0).unwrap(), 3.0);
    }
}
