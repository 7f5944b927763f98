//! Integration tests of the prompt-sanitize public API; each module is one concern.

mod common;
mod commonmark;
mod controls;
mod hostile;
mod markdown;
mod properties;
