//! Generates the KvCache messages, client and server from
//! `proto/fabrickv/cache/v1/cache.proto`, plus the encoded descriptor set
//! that server reflection serves.

use std::env;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Use the vendored protoc so that a fresh clone builds without a system
    // protobuf compiler, and every machine generates the same code.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // (The generator reads PROTOC from the environment; this build script
    // runs no other thread that could read it concurrently.)
    env::set_var("PROTOC", protoc);

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest.join("../../proto");
    let proto = proto_root.join("fabrickv/cache/v1/cache.proto");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed={}", proto.display());
    println!("cargo:rerun-if-changed=build.rs");

    tonic_prost_build::configure()
        // Values reach 64 MiB: `Bytes` lets them move from the decoded
        // request into the backend, and from the backend into the reply,
        // without a copy.
        .bytes(".")
        .file_descriptor_set_path(out.join("fabrickv_cache_v1_descriptor.bin"))
        .compile_protos(&[proto], &[proto_root])?;
    Ok(())
}
