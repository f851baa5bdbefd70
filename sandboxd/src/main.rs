//! sandboxd entry point.
fn main() {}
