//! Blob serialization as Caffe2 wrote it: a blob becomes one or more `BlobProto` records
//! (`type: "Tensor"` with a `TensorProto` chunk and its `segment`, or `type: "std::string"` with
//! `content`), and records are read back chunk by chunk.

use std::collections::HashMap;

use prost::Message;

use crate::device::DeviceType;
use crate::error::Result;
use crate::proto::{tensor_proto, BlobProto, DeviceOption, TensorProto};
use crate::tensor::{DataType, Tensor};
use crate::workspace::{Blob, Workspace};
use crate::{bail, err};

/// Separator between a blob name and its chunk index in DB keys.
pub const CHUNK_SEPARATOR: &str = "#%";

/// Default `chunk_size` of Save (values per record).
pub const DEFAULT_CHUNK_SIZE: i64 = 1_000_000;

/// The TensorProto of values `[begin, end)` of `t`, stored as `name`.
pub fn tensor_chunk(t: &Tensor, name: &str, begin: usize, end: usize) -> Result<TensorProto> {
    // A tensor on a device is serialized from a host copy (Caffe2 copies it to the CPU too).
    let full = t.to_host()?.to_proto(None);
    let mut p = TensorProto {
        dims: full.dims,
        data_type: full.data_type,
        name: Some(name.to_string()),
        device_detail: Some(DeviceOption {
            device_type: Some(DeviceType::Cpu.to_proto()),
            ..Default::default()
        }),
        segment: Some(tensor_proto::Segment {
            begin: begin as i64,
            end: end as i64,
        }),
        ..Default::default()
    };
    match t.dtype() {
        DataType::Float => {
            p.float_data = full.float_data[begin..end].to_vec();
            p.data_format = Some(0);
        }
        DataType::Double => p.double_data = full.double_data[begin..end].to_vec(),
        DataType::Int64 => p.int64_data = full.int64_data[begin..end].to_vec(),
        DataType::String => p.string_data = full.string_data[begin..end].to_vec(),
        _ => p.int32_data = full.int32_data[begin..end].to_vec(),
    }
    Ok(p)
}

/// `(key, serialized BlobProto)` records of a blob stored as `name`, `chunk_size` values per
/// record (`<= 0` or `>= n`: one record).
pub fn serialize_blob(blob: &Blob, name: &str, chunk_size: i64) -> Result<Vec<(String, Vec<u8>)>> {
    match blob {
        Blob::Tensor(t) => {
            let n = t.numel();
            let k = if chunk_size <= 0 || chunk_size as usize >= n {
                n.max(1)
            } else {
                chunk_size as usize
            };
            let mut out = Vec::new();
            let mut begin = 0;
            let mut i = 0;
            loop {
                let end = (begin + k).min(n);
                let bp = BlobProto {
                    name: Some(name.to_string()),
                    r#type: Some("Tensor".into()),
                    tensor: Some(tensor_chunk(t, name, begin, end)?),
                    ..Default::default()
                };
                out.push((format!("{name}{CHUNK_SEPARATOR}{i}"), bp.encode_to_vec()));
                i += 1;
                begin = end;
                if begin >= n {
                    break;
                }
            }
            Ok(out)
        }
        Blob::Bytes(b) => {
            let bp = BlobProto {
                name: Some(name.to_string()),
                r#type: Some("std::string".into()),
                content: Some(b.clone()),
                ..Default::default()
            };
            Ok(vec![(name.to_string(), bp.encode_to_vec())])
        }
        other => Err(err!(NotImplemented: "No known serializer for {}", other.caffe2_type_name())),
    }
}

impl Workspace {
    /// The BlobProto bytes of blob `name` (one record covering the whole blob).
    pub fn serialize_blob(&self, name: &str) -> Result<Vec<u8>> {
        let h = self.blob(name)?;
        let b = h.read();
        serialize_whole(&b, name)
    }

    /// Creates or replaces blob `name` from BlobProto bytes.
    pub fn deserialize_blob(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let mut fresh = Blob::Empty;
        deserialize_whole(&mut fresh, bytes)?;
        *self.create_blob(name).write() = fresh;
        Ok(())
    }
}

/// The whole blob as one BlobProto (workspace.SerializeBlob).
pub fn serialize_whole(blob: &Blob, name: &str) -> Result<Vec<u8>> {
    let mut recs = serialize_blob(blob, name, 0)?;
    Ok(recs.remove(0).1)
}

/// Writes a chunk (a tensor BlobProto) into `blob`, allocating the full tensor on first use.
/// Returns the number of values it covered.
pub fn deserialize_tensor_chunk(blob: &mut Blob, p: &TensorProto, fresh: bool) -> Result<usize> {
    let dtype = DataType::from_proto(p.data_type.unwrap_or(1) as i64)?;
    let dims: Vec<usize> = p
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| err!(Runtime: "negative dimension {d}")))
        .collect::<Result<_>>()?;
    let n: usize = dims.iter().product();
    let (begin, end) = match &p.segment {
        Some(s) => (s.begin, s.end),
        None => (0, n as i64),
    };
    if begin < 0 || end < begin || end as usize > n {
        bail!(Runtime: "bad segment [{begin}, {end}) for a tensor of {n} values");
    }
    let (begin, end) = (begin as usize, end as usize);
    let need_new = fresh
        || !matches!(blob, Blob::Tensor(t) if t.dtype() == dtype && t.dims() == dims.as_slice());
    if need_new {
        *blob = Blob::Tensor(Tensor::new(dtype, &dims));
    }
    // The chunk's values, as a tensor of shape [end - begin].
    let mut part = p.clone();
    part.dims = vec![(end - begin) as i64];
    part.segment = None;
    let chunk = Tensor::from_proto(&part)?;
    let t = blob.tensor_mut();
    if dtype == DataType::String {
        let src = chunk.as_strings()?.to_vec();
        t.as_strings_mut()?[begin..end].clone_from_slice(&src);
    } else {
        let w = dtype.item_size();
        t.bytes_mut()[begin * w..end * w].copy_from_slice(chunk.bytes());
    }
    Ok(end - begin)
}

/// Replaces `blob` by the value of one complete BlobProto (workspace.DeserializeBlob).
pub fn deserialize_whole(blob: &mut Blob, bytes: &[u8]) -> Result<()> {
    let bp = crate::wire::blob(bytes)
        .ok_or_else(|| err!(Runtime: "Cannot parse content into a BlobProto."))?;
    match bp.r#type.as_deref().unwrap_or("") {
        "Tensor" => {
            let t = bp
                .tensor
                .as_ref()
                .ok_or_else(|| err!(Runtime: "BlobProto of type Tensor has no tensor"))?;
            deserialize_tensor_chunk(blob, t, true)?;
            Ok(())
        }
        "std::string" => {
            *blob = Blob::Bytes(bp.content.clone().unwrap_or_default());
            Ok(())
        }
        other => Err(err!(NotImplemented: "No registered deserializer for type {other}")),
    }
}

/// Loading state of one blob across its chunks (Caffe2's `BlobState`).
#[derive(Debug, Clone, Copy, Default)]
pub struct BlobState {
    /// Values expected.
    pub total: usize,
    /// Values read so far.
    pub current: usize,
    /// Whether the blob is a tensor (several chunks allowed).
    pub is_tensor: bool,
}

/// Reads one record into `blob`, tracking chunks in `states`; returns true when the blob became
/// complete with this record.
pub fn load_record(
    blob: &mut Blob,
    bp: &BlobProto,
    key: &str,
    states: &mut HashMap<String, BlobState>,
) -> Result<bool> {
    let seen = states.contains_key(key);
    match bp.r#type.as_deref().unwrap_or("") {
        "Tensor" => {}
        "std::string" => {
            if seen {
                bail!(Runtime: "Blob duplicated: {key}");
            }
            *blob = Blob::Bytes(bp.content.clone().unwrap_or_default());
            states.insert(key.to_string(), BlobState::default());
            return Ok(true);
        }
        other => bail!(NotImplemented: "No registered deserializer for type {other}"),
    }
    let t = bp
        .tensor
        .as_ref()
        .ok_or_else(|| err!(Runtime: "BlobProto {key} of type Tensor has no tensor"))?;
    if let Some(st) = states.get(key) {
        if !st.is_tensor {
            bail!(Runtime: "Must be tensor {key}");
        }
        if st.current >= st.total {
            bail!(Runtime: "Found an extra part for an already filled tensor: {key}");
        }
        if t.segment.is_none() {
            bail!(Runtime: "Partial tensor must have a segment: {key}");
        }
    }
    let got = deserialize_tensor_chunk(blob, t, !seen)?;
    let st = states.entry(key.to_string()).or_insert_with(|| BlobState {
        total: t.dims.iter().product::<i64>().max(0) as usize,
        current: 0,
        is_tensor: true,
    });
    st.current += got;
    if st.current > st.total {
        bail!(Runtime: "Tensor parts are bigger than target size for tensor: {key}");
    }
    Ok(st.current == st.total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip() {
        let t = Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let recs = serialize_blob(&Blob::Tensor(t), "w", 4).unwrap();
        assert_eq!(
            recs.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
            vec!["w#%0", "w#%1"]
        );
        let mut states = HashMap::new();
        let mut blob = Blob::Empty;
        let mut done = false;
        for (_, bytes) in recs.iter().rev() {
            let bp = BlobProto::decode(bytes.as_slice()).unwrap();
            done = load_record(&mut blob, &bp, "w", &mut states).unwrap();
        }
        assert!(done);
        assert_eq!(
            blob.tensor().unwrap().as_slice::<f32>().unwrap(),
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
        let again = BlobProto::decode(recs[0].1.as_slice()).unwrap();
        let e = load_record(&mut blob, &again, "w", &mut states)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Found an extra part"), "{e}");
    }

    #[test]
    fn strings_and_empty_blobs() {
        let s = Blob::Bytes(b"abc".to_vec());
        let bytes = serialize_whole(&s, "s").unwrap();
        let mut b = Blob::Empty;
        deserialize_whole(&mut b, &bytes).unwrap();
        assert!(matches!(b, Blob::Bytes(ref v) if v == b"abc"));
        let e = serialize_blob(&Blob::Empty, "x", 0)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "No known serializer for nullptr (uninitialized)");
        let empty = Blob::Tensor(Tensor::new(DataType::Float, &[0, 3]));
        let recs = serialize_blob(&empty, "e", 0).unwrap();
        assert_eq!(recs.len(), 1);
        let mut b = Blob::Empty;
        deserialize_whole(&mut b, &recs[0].1).unwrap();
        assert_eq!(b.tensor().unwrap().dims(), &[0, 3]);
    }
}
