//! Generates the gRPC echo service of the `rpc --compare` baseline
//! (`proto/echo.proto`) with the protoc shipped in `protoc-bin-vendored`,
//! so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &["proto/echo.proto"], &["proto"])?;
    Ok(())
}
