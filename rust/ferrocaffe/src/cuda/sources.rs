//! The CUDA C kernel sources, one module per operator family (`kernels/*.cu`), each compiled
//! by NVRTC as [`PRELUDE`] followed by the file. Part of every build, with or without the
//! `cuda` feature, so the PTX check runs where there is no GPU.

/// Definitions every module starts with: fixed-width types and the grid-stride loop.
pub const PRELUDE: &str = include_str!("kernels/prelude.cuh");

/// Options NVRTC compiles every module with (besides the target architecture).
pub const NVRTC_OPTIONS: &[&str] = &["--std=c++17"];

/// Every module: (name, file contents).
pub const MODULES: &[(&str, &str)] = &[
    ("elementwise", include_str!("kernels/elementwise.cu")),
    ("math", include_str!("kernels/math.cu")),
    ("reduce", include_str!("kernels/reduce.cu")),
    ("nn", include_str!("kernels/nn.cu")),
    ("conv", include_str!("kernels/conv.cu")),
    ("sparse", include_str!("kernels/sparse.cu")),
    ("extra", include_str!("kernels/extra.cu")),
];

/// The module `name`: its static name and full source (prelude included).
pub fn find(name: &str) -> Option<(&'static str, String)> {
    MODULES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, src)| (*n, format!("{PRELUDE}\n#line 1 \"{n}.cu\"\n{src}")))
}

/// Every module's name and full source, for the PTX check.
pub fn all() -> Vec<(&'static str, String)> {
    MODULES.iter().filter_map(|(n, _)| find(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_is_found_with_the_prelude() {
        for (name, _) in MODULES {
            let (n, src) = find(name).unwrap();
            assert_eq!(n, *name);
            assert!(src.starts_with(PRELUDE));
            assert!(
                src.contains("extern \"C\" __global__"),
                "{name} defines no kernel"
            );
        }
        assert!(find("no such module").is_none());
    }
}
