//! Project automation, reached through `cargo xtask`.
fn main() {}
