//! HTTP bodies of sandboxd's v1 API, shared by `sandboxd` and `sdk-rust` so neither
//! copies the other's types.
#![deny(missing_docs)]
