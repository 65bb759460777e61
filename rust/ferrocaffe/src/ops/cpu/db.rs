//! The DB files of Save / Load: `minidb` (a sequence of records: key length and value length as
//! little-endian int32, then the key and value bytes; no header) and `protodb` (one serialized
//! `TensorProtos`, entries keyed by their name, written when the DB is closed).

use std::fs;
use std::io::Write;
use std::path::Path;

use prost::Message;

use crate::error::{Error, Result};
use crate::proto::{TensorProto, TensorProtos};

fn rt(msg: impl std::fmt::Display) -> Error {
    Error::Runtime(msg.to_string())
}

/// Checks that `db_type` is known.
pub fn check_type(db_type: &str, path: &str) -> Result<()> {
    match db_type {
        "minidb" | "protodb" => Ok(()),
        other => Err(rt(format!(
            "Cannot find db implementation of type {other} (while trying to open {path})"
        ))),
    }
}

/// A record reader over a DB file; records are read one at a time, so a file cut short still
/// yields the records before the cut.
pub struct Reader {
    data: Vec<u8>,
    pos: usize,
    protos: Option<std::vec::IntoIter<TensorProto>>,
    path: String,
}

impl Reader {
    /// Opens `path` as `db_type`.
    pub fn open(db_type: &str, path: &str) -> Result<Reader> {
        check_type(db_type, path)?;
        let data = fs::read(path).map_err(|e| rt(format!("Cannot open file: {path} ({e})")))?;
        let protos = if db_type == "protodb" {
            let p = TensorProtos::decode(data.as_slice())
                .map_err(|_| rt(format!("Cannot read protobuffer from {path}")))?;
            Some(p.protos.into_iter())
        } else {
            None
        };
        Ok(Reader {
            data,
            pos: 0,
            protos,
            path: path.to_string(),
        })
    }

    /// The next `(key, value)` record, or None at the end.
    pub fn next_record(&mut self) -> Result<Option<(String, Vec<u8>)>> {
        if let Some(it) = &mut self.protos {
            return Ok(it.next().map(|p| (p.name().to_string(), p.encode_to_vec())));
        }
        if self.pos >= self.data.len() {
            return Ok(None);
        }
        let truncated = || rt(format!("minidb file {} is truncated", self.path));
        let read_len = |at: usize| -> Result<usize> {
            let b = self.data.get(at..at + 4).ok_or_else(truncated)?;
            let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            usize::try_from(v).map_err(|_| rt(format!("negative record length in {}", self.path)))
        };
        let kl = read_len(self.pos)?;
        let vl = read_len(self.pos + 4)?;
        let start = self.pos + 8;
        let key = self.data.get(start..start + kl).ok_or_else(truncated)?;
        let value = self
            .data
            .get(start + kl..start + kl + vl)
            .ok_or_else(truncated)?;
        let rec = (String::from_utf8_lossy(key).into_owned(), value.to_vec());
        self.pos = start + kl + vl;
        Ok(Some(rec))
    }
}

/// Writes records to a new DB file (replacing an existing one).
pub struct Writer {
    db_type: String,
    path: String,
    buf: Vec<u8>,
    protos: TensorProtos,
}

impl Writer {
    /// A writer for `path` of `db_type`; nothing is written until [`close`](Self::close).
    pub fn create(db_type: &str, path: &str) -> Result<Writer> {
        check_type(db_type, path)?;
        Ok(Writer {
            db_type: db_type.to_string(),
            path: path.to_string(),
            buf: Vec::new(),
            protos: TensorProtos::default(),
        })
    }

    /// Adds one record.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        if self.db_type == "protodb" {
            let p = TensorProto::decode(value)
                .map_err(|_| rt("Cannot parse content from the value string"))?;
            let name = p.name().to_string();
            self.protos.protos.push(p);
            if name != key {
                return Err(rt(format!(
                    "Passed in key {key} does not equal to the tensor name {name}"
                )));
            }
            return Ok(());
        }
        let kl = i32::try_from(key.len()).map_err(|_| rt("key too long"))?;
        let vl = i32::try_from(value.len()).map_err(|_| rt("value too long"))?;
        self.buf.extend_from_slice(&kl.to_le_bytes());
        self.buf.extend_from_slice(&vl.to_le_bytes());
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.extend_from_slice(value);
        Ok(())
    }

    /// Writes the file (also after a failed `put`, as Caffe2's DBs do when closed).
    pub fn close(self) -> Result<()> {
        let bytes = if self.db_type == "protodb" {
            self.protos.encode_to_vec()
        } else {
            self.buf
        };
        let mut f = fs::File::create(&self.path)
            .map_err(|e| rt(format!("Cannot open file: {} ({e})", self.path)))?;
        f.write_all(&bytes)
            .map_err(|e| rt(format!("Cannot write {}: {e}", self.path)))
    }
}

/// Whether a DB file exists.
pub fn exists(path: &str) -> bool {
    Path::new(path).exists()
}
