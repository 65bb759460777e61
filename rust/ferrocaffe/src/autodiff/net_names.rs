//! Names of the nets that gradient code creates (the condition nets of `While` gradients).
//!
//! Caffe2 gave every `core.Net` a process-wide unique name: the requested base name, or
//! `<base>_1`, `<base>_2`, ... when it was taken. The Python binding routes these requests to
//! `core.Net`'s own registry; Rust users get [`UsedNetNames`].

use std::collections::HashSet;

use crate::error::Result;

/// Hands out unique net names.
pub trait NetNames {
    /// A name not handed out before: `base` if free, else `base_1`, `base_2`, ...
    fn next_net_name(&mut self, base: &str) -> Result<String>;
}

/// A set of used net names with Caffe2's naming rule.
#[derive(Debug, Clone, Default)]
pub struct UsedNetNames {
    used: HashSet<String>,
}

impl UsedNetNames {
    /// No name used yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `name` was handed out (or marked used).
    pub fn contains(&self, name: &str) -> bool {
        self.used.contains(name)
    }

    /// Marks `name` as used.
    pub fn insert(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }
}

impl NetNames for UsedNetNames {
    fn next_net_name(&mut self, base: &str) -> Result<String> {
        let mut name = base.to_string();
        let mut k = 1;
        while self.used.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.used.insert(name.clone());
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_with_numeric_suffixes() -> Result<()> {
        let mut n = UsedNetNames::new();
        assert_eq!(n.next_net_name("net")?, "net");
        assert_eq!(n.next_net_name("net")?, "net_1");
        assert_eq!(n.next_net_name("net")?, "net_2");
        n.insert("other");
        assert_eq!(n.next_net_name("other")?, "other_1");
        assert!(n.contains("net_2"));
        Ok(())
    }
}
