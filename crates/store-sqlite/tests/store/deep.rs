//! Arguments an agent nests too deeply: refused at staging with a message that says so,
//! never staged as an action that could not be read back after a restart (which could be
//! neither approved nor rejected, and would hold an open slot for good).

use std::path::Path;

use serde_json::{Value, json};
use store_sqlite::{Database, MAX_JSON_DEPTH};

use crate::support::{Rig, Store, TempDir};

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
    on_a_big_stack(|| too_deep_is_refused(|path| Database::open(path).unwrap()));
}

/// Run `test` on a thread with room for deep values: they are built, rendered for the
/// prompt and dropped recursively, and an unoptimized test build needs more stack for
/// that than a test thread has.
fn on_a_big_stack<F: Future<Output = ()>>(test: impl FnOnce() -> F + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(test());
        })
        .unwrap()
        .join()
        .unwrap();
}

async fn too_deep_is_refused<D: Store>(open: impl Fn(&Path) -> D) {
    // 150: under 64 KiB and under SQLite's limit, over serde_json's (128): staged today,
    // unreadable after a restart. 1,500: over SQLite's JSON limit (1,000) as well.
    for depth in [150, 1_500] {
        let dir = TempDir::new("deep");
        let path = dir.join("gate.db");
        let rig = Rig::new(open(&path)).await;
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
        let rig = Rig::new(open(&path)).await;
        assert_eq!(rig.overseer.open_actions().unwrap().len(), 1);
        rig.overseer
            .approve(id, "alice")
            .await
            .expect("readable, so approvable");
    }
}

/// `{"title":"t","body":[[…]]}` with the body `depth` levels deep, as text (serde_json
/// cannot write it through a `Value` built by parsing; SQLite stores it as it is).
fn deep_text(depth: usize) -> String {
    format!(
        r#"{{"title":"t","body":{}{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

#[tokio::test]
async fn an_action_whose_stored_rows_cannot_be_read_back_is_never_sent_can_be_rejected_and_the_rest_goes_on()
 {
    let dir = TempDir::new("unreadable");
    let path = dir.join("gate.db");
    let (wedged, next) = {
        let rig = Rig::new(Database::open(&path).unwrap()).await;
        let wedged = rig.queue_issue("wedged").await.ledger().unwrap();
        let next = rig.queue_issue("next").await.ledger().unwrap();
        (wedged, next)
    };
    // What staging let through before the depth limit: arguments, and a description,
    // nested too deeply to read back (SQLite itself takes up to 1,000 levels).
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute(
            "UPDATE actions SET args_json = ?1 WHERE id = 1",
            [deep_text(150)],
        )
        .unwrap();
        raw.execute(
            "UPDATE ledger SET description_json = ?1 WHERE id = ?2",
            [deep_text(150), wedged.0.to_string()],
        )
        .unwrap();
    }
    let rig = Rig::new(Database::open(&path).unwrap()).await;

    // The ledger and the pending list stay readable, the entry shown as unreadable.
    let open = rig.overseer.open_actions().expect("the pending list reads");
    assert_eq!(open.len(), 2);
    assert!(
        open[0].title().contains("unreadable"),
        "{}",
        open[0].title()
    );
    assert_eq!(rig.overseer.ledger().expect("the ledger reads").len(), 2);

    // It is never sent: an approval is refused, saying why.
    let error = rig.overseer.approve(wedged, "alice").await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("is never sent"), "{message}");
    assert!(message.contains("nested 151 levels deep"), "{message}");
    assert!(
        rig.service.calls().is_empty(),
        "nothing reached the service"
    );

    // A person can reject it, and everything else goes on.
    rig.overseer.reject(wedged, "alice").await.expect("rejects");
    let entry = rig.overseer.entry(wedged).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().state, kernel::ActionState::Rejected);
    rig.overseer
        .approve(next, "alice")
        .await
        .expect("the next one goes on");
    assert_eq!(rig.service.calls().len(), 1);
}
