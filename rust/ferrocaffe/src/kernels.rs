//! The global operator registry: every CPU kernel family ([`crate::ops::cpu`]) and every op
//! that runs nets ([`crate::net::control`]) registers here. It sits above `ops/` and `net/` so
//! that neither imports the other for registration.

use std::sync::OnceLock;

use crate::ops::registry::Registry;

/// The registry used by every workspace.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::new();
        crate::ops::cpu::register_all(&mut r);
        crate::net::control::register(&mut r);
        crate::rnn::register(&mut r);
        r
    })
}
