//! The DB files of Save / Load: `minidb` (a sequence of records: key length and value length as
//! little-endian int32, then the key and value bytes; no header) and `protodb` (one serialized
//! `TensorProtos`, entries keyed by their name, written when the DB is closed).

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::error::Result;
use crate::{bail, err};

/// Checks that `db_type` is known.
pub fn check_type(db_type: &str, path: &str) -> Result<()> {
    match db_type {
        "minidb" | "protodb" => Ok(()),
        other => Err(err!(
            NotImplemented: "Cannot find db implementation of type {other} (while trying to open \
             {path})"
        )),
    }
}

/// A record reader over a DB file; records are read one at a time, so a file cut short still
/// yields the records before the cut.
pub struct Reader {
    data: Vec<u8>,
    pos: usize,
    protos: Option<std::vec::IntoIter<(String, Vec<u8>)>>,
    path: String,
}

/// The raw entries of a protodb file (`TensorProtos.protos`), each with its name; None when the
/// file is not a TensorProtos.
fn protodb_entries(data: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let scan = crate::wire::scan_stream(data, &crate::wire::TENSORS);
    if !scan.ok {
        // Not binary: the text format, as the C++ runtime falls back to.
        let text = std::str::from_utf8(data).ok()?;
        let protos = crate::wire::text_tensors(text)?;
        return Some(
            protos
                .protos
                .into_iter()
                .map(|p| (p.name().to_string(), prost::Message::encode_to_vec(&p)))
                .collect(),
        );
    }
    // Entries are the `protos` fields of the part that parsed.
    let known = scan.known;
    let mut entries = Vec::new();
    let mut pos = 0;
    while pos < known.len() {
        let (field, wt, s, e) = crate::wire::next_field(&known, &mut pos)?;
        if field == 1 && wt == 2 {
            let raw = known[s..e].to_vec();
            let name = crate::wire::tensor(&raw)
                .map(|t| t.name().to_string())
                .unwrap_or_default();
            entries.push((name, raw));
        }
    }
    Some(entries)
}

impl Reader {
    /// Opens `path` as `db_type`.
    pub fn open(db_type: &str, path: &str) -> Result<Reader> {
        check_type(db_type, path)?;
        let data = fs::read(path).map_err(|e| err!(Runtime: "Cannot open file: {path} ({e})"))?;
        let protos = if db_type == "protodb" {
            let p = protodb_entries(&data)
                .ok_or_else(|| err!(Runtime: "Cannot read protobuffer. ({path})"))?;
            Some(p.into_iter())
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
            return Ok(it.next());
        }
        if self.pos >= self.data.len() {
            return Ok(None);
        }
        let truncated = || err!(Runtime: "minidb file {} is truncated", self.path);
        let read_len = |at: usize| -> Result<usize> {
            let b = self.data.get(at..at + 4).ok_or_else(truncated)?;
            let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            usize::try_from(v).map_err(|_| err!(Runtime: "negative record length in {}", self.path))
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
    /// protodb entries as the C++ runtime would write them back.
    protos: Vec<Vec<u8>>,
}

impl Writer {
    /// A writer for `path` of `db_type`; nothing is written until [`close`](Self::close).
    pub fn create(db_type: &str, path: &str) -> Result<Writer> {
        check_type(db_type, path)?;
        Ok(Writer {
            db_type: db_type.to_string(),
            path: path.to_string(),
            buf: Vec::new(),
            protos: Vec::new(),
        })
    }

    /// Adds one record.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        if self.db_type == "protodb" {
            // The entry is added first and keeps whatever parsed, as ProtoDB's does.
            let (p, bytes, ok) = crate::wire::tensor_round_trip(value);
            self.protos.push(bytes);
            if !ok {
                bail!(Runtime: "Cannot parse content from the value string");
            }
            let name = p.name().to_string();
            if name != key {
                bail!(Runtime: "Passed in key {key} does not equal to the tensor name {name}");
            }
            return Ok(());
        }
        let kl = i32::try_from(key.len()).map_err(|_| err!(Runtime: "key too long"))?;
        let vl = i32::try_from(value.len()).map_err(|_| err!(Runtime: "value too long"))?;
        self.buf.extend_from_slice(&kl.to_le_bytes());
        self.buf.extend_from_slice(&vl.to_le_bytes());
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.extend_from_slice(value);
        Ok(())
    }

    /// Writes the file (also after a failed `put`, as Caffe2's DBs do when closed).
    pub fn close(self) -> Result<()> {
        let bytes = if self.db_type == "protodb" {
            let mut out = Vec::new();
            for e in &self.protos {
                out.push(0x0a);
                let mut n = e.len() as u64;
                loop {
                    let byte = (n & 0x7f) as u8;
                    n >>= 7;
                    if n == 0 {
                        out.push(byte);
                        break;
                    }
                    out.push(byte | 0x80);
                }
                out.extend_from_slice(e);
            }
            out
        } else {
            self.buf
        };
        let mut f = fs::File::create(&self.path)
            .map_err(|e| err!(Runtime: "Cannot open file: {} ({e})", self.path))?;
        f.write_all(&bytes)
            .map_err(|e| err!(Runtime: "Cannot write {}: {e}", self.path))
    }
}

/// Whether a DB file exists.
pub fn exists(path: &str) -> bool {
    Path::new(path).exists()
}
