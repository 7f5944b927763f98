//! The issue tracker's gate end to end, with the real kernel: one module per decision of
//! the lecture (ex01–ex08) that this driver takes part in.

mod common;

mod at_most_once; // ex06: claim before send
mod capabilities; // ex01: nothing is ambient; a grant names its tools
mod classification; // ex02: one trust boundary; a lying server's read-only claim
mod lockdown; // ex08: after a sensitive read nothing leaves
mod queue; // ex03 + ex05: submit returns at once; two keys, drained in order
mod revert;
mod simulation; // ex04: pending work shown in reads, and what depends on it // beyond the reference: undoing addLabel, or saying why not
