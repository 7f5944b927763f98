//! Runnable lectures: each one shows one design decision of the approval gate at work.
//!
//! Every lecture plays two parts, as a real deployment would: the agent, which holds only
//! sessions handed to it, and the person, who sits at the [`shell`]. No lecture reaches
//! into a service or the kernel to fake a result; when it reads a service's call counter
//! or lists its issues, it prints that as evidence, after the fact.
//!
//! By default every kernel and driver store lives in memory. With `--db PATH` (a
//! [`DbPlan`] on the [`Context`]) each desk keeps them in a SQLite file of its own, ex06's
//! restart really closes and reopens its file, and [`ledger_view`] (`cargo xtask lecture ledger --db
//! PATH`) prints what a file holds from another process.
//!
//! The transcripts are snapshot-tested (`tests/transcripts.rs`), so the behaviour they
//! show cannot drift silently. Each lecture has a page in `docs/lectures/` naming the
//! crate, module and type that implement its decision.
//!
//! # Adding a lecture
//!
//! Write a module with a `pub const LECTURE: Lecture` (see [`Lecture`]), declare it below
//! and add one line to [`LECTURES`]. `--list`, `all`, the snapshot test and the check that
//! its docs page exists pick it up from the table.

mod db;
mod runner;
mod setup;

pub mod ex01_capabilities;
pub mod ex02_trust_boundary;
pub mod ex03_async_queue;
pub mod ex04_pending_work;
pub mod ex05_drain_order;
pub mod ex06_at_most_once;
pub mod ex07_prompt_injection;
pub mod ex08_lockdown;
pub mod ex09_approval_gap;
pub mod ex10_dependencies;
pub mod ex11_order_and_revert;
pub mod ex12_people_during_review;
pub mod ex13_whose_word;
pub mod ex14_confined_server;
pub mod ex15_three_ways;
pub mod ex16_input_required;
pub mod ex17_scoped_grants;
pub mod ex18_one_durable_path;
pub mod ex19_signed_decision;
pub mod ex20_server_down;
pub mod ex21_token_at_send;

pub use db::{DbPlan, LedgerPage, ledger_check, ledger_view, ledger_view_page, shown_path};
pub use runner::{
    Context, Lecture, LectureFuture, find, list, run_lecture, snapshot_filters, transcript,
    valid_names, verb,
};

/// Every lecture, in the order `all` runs them.
pub const LECTURES: &[Lecture] = &[
    ex01_capabilities::LECTURE,
    ex02_trust_boundary::LECTURE,
    ex03_async_queue::LECTURE,
    ex04_pending_work::LECTURE,
    ex05_drain_order::LECTURE,
    ex06_at_most_once::LECTURE,
    ex07_prompt_injection::LECTURE,
    ex08_lockdown::LECTURE,
    ex09_approval_gap::LECTURE,
    ex10_dependencies::LECTURE,
    ex11_order_and_revert::LECTURE,
    ex12_people_during_review::LECTURE,
    ex13_whose_word::LECTURE,
    ex14_confined_server::LECTURE,
    ex15_three_ways::LECTURE,
    ex16_input_required::LECTURE,
    ex17_scoped_grants::LECTURE,
    ex18_one_durable_path::LECTURE,
    ex19_signed_decision::LECTURE,
    ex20_server_down::LECTURE,
    ex21_token_at_send::LECTURE,
];
