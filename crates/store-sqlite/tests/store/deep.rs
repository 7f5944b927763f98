//! Arguments an agent nests too deeply: refused at staging with a message that says so,
//! never staged as an action that could not be read back after a restart (which could be
//! neither approved nor rejected, and would hold an open slot for good).

use serde_json::{Value, json};
use store_sqlite::{Database, MAX_JSON_DEPTH};

use crate::support::{Rig, TempDir};

/// `[[[…]]]`, `depth` levels deep (built without parsing: serde_json reads at most 128).
fn nested(depth: usize) -> Value {
    let mut value = json!([]);
    for _ in 1..depth {
        value = Value::Array(vec![value]);
    }
    value
}

#[test]
fn arguments_nested_too_deep_to_read_back_are_refused_at_staging_with_a_clear_message() {
    // Values this deep are built, rendered for the prompt and dropped recursively; an
    // unoptimized test build needs more stack for that than a test thread has.
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(too_deep_is_refused());
        })
        .unwrap()
        .join()
        .unwrap();
}

async fn too_deep_is_refused() {
    // 150: under 64 KiB and under SQLite's limit, over serde_json's (128): staged today,
    // unreadable after a restart. 1,500: over SQLite's JSON limit (1,000) as well.
    for depth in [150, 1_500] {
        let dir = TempDir::new("deep");
        let path = dir.join("gate.db");
        let rig = Rig::new(Database::open(&path).unwrap()).await;
        let error = rig
            .session
            .call_tool(
                "createIssue",
                json!({ "title": "deep", "body": nested(depth) }),
            )
            .await
            .expect_err("too deep to stage");
        let message = error.to_string();
        assert!(
            message.contains(&format!("nested {} levels deep", depth + 1)),
            "{depth}: {message}"
        );
        assert!(
            message.contains(&format!("more than the {MAX_JSON_DEPTH} levels")),
            "{message}"
        );
        for blame in ["check the disk", "edited by hand", "CHECK constraint"] {
            assert!(!message.contains(blame), "{depth}: {message}");
        }
        assert!(
            rig.overseer.ledger().unwrap().is_empty(),
            "nothing was staged"
        );
        assert_eq!(rig.gatekeeper.store().count_open().await.unwrap(), 0);

        // Arguments at the limit are staged, and read back after a restart.
        let ok = rig
            .session
            .call_tool(
                "createIssue",
                json!({ "title": "deep enough", "body": nested(MAX_JSON_DEPTH - 1) }),
            )
            .await
            .expect("at the limit");
        let id = ok.ledger().expect("pending");
        drop(rig);
        let rig = Rig::new(Database::open(&path).unwrap()).await;
        assert_eq!(rig.overseer.open_actions().unwrap().len(), 1);
        rig.overseer
            .approve(id, "alice")
            .await
            .expect("readable, so approvable");
    }
}
