//! The kernel's behaviour, one module per concern; the list below is the table of contents.

mod decisions;
mod dependencies;
mod drain;
mod expiry;
mod faults;
mod lockdown;
mod model;
mod submit;
mod support;
