//! Generates the public libibverbs and kernel uverbs types from the headers installed on this
//! machine (`libibverbs-dev`), so that they can never drift from what the C side compiles with.
//! The private provider ABI (`driver.h`) is not installed by any distribution: it is mirrored
//! by hand in `src/private.rs` and checked by layout tests.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("ibv_.*")
        .allowlist_type("verbs_context")
        .allowlist_type("ib_uverbs_.*")
        .allowlist_var("IBV_.*")
        .allowlist_var("IB_USER_VERBS_.*")
        .allowlist_var("IB_UVERBS_.*")
        .blocklist_function(".*")
        .constified_enum_module("ibv_.*")
        .constified_enum_module("ib_uverbs_.*")
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .prepend_enum_name(false)
        .generate()
        .expect("bindgen could not parse <infiniband/verbs.h>: install libibverbs-dev and libclang-dev");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("verbs.rs");
    bindings.write_to_file(out).expect("write bindings");
}
