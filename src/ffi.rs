//! Raw bindings to the C ABI (`csrc/include/deltakit.h` and the generated Triton launchers'
//! `dk_triton.h`), produced by bindgen at build time. Use the safe wrappers in [`crate::ops`].
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, missing_docs)]
#![allow(clippy::pedantic, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
