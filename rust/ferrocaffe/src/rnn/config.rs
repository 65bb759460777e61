//! The argument contract shared by `RecurrentNetwork` and `RecurrentNetworkGradient`: links,
//! aliases, recurrent states, step nets (NetDef or text), blob renames, and the link ops that
//! are prepended to a step net.

use crate::error::Result;
use crate::ops::operator::OpInit;
use crate::proto::{Argument, DeviceOption, NetDef, OperatorDef};
use crate::{bail, err};

/// Step blob `internal` is a view of rows `t + offset .. t + offset + window` of `external`.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// The blob name inside the step net.
    pub internal: String,
    /// The buffer in the op's workspace.
    pub external: String,
    /// Row offset relative to the timestep.
    pub offset: i64,
    /// Number of rows.
    pub window: i64,
}

impl Link {
    /// A link of `internal` to rows `t + offset .. t + offset + window` of `external`.
    pub fn new(internal: &str, external: &str, offset: i64, window: i64) -> Link {
        Link {
            internal: internal.into(),
            external: external.into(),
            offset,
            window,
        }
    }
}

/// Output `dst` is a view of `src` from row `offset` (negative: counted from the end) on.
#[derive(Debug, Clone, PartialEq)]
pub struct Alias {
    /// The buffer.
    pub src: String,
    /// The exposed blob.
    pub dst: String,
    /// First row (negative: from the end).
    pub offset: i64,
}

/// A recurrent state buffer and the op input holding its initial value.
#[derive(Debug, Clone, PartialEq)]
pub struct RecurrentInput {
    /// The state buffer (T + initial rows).
    pub state: String,
    /// The blob with the initial value(s).
    pub input: String,
}

/// The name `name` is renamed to by a `<name>.rename` argument (memonger, data parallel
/// models), or `name` itself.
pub fn remapped(init: &OpInit<'_>, name: &str) -> Result<String> {
    init.args.string(&format!("{name}.rename"), name)
}

/// The links described by the `internal`/`external`/`offset`/`window` arguments (window
/// defaults to 1), with renames applied.
pub fn links(
    init: &OpInit<'_>,
    internal: &str,
    external: &str,
    offset: &str,
    window: Option<&str>,
) -> Result<Vec<Link>> {
    let int = init.args.strings(internal)?;
    let ext = init.args.strings(external)?;
    let off = init.args.ints(offset);
    let win = match window {
        Some(w) if init.args.has(w) => init.args.ints(w),
        _ => vec![1; off.len()],
    };
    if int.len() != off.len() {
        bail!(
            op = init,
            BadArgument: "internal/offset mismatch: {internal} has {} names, {offset} has {} \
             values",
            int.len(),
            off.len()
        );
    }
    if ext.len() != off.len() {
        bail!(
            op = init,
            BadArgument: "external/offset mismatch: {external} has {} names, {offset} has {} \
             values",
            ext.len(),
            off.len()
        );
    }
    if win.len() != off.len() {
        bail!(
            op = init,
            BadArgument: "external/window mismatch: {external} has {} names, {} has {} values",
            ext.len(),
            window.unwrap_or("window"),
            win.len()
        );
    }
    let mut out = Vec::with_capacity(int.len());
    for k in 0..int.len() {
        if win[k] < 0 {
            bail!(op = init, BadArgument: "link window must not be negative, got {}", win[k]);
        }
        out.push(Link {
            internal: remapped(init, &int[k])?,
            external: remapped(init, &ext[k])?,
            offset: off[k],
            window: win[k],
        });
    }
    Ok(out)
}

/// The aliases of `alias_src`/`alias_dst`/`alias_offset`.
pub fn aliases(init: &OpInit<'_>) -> Result<Vec<Alias>> {
    let src = init.args.strings("alias_src")?;
    let dst = init.args.strings("alias_dst")?;
    let off = init.args.ints("alias_offset");
    if src.len() != dst.len() || src.len() != off.len() {
        bail!(
            op = init,
            BadArgument: "alias_src ({}), alias_dst ({}) and alias_offset ({}) must have the same \
             length",
            src.len(),
            dst.len(),
            off.len()
        );
    }
    Ok((0..src.len())
        .map(|k| Alias {
            src: src[k].clone(),
            dst: dst[k].clone(),
            offset: off[k],
        })
        .collect())
}

/// `recurrent_states` paired with the inputs named by `initial_recurrent_state_ids`.
pub fn recurrent_inputs(init: &OpInit<'_>) -> Result<Vec<RecurrentInput>> {
    let states = init.args.strings("recurrent_states")?;
    let ids = init.args.ints("initial_recurrent_state_ids");
    if states.len() != ids.len() {
        bail!(
            op = init,
            BadArgument: "states/inputs mismatch: recurrent_states has {} names, \
             initial_recurrent_state_ids {} values",
            states.len(),
            ids.len()
        );
    }
    states
        .into_iter()
        .zip(ids)
        .map(|(state, id)| {
            let input = usize::try_from(id)
                .ok()
                .and_then(|i| init.def.input.get(i))
                .ok_or_else(|| {
                    err!(
                        op = init,
                        BadArgument: "initial_recurrent_state_ids: input index {id} out of range \
                         ({} inputs)",
                        init.def.input.len()
                    )
                })?;
            Ok(RecurrentInput {
                state,
                input: input.clone(),
            })
        })
        .collect()
}

/// Whether argument `name` holds a net (a NetDef, or a non-empty text-format string).
pub fn has_net(init: &OpInit<'_>, name: &str) -> bool {
    match init.args.get(name) {
        Some(a) => a.n.is_some() || a.s.as_ref().is_some_and(|s| !s.is_empty()),
        None => false,
    }
}

/// The net in argument `name`: a NetDef (`n`) or a string in protobuf text format (`s`).
pub fn net_arg(init: &OpInit<'_>, name: &str) -> Result<Option<NetDef>> {
    let Some(a) = init.args.get(name) else {
        return Ok(None);
    };
    if let Some(n) = &a.n {
        return Ok(Some(n.clone()));
    }
    let text = init.args.string(name, "")?;
    if text.is_empty() {
        return Ok(None);
    }
    super::text::parse_net(&text)
        .map(Some)
        .map_err(|e| err!(op = init, BadArgument: "argument {name}: {e}"))
}

/// Renames every input and output `from` of the ops of `net` to `to`.
pub fn rename_in_net(net: &mut NetDef, from: &str, to: &str) {
    for op in &mut net.op {
        for name in op.input.iter_mut().chain(op.output.iter_mut()) {
            if name == from {
                *name = to.to_string();
            }
        }
    }
}

fn int_arg(name: &str, v: i64) -> Argument {
    Argument {
        name: Some(name.into()),
        i: Some(v),
        ..Default::default()
    }
}

/// Prepends one `rnn_internal_apply_link(timestep, external) -> (internal, external)` op per
/// link to `net` (in link order). An op whose first use of a linked blob is as an output gets
/// that blob as a control input, so dependency-driven nets order it after the link.
pub fn add_apply_link_ops(
    links: &[Link],
    timestep: &str,
    device: Option<&DeviceOption>,
    net: &mut NetDef,
) {
    let mut link_ops = Vec::with_capacity(links.len());
    for link in links {
        let mut op = OperatorDef::new(
            "rnn_internal_apply_link",
            [timestep, link.external.as_str()],
            [link.internal.as_str(), link.external.as_str()],
        );
        op.device_option = device.cloned();
        op.arg.push(int_arg("offset", link.offset));
        op.arg.push(int_arg("window", link.window));
        link_ops.push(op);
        for other in &mut net.op {
            if other.input.contains(&link.internal) {
                break;
            }
            if other.output.contains(&link.internal) {
                other.control_input.push(link.internal.clone());
                break;
            }
        }
    }
    link_ops.append(&mut net.op);
    net.op = link_ops;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_ops_come_first_and_mark_output_first_uses() {
        let mut net = NetDef::default();
        net.op.push(OperatorDef::new("FC", ["h_prev", "W"], ["y"]));
        net.op.push(OperatorDef::new("Tanh", ["y"], ["h_t"]));
        let links = vec![
            Link {
                internal: "h_prev".into(),
                external: "states".into(),
                offset: 0,
                window: 1,
            },
            Link {
                internal: "h_t".into(),
                external: "states".into(),
                offset: 1,
                window: 1,
            },
        ];
        add_apply_link_ops(&links, "timestep", None, &mut net);
        assert_eq!(net.op.len(), 4);
        assert_eq!(net.op[0].output, vec!["h_prev", "states"]);
        assert_eq!(net.op[1].input, vec!["timestep", "states"]);
        assert_eq!(net.op[1].arg[0].i, Some(1));
        assert!(net.op[2].control_input.is_empty());
        assert_eq!(net.op[3].control_input, vec!["h_t"]);
        rename_in_net(&mut net, "y", "z");
        assert_eq!(net.op[3].input, vec!["z"]);
    }
}
