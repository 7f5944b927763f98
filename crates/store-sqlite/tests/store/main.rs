//! store-sqlite's behaviour, one module per concern; the list below is the table of contents.

mod support;

mod actions;
mod bad_input;
mod crash;
mod deep;
mod kv;
mod ledger;
mod opening;
mod power_cut;
mod race;
mod sql_queries;
mod two_handles;
mod upgrade;
