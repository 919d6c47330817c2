//! Generates bindings to libfabric 1.17 with bindgen and compiles the C
//! wrappers of its `static inline` calls (most of the fi_* API: fi_send,
//! fi_cq_read, fi_mr_reg, ...), which have no symbol in libfabric.so.

use std::env;
use std::path::PathBuf;

const HEADERS: &[&str] = &[
    "rdma/fabric.h",
    "rdma/fi_errno.h",
    "rdma/fi_domain.h",
    "rdma/fi_eq.h",
    "rdma/fi_endpoint.h",
    "rdma/fi_cm.h",
    "rdma/fi_rma.h",
    "rdma/fi_tagged.h",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let wrapper = out.join("fabric_wrapper.h");
    let includes: String = HEADERS
        .iter()
        .map(|h| format!("#include <{h}>\n"))
        .collect();
    std::fs::write(&wrapper, includes).expect("write the wrapper header");
    let statics = out.join("fabric_static_fns");
    let bindings = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid_.*|fid")
        .allowlist_var("FI_.*")
        .wrap_static_fns(true)
        .wrap_static_fns_path(&statics)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen failed on the libfabric headers ({e}); install them with \
                 scripts/install-fabric-deps.sh (Debian: libfabric-dev libclang-dev clang)"
            )
        });
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
    cc::Build::new()
        .file(statics.with_extension("c"))
        .include(&out)
        .opt_level(2)
        .warnings(false)
        .compile("fabric_static_fns");
    println!("cargo:rustc-link-lib=fabric");
}
