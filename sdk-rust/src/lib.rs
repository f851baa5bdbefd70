//! Rust client for sandboxd.
