//! Protobuf text format of operators, as Caffe2's error messages show them: `str(op)` in Python
//! (multi-line, fields in field-number order) and `ProtoDebugString` in C++ (one line).

use std::fmt::Display;

use crate::proto::{
    tensor_proto, Argument, DeviceOption, NetDef, OperatorDef, QTensorProto, TensorProto,
};

/// `str(op)` in Python: multi-line text format, each field on its own line.
pub fn op_text(op: &OperatorDef) -> String {
    let mut p = Printer::new(false);
    p.op(op);
    p.out
}

/// C++ `ProtoDebugString`/`ShortDebugString`: the whole operator on one line.
pub fn op_short(op: &OperatorDef) -> String {
    let mut p = Printer::new(true);
    p.op(op);
    p.out.trim_end().to_string()
}

/// `str(device_option)` in Python.
pub fn device_text(d: &DeviceOption) -> String {
    let mut p = Printer::new(false);
    p.device(d);
    p.out
}

struct Printer {
    out: String,
    indent: usize,
    short: bool,
}

impl Printer {
    fn new(short: bool) -> Self {
        Printer {
            out: String::new(),
            indent: 0,
            short,
        }
    }

    fn start_line(&mut self) {
        if !self.short {
            for _ in 0..self.indent {
                self.out.push(' ');
            }
        }
    }

    fn end_line(&mut self) {
        self.out.push(if self.short { ' ' } else { '\n' });
    }

    fn raw(&mut self, name: &str, value: impl Display) {
        self.start_line();
        self.out.push_str(name);
        self.out.push_str(": ");
        self.out.push_str(&value.to_string());
        self.end_line();
    }

    fn bytes(&mut self, name: &str, value: &[u8]) {
        self.start_line();
        self.out.push_str(name);
        self.out.push_str(": \"");
        escape_into(&mut self.out, value);
        self.out.push('"');
        self.end_line();
    }

    fn string(&mut self, name: &str, value: &str) {
        self.bytes(name, value.as_bytes());
    }

    fn opt_string(&mut self, name: &str, value: &Option<String>) {
        if let Some(v) = value {
            self.string(name, v);
        }
    }

    fn opt_num<T: Display + Copy>(&mut self, name: &str, value: Option<T>) {
        if let Some(v) = value {
            self.raw(name, v);
        }
    }

    fn float(&mut self, name: &str, value: f32) {
        self.raw(
            name,
            py_float_repr(format!("{value:e}"), value.is_finite(), value),
        );
    }

    fn double(&mut self, name: &str, value: f64) {
        self.raw(
            name,
            py_float_repr(format!("{value:e}"), value.is_finite(), value as f32),
        );
    }

    fn message(&mut self, name: &str, body: impl FnOnce(&mut Self)) {
        self.start_line();
        self.out.push_str(name);
        self.out.push_str(" {");
        self.end_line();
        self.indent += 2;
        body(self);
        self.indent -= 2;
        self.start_line();
        self.out.push('}');
        self.end_line();
    }

    fn op(&mut self, op: &OperatorDef) {
        for i in &op.input {
            self.string("input", i);
        }
        for o in &op.output {
            self.string("output", o);
        }
        self.opt_string("name", &op.name);
        self.opt_string("type", &op.r#type);
        for a in &op.arg {
            self.message("arg", |p| p.arg(a));
        }
        if let Some(d) = &op.device_option {
            self.message("device_option", |p| p.device(d));
        }
        self.opt_string("engine", &op.engine);
        for c in &op.control_input {
            self.string("control_input", c);
        }
        if let Some(g) = op.is_gradient_op {
            self.raw("is_gradient_op", g);
        }
        self.opt_string("debug_info", &op.debug_info);
        self.opt_string("domain", &op.domain);
        self.opt_num("op_version", op.op_version);
    }

    fn arg(&mut self, a: &Argument) {
        self.opt_string("name", &a.name);
        if let Some(f) = a.f {
            self.float("f", f);
        }
        self.opt_num("i", a.i);
        if let Some(s) = &a.s {
            self.bytes("s", s);
        }
        for f in &a.floats {
            self.float("floats", *f);
        }
        for i in &a.ints {
            self.raw("ints", i);
        }
        for s in &a.strings {
            self.bytes("strings", s);
        }
        if let Some(n) = &a.n {
            self.message("n", |p| p.net(n));
        }
        for n in &a.nets {
            self.message("nets", |p| p.net(n));
        }
        if let Some(t) = &a.t {
            self.message("t", |p| p.tensor(t));
        }
        for t in &a.tensors {
            self.message("tensors", |p| p.tensor(t));
        }
        for q in &a.qtensors {
            self.message("qtensors", |p| p.qtensor(q));
        }
    }

    fn device(&mut self, d: &DeviceOption) {
        self.opt_num("device_type", d.device_type);
        self.opt_num("device_id", d.device_id);
        self.opt_num("random_seed", d.random_seed);
        self.opt_string("node_name", &d.node_name);
        self.opt_num("numa_node_id", d.numa_node_id);
        for e in &d.extra_info {
            self.string("extra_info", e);
        }
    }

    fn net(&mut self, n: &NetDef) {
        self.opt_string("name", &n.name);
        for op in &n.op {
            self.message("op", |p| p.op(op));
        }
        self.opt_string("type", &n.r#type);
        self.opt_num("num_workers", n.num_workers);
        if let Some(d) = &n.device_option {
            self.message("device_option", |p| p.device(d));
        }
        for a in &n.arg {
            self.message("arg", |p| p.arg(a));
        }
        for i in &n.external_input {
            self.string("external_input", i);
        }
        for o in &n.external_output {
            self.string("external_output", o);
        }
        for pi in &n.partition_info {
            self.message("partition_info", |p| {
                p.string("name", &pi.name);
                for d in &pi.device_id {
                    p.raw("device_id", d);
                }
                p.opt_string("extra_info", &pi.extra_info);
            });
        }
    }

    fn tensor(&mut self, t: &TensorProto) {
        for d in &t.dims {
            self.raw("dims", d);
        }
        if let Some(dt) = t.data_type {
            self.raw("data_type", data_type_name(dt));
        }
        for f in &t.float_data {
            self.float("float_data", *f);
        }
        for i in &t.int32_data {
            self.raw("int32_data", i);
        }
        if let Some(b) = &t.byte_data {
            self.bytes("byte_data", b);
        }
        for s in &t.string_data {
            self.bytes("string_data", s);
        }
        self.opt_string("name", &t.name);
        if let Some(d) = &t.device_detail {
            self.message("device_detail", |p| p.device(d));
        }
        for d in &t.double_data {
            self.double("double_data", *d);
        }
        for i in &t.int64_data {
            self.raw("int64_data", i);
        }
        if let Some(s) = &t.segment {
            self.message("segment", |p| {
                p.raw("begin", s.begin);
                p.raw("end", s.end);
            });
        }
        if let Some(r) = &t.raw_data {
            self.bytes("raw_data", r);
        }
        self.opt_num("data_format", t.data_format);
    }

    fn qtensor(&mut self, q: &QTensorProto) {
        for d in &q.dims {
            self.raw("dims", d);
        }
        self.raw("precision", q.precision);
        self.double("scale", q.scale);
        self.double("bias", q.bias);
        self.raw("is_signed", q.is_signed);
        for d in &q.data {
            self.raw("data", d);
        }
        self.opt_string("name", &q.name);
    }
}

fn data_type_name(dt: i32) -> String {
    tensor_proto::DataType::try_from(dt)
        .map(|d| d.as_str_name().to_string())
        .unwrap_or_else(|_| dt.to_string())
}

/// C-style escaping as Python's text format does it: quotes, backslash and control characters
/// escaped, every byte outside printable ASCII as a 3-digit octal escape.
fn escape_into(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            b'"' => out.push_str("\\\""),
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\{b:03o}")),
        }
    }
}

/// Python's `repr` of a float, from Rust's shortest `{:e}` form (`1.5e-5` -> `1.5e-05`,
/// `1e0` -> `1.0`): fixed notation for exponents in [-4, 16), scientific otherwise.
fn py_float_repr(sci: String, finite: bool, value: f32) -> String {
    if !finite {
        return if value.is_nan() {
            "nan".into()
        } else if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!(
                "{sign}{digits}{}.0",
                "0".repeat(point as usize - digits.len())
            )
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{sign}{a}.{b}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Argument;

    fn f(x: f32) -> String {
        py_float_repr(format!("{x:e}"), x.is_finite(), x)
    }

    #[test]
    fn floats_print_like_python() {
        assert_eq!(f(1.0), "1.0");
        assert_eq!(f(0.0), "0.0");
        assert_eq!(f(-2.5), "-2.5");
        assert_eq!(f(0.1), "0.1");
        assert_eq!(f(1e-5), "1e-05");
        assert_eq!(f(1.5e-5), "1.5e-05");
        assert_eq!(f(0.0001), "0.0001");
        assert_eq!(f(123456792.0), "123456790.0");
        assert_eq!(f(1e16), "1e+16");
        assert_eq!(f(f32::INFINITY), "inf");
    }

    #[test]
    fn operator_text_matches_python_layout() {
        let mut op = OperatorDef::new("ConstantFill", ["loss"], ["loss_autogen_grad"]);
        op.name = Some(String::new());
        op.arg.push(Argument {
            name: Some("value".into()),
            f: Some(1.0),
            ..Default::default()
        });
        op.device_option = Some(DeviceOption {
            extra_info: vec!["is_auto_gen_sum_ops:1".into()],
            ..Default::default()
        });
        assert_eq!(
            op_text(&op),
            "input: \"loss\"\noutput: \"loss_autogen_grad\"\nname: \"\"\ntype: \"ConstantFill\"\n\
             arg {\n  name: \"value\"\n  f: 1.0\n}\ndevice_option {\n  extra_info: \
             \"is_auto_gen_sum_ops:1\"\n}\n"
        );
        assert_eq!(
            op_short(&op),
            "input: \"loss\" output: \"loss_autogen_grad\" name: \"\" type: \"ConstantFill\" \
             arg { name: \"value\" f: 1.0 } device_option { extra_info: \"is_auto_gen_sum_ops:1\" }"
        );
    }

    #[test]
    fn strings_are_c_escaped() {
        let mut s = String::new();
        escape_into(&mut s, "a\"b\\c\n\u{e9}\u{1}".as_bytes());
        assert_eq!(s, "a\\\"b\\\\c\\n\\303\\251\\001");
    }
}
