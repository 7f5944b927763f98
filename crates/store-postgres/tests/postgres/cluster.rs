//! The test infrastructure itself: a throwaway cluster starts, answers on loopback, and
//! is gone after its drop or after its process is killed with its process group; a
//! machine without PostgreSQL fails with what to install.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use store_postgres::cluster::Cluster;

#[test]
fn a_throwaway_cluster_answers_on_loopback_and_is_gone_after_its_drop() {
    let cluster = Cluster::start().unwrap_or_else(|error| panic!("{error}"));
    let url = cluster.fresh_database();
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let answer: i32 = client.query_one("SELECT 41 + 1", &[]).unwrap().get(0);
    assert_eq!(answer, 42);
    let user: String = client
        .query_one("SELECT current_user::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(user, "gate");
    drop(client);
    drop(cluster);
    assert!(
        postgres::Client::connect(&url, postgres::NoTls).is_err(),
        "the server is stopped when the cluster is dropped"
    );
}

#[test]
fn a_machine_without_postgresql_is_a_failure_that_says_what_to_install() {
    let empty = std::env::temp_dir().join(format!("gate-no-pg-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let error = Cluster::start_with(empty.clone()).unwrap_err();
    let _ = std::fs::remove_dir_all(&empty);
    assert!(
        error.contains("apt-get install -y postgresql"),
        "the message names the package: {error}"
    );
}

#[test]
fn a_cluster_is_stopped_when_its_process_group_is_terminated() {
    // `timeout`, and Ctrl-C at a terminal, signal the whole process group: the process
    // holding the cluster and its watcher alike. The server runs in a session of its own
    // and is not signalled, so the watcher must outlive the signal to stop it.
    let mut holder = Command::new(env!("CARGO_BIN_EXE_cluster-holder"))
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the holder starts");
    let mut url = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let url = url.trim().to_owned();
    assert!(
        postgres::Client::connect(&url, postgres::NoTls).is_ok(),
        "the holder's cluster answers: {url}"
    );
    let group = format!("kill -TERM -{}", holder.id());
    let killed = Command::new("sh").arg("-c").arg(&group).status().unwrap();
    assert!(killed.success(), "{group}");
    let _ = holder.wait();
    // Poll for the watcher's stop; the deadline only bounds a failure.
    let deadline = Instant::now() + Duration::from_secs(60);
    while postgres::Client::connect(&url, postgres::NoTls).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the cluster still answers a minute after its process group was terminated"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
