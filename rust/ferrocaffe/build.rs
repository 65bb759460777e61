//! Compiles `proto/caffe2.proto` with a pure-Rust protobuf compiler (no `protoc` needed) into
//! prost types, and writes the encoded `FileDescriptorSet` so the Python side can build its
//! message classes from exactly the same schema.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    // The schema lives at the repository root; a packaged crate carries its own copy.
    let candidates = [manifest.join("../../proto"), manifest.join("proto")];
    let include = candidates
        .iter()
        .find(|d| d.join("caffe2.proto").exists())
        .ok_or("proto/caffe2.proto not found")?
        .clone();
    let file = include.join("caffe2.proto");
    println!("cargo:rerun-if-changed={}", file.display());

    let fds = protox::compile([&file], [&include])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("caffe2_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
