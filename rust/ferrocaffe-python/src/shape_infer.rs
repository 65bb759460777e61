//! Static shape/type inference and operator cost (`workspace.InferShapesAndTypes`,
//! `workspace.GetOperatorCost`): conversions only, the rules live in `ferrocaffe::shape_infer`.

use std::collections::{BTreeMap, HashMap};

use ferrocaffe::proto::{decode, NetDef, OperatorDef};
use ferrocaffe::shape_infer::{self, BlobShape};
use pyo3::prelude::*;

use crate::errors::{detach_guarded, guard, IntoPy};
use crate::workspace::PyWorkspace;

/// One inferred blob: name, dims, `TensorProto.DataType`.
type Known = (String, Vec<i64>, i32);

fn decode_nets(nets: &[Vec<u8>]) -> PyResult<Vec<NetDef>> {
    nets.iter().map(|b| decode::<NetDef>(b).py()).collect()
}

fn known_only(all: BTreeMap<String, BlobShape>) -> Vec<Known> {
    all.into_iter()
        .filter(|(_, s)| !s.unknown)
        .map(|(n, s)| (n, s.dims, s.dtype))
        .collect()
}

/// Infers shapes and types over serialized nets, starting from the blobs of `workspace`, or
/// from `dims` (name -> dims) and `types` (name -> dtype, FLOAT where absent) when given.
/// Returns the blobs whose shape is known as `(name, dims, dtype)`.
#[pyfunction]
#[pyo3(signature = (nets, workspace=None, dims=None, types=None))]
fn infer_shapes_and_types(
    py: Python<'_>,
    nets: Vec<Vec<u8>>,
    workspace: Option<&PyWorkspace>,
    dims: Option<HashMap<String, Vec<i64>>>,
    types: Option<HashMap<String, i32>>,
) -> PyResult<Vec<Known>> {
    guard("infer_shapes_and_types", || {
        let nets = decode_nets(&nets)?;
        let ws = workspace.map(|w| w.ws.clone());
        detach_guarded(py, "infer_shapes_and_types", move || {
            let start: BTreeMap<String, BlobShape> = match (dims, ws) {
                (Some(dims), _) => {
                    let types = types.unwrap_or_default();
                    dims.into_iter()
                        .map(|(n, d)| {
                            let t = types.get(&n).copied().unwrap_or(shape_infer::dtype::FLOAT);
                            (n, BlobShape::new(d, t))
                        })
                        .collect()
                }
                (None, Some(ws)) => shape_infer::workspace_shapes(&ws),
                (None, None) => BTreeMap::new(),
            };
            known_only(shape_infer::infer(&nets, start))
        })
    })
}

/// `(flops, bytes_written, bytes_read)` of a serialized operator whose input shapes are those
/// of the workspace blobs `blobs`.
#[pyfunction]
fn get_operator_cost(
    py: Python<'_>,
    workspace: &PyWorkspace,
    op: Vec<u8>,
    blobs: Vec<String>,
) -> PyResult<(u64, u64, u64)> {
    guard("get_operator_cost", || {
        let op = decode::<OperatorDef>(&op).py()?;
        let ws = workspace.ws.clone();
        let cost = detach_guarded(py, "get_operator_cost", move || {
            let ins: Vec<BlobShape> = blobs
                .iter()
                .map(|b| {
                    ws.get_blob(b)
                        .map(|h| shape_infer::describe_blob(&h.read()))
                        .unwrap_or_else(BlobShape::unknown)
                })
                .collect();
            shape_infer::operator_cost(&op, &ins)
        })?
        .py()?;
        Ok((cost.flops, cost.bytes_written, cost.bytes_read))
    })
}

/// Adds this file's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(infer_shapes_and_types, m)?)?;
    m.add_function(wrap_pyfunction!(get_operator_cost, m)?)?;
    Ok(())
}
