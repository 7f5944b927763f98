//! The test infrastructure itself: a throwaway cluster starts, answers on loopback, and
//! is gone after its drop; a machine without PostgreSQL fails with what to install.

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
