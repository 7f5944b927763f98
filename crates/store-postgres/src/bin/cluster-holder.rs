//! A child process for the cluster's cleanup test: it starts a throwaway cluster, prints
//! the URL of a fresh database on it, and holds the cluster until it is killed or its
//! standard input closes, so that the test can kill it the way `timeout` or a terminal's
//! Ctrl-C does (a signal to its whole process group) and check that the watcher stops
//! the server anyway.

use std::io::{Read, Write};

use store_postgres::cluster::Cluster;

fn main() {
    let cluster = Cluster::start().unwrap_or_else(|error| panic!("{error}"));
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", cluster.fresh_database()).expect("the test reads the URL");
    out.flush().expect("the test reads the URL");
    // Hold the cluster while the test holds our input.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}
