//! Save, Load, Checkpoint and DBExists: blobs to and from DB files ([`super::db`]) in Caffe2's
//! record format ([`crate::serialize`]).
//!
//! Relative DB names are resolved against the workspace root folder unless `absolute_path`.
//! Save and Load never lock their blobs for the whole run: they lock each blob while they
//! serialize or fill it.

use std::collections::{HashMap, HashSet};

use super::db;
use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::serialize::{self, load_record, BlobState, CHUNK_SEPARATOR};
use crate::workspace::Blob;
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("Save", |i| Ok(Box::new(Save::new(i, false)?)));
    r.cpu("Checkpoint", |i| Ok(Box::new(Save::new(i, true)?)));
    r.cpu("Load", |i| Ok(Box::new(Load::new(i)?)));
    r.cpu("DBExists", create_db_exists);
}

fn full_path(ctx: &OpContext<'_>, absolute: bool, name: &str) -> String {
    if absolute {
        name.to_string()
    } else {
        format!("{}/{name}", ctx.ws.root_folder())
    }
}

/// `name` with everything up to and including the first `prefix` removed.
fn strip(name: &str, prefix: &str) -> String {
    if prefix.is_empty() {
        return name.to_string();
    }
    match name.find(prefix) {
        Some(p) => name[p + prefix.len()..].to_string(),
        None => name.to_string(),
    }
}

/// Formats a Checkpoint pattern with the iteration (`%d`, `%ld`, `%lld`, `%i`).
fn format_iter(pattern: &str, it: i64) -> String {
    for spec in ["%lld", "%ld", "%d", "%i"] {
        if let Some(p) = pattern.find(spec) {
            return format!("{}{it}{}", &pattern[..p], &pattern[p + spec.len()..]);
        }
    }
    pattern.to_string()
}

struct Save {
    db: String,
    db_type: String,
    absolute: bool,
    names: Vec<String>,
    chunk_size: i64,
    checkpoint: Option<i64>,
}

impl Save {
    fn new(init: &OpInit<'_>, checkpoint: bool) -> Result<Save> {
        let a = &init.args;
        let strip_prefix = a.string("strip_prefix", "")?;
        let overrides = a.strings("blob_name_overrides")?;
        let db_type = a.string("db_type", "")?;
        if db_type.is_empty() {
            bail!(op = init, BadArgument: "Must specify a db type.");
        }
        let inputs = &init.def.input;
        if !overrides.is_empty() && overrides.len() != inputs.len() {
            bail!(op = init, BadArgument: "Number of blobs and blob_name_overrides mismatch.");
        }
        if !overrides.is_empty() && !strip_prefix.is_empty() {
            bail!(
                op = init,
                BadArgument: "strip_prefix and blob_name_overrides are mutually exclusive."
            );
        }
        let db = a.string("db", "")?;
        if db.is_empty() {
            let msg = if checkpoint {
                "Must specify a checkpoint file pattern."
            } else {
                "Must specify a db name."
            };
            bail!(op = init, BadArgument: msg);
        }
        let mut seen = HashSet::new();
        for n in inputs {
            if !seen.insert(n) {
                bail!(op = init, BadArgument: "Duplicated feature: {n}");
            }
        }
        let names = if overrides.is_empty() {
            inputs.iter().map(|n| strip(n, &strip_prefix)).collect()
        } else {
            overrides
        };
        let every = if checkpoint {
            let e = a.int("every", 1)?;
            if e <= 0 {
                bail!(op = init, BadArgument: "Checkpoint interval should be positive.");
            }
            Some(e)
        } else {
            None
        };
        Ok(Save {
            db,
            db_type,
            absolute: a.bool("absolute_path", false)?,
            names,
            chunk_size: a.int("chunk_size", serialize::DEFAULT_CHUNK_SIZE)?,
            checkpoint: every,
        })
    }
}

impl Operator for Save {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let mut db_name = self.db.clone();
        if let Some(every) = self.checkpoint {
            let it = {
                let t = ctx.input(0)?;
                let v = t.as_slice::<i64>().map_err(|_| {
                    err!(
                        DtypeMismatch: "Tensor type mismatch, caller expects elements to be long \
                         int, while tensor contains {}.",
                        t.dtype()
                    )
                })?;
                *v.first()
                    .ok_or_else(|| err!(ShapeMismatch: "the iteration input is empty"))?
            };
            if it % every != 0 {
                return Ok(());
            }
            db_name = format_iter(&self.db, it);
        }
        let path = full_path(ctx, self.absolute, &db_name);
        let mut w = db::Writer::create(&self.db_type, &path)?;
        let mut result = Ok(());
        'blobs: for (i, name) in self.names.iter().enumerate() {
            let recs = match serialize::serialize_blob(ctx.input_blob(i)?, name, self.chunk_size) {
                Ok(r) => r,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            for (k, v) in recs {
                if let Err(e) = w.put(&k, &v) {
                    result = Err(e);
                    break 'blobs;
                }
            }
        }
        // The file is written even when a blob failed (with what came before it).
        let closed = w.close();
        result.and(closed)
    }
}

struct Load {
    dbs: Vec<String>,
    db_type: String,
    absolute: bool,
    load_all: bool,
    allow_incomplete: bool,
    strip_prefix: String,
    add_prefix: String,
    /// Name in the DB -> output index.
    wanted: HashMap<String, usize>,
    has_sources: bool,
}

impl Load {
    fn new(init: &OpInit<'_>) -> Result<Load> {
        let a = &init.args;
        let db = a.string("db", "")?;
        let mut dbs = a.strings("dbs")?;
        if dbs.is_empty() {
            if db.is_empty() {
                bail!(op = init, BadArgument: "Must specify a db name.");
            }
            dbs.push(db);
        }
        let mut seen = HashSet::new();
        for d in &dbs {
            if !seen.insert(d) {
                bail!(op = init, BadArgument: "Duplicated db name: {d}");
            }
        }
        let load_all = a.bool("load_all", false)?;
        let strip_prefix = a.string("strip_prefix", "")?;
        let sources = a.strings("source_blob_names")?;
        let outputs = &init.def.output;
        if !sources.is_empty() {
            if load_all {
                bail!(op = init, BadArgument: "cannot load_all_ while using source_blob_names");
            }
            if !strip_prefix.is_empty() {
                bail!(
                    op = init,
                    BadArgument: "strip_prefix and source_blob_names are mutually exclusive"
                );
            }
            if sources.len() != outputs.len() {
                bail!(
                    op = init,
                    BadArgument: "Number of output blobs and source_blob_names mismatch."
                );
            }
        }
        let names = if sources.is_empty() {
            outputs.clone()
        } else {
            sources.clone()
        };
        let mut wanted = HashMap::new();
        if !load_all {
            for (i, n) in names.iter().enumerate() {
                if wanted.insert(n.clone(), i).is_some() {
                    bail!(op = init, BadArgument: "Duplicated source blob name: {n}");
                }
            }
        }
        Ok(Load {
            dbs,
            db_type: a.string("db_type", "")?,
            absolute: a.bool("absolute_path", false)?,
            load_all,
            allow_incomplete: a.bool("allow_incomplete", false)?,
            strip_prefix,
            add_prefix: a.string("add_prefix", "")?,
            wanted,
            has_sources: !sources.is_empty(),
        })
    }

    fn blob_name(&self, key: &str) -> String {
        let base = key.split(CHUNK_SEPARATOR).next().unwrap_or(key);
        format!("{}{}", self.add_prefix, strip(base, &self.strip_prefix))
    }
}

impl Operator for Load {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let n_out = ctx.num_outputs();
        let mut states: HashMap<String, BlobState> = HashMap::new();
        let mut key_db: HashMap<String, usize> = HashMap::new();
        let mut loaded = 0usize;
        for (db_id, name) in self.dbs.iter().enumerate() {
            let path = full_path(ctx, self.absolute, name);
            let mut reader = db::Reader::open(&self.db_type, &path)?;
            while let Some((key, value)) = reader.next_record()? {
                let key = self.blob_name(&key);
                if let Some(&other) = key_db.get(&key) {
                    if other != db_id {
                        bail!(Runtime: "Duplicate Key {key} is found!");
                    }
                }
                key_db.insert(key.clone(), db_id);
                if self.load_all {
                    let bp = crate::wire::blob(&value)
                        .ok_or_else(|| err!(Runtime: "Couldn't parse Proto"))?;
                    let h = ctx.ws.create_blob(&key);
                    let mut b = h.write();
                    if load_record(&mut b, &bp, &key, &mut states)? {
                        loaded += 1;
                    }
                    continue;
                }
                let Some(&j) = self.wanted.get(&key) else {
                    continue;
                };
                let bp = crate::wire::blob(&value)
                    .ok_or_else(|| err!(Runtime: "proto.ParseFromString(cursor->value())"))?;
                let h = ctx.output_handle(j).clone();
                let mut b = h.write();
                if load_record(&mut b, &bp, &key, &mut states)? {
                    loaded += 1;
                }
                if loaded == n_out {
                    break;
                }
            }
        }
        for (k, st) in &states {
            if st.current != st.total {
                bail!(
                    ShapeMismatch: "Data size mismatch for blob {k}. Expected: {} Read: {}",
                    st.total,
                    st.current
                );
            }
        }
        if self.load_all || loaded == n_out {
            return Ok(());
        }
        if self.allow_incomplete {
            if !self.has_sources {
                // Outputs that were not found and hold nothing do not stay behind.
                for (j, name) in ctx.def.output.iter().enumerate() {
                    let empty = matches!(*ctx.output_handle(j).read(), Blob::Empty);
                    if empty && !states.contains_key(name) {
                        ctx.ws.remove_blob(name);
                    }
                }
            }
            return Ok(());
        }
        Err(err!(MissingBlob: "Expected to load {n_out} blobs, got {loaded} only."))
    }

    fn locks_blobs(&self) -> bool {
        false
    }
}

fn create_db_exists(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let name = init.args.string("db_name", "")?;
    if name.is_empty() {
        bail!(op = init, BadArgument: "Must specify a db name.");
    }
    let absolute = init.args.bool("absolute_path", false)?;
    Ok(Box::new(crate::ops::operator::FnOp(
        move |ctx: &mut OpContext<'_>| {
            let path = full_path(ctx, absolute, &name);
            ctx.output(0)?.ensure::<bool>(&[])[0] = db::exists(&path);
            Ok(())
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_patterns() {
        assert_eq!(strip("gpu_0/w", "_0"), "/w");
        assert_eq!(strip("w", "_0"), "w");
        assert_eq!(format_iter("ckpt.%d.minidb", 4), "ckpt.4.minidb");
        assert_eq!(format_iter("plain", 4), "plain");
    }
}
