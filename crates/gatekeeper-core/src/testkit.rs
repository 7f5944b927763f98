//! Conformance checks for [`ActionStorage`] backends (feature `testkit`): what every durable
//! action store must do, written once and run by each store's tests against its handles.

use std::collections::HashMap;
use std::sync::Arc;

use kernel::testkit::XorShift;
use kernel::{DriverActionId, Timestamp};

use crate::{
    ActionRecord, ActionState as Record, ActionStorage, MemoryActionStorage, StateTag, ToolResult,
};

/// Two handles on one durable action store, as two processes would hold it.
pub trait TwoStores {
    /// Handle `0` or `1`.
    fn store(&self, handle: usize) -> &dyn ActionStorage;
    /// Make what `handle` wrote visible to the other handle (commit what it deferred).
    fn commit(&self, handle: usize);
}

/// Drive two handles of a fresh store (`open`, once per seed) through random stages,
/// claims, settlements, rejections, discards and prunes, and check after every step that
/// both answer exactly as one [`MemoryActionStorage`] would; only the handle that took a
/// claim may settle it. The acting handle also answers as the model before its writes are
/// committed.
pub async fn two_stores_answer_as_one_model<H: TwoStores>(mut open: impl FnMut() -> H) {
    const MAX_OPEN: usize = 6;
    const KEEP: usize = 3;
    for seed in 1..=25u64 {
        let handles = open();
        let model = MemoryActionStorage::new();
        // Which handle holds each claim: only that one may settle it.
        let mut claimant = HashMap::new();
        let mut rng = XorShift::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut highest = 0u64;
        for step in 0..60 {
            let h = rng.below(2) as usize;
            let store = handles.store(h);
            let id = DriverActionId(1 + rng.below(highest.max(1) + 1));
            let known = model.get(id).await.unwrap();
            let what = format!("seed {seed}, step {step}, handle {h}");
            match rng.below(6) {
                0 | 1 => {
                    let args = Arc::new(serde_json::json!({ "step": step }));
                    let staged = store
                        .insert_pending(
                            Arc::from("write"),
                            None,
                            args.clone(),
                            Timestamp(step),
                            MAX_OPEN,
                        )
                        .await
                        .unwrap();
                    let expected = model
                        .insert_pending(Arc::from("write"), None, args, Timestamp(step), MAX_OPEN)
                        .await
                        .unwrap();
                    assert_eq!(staged, expected, "stage: {what}");
                    highest = highest.max(staged.map_or(0, |id| id.0));
                }
                2 => {
                    // Claim (a pending call, or a retry after a failure that sent
                    // nothing), or settle a claim: from either handle, only the claimant's
                    // settle succeeds.
                    let Some(record) = known else { continue };
                    let (from, next) = match &record.state {
                        Record::Pending
                        | Record::Failed {
                            retryable: true, ..
                        } => (
                            record.state.tag(),
                            ActionRecord {
                                state: Record::Applying,
                                claimed_at: Some(Timestamp(step)),
                                ..record.clone()
                            },
                        ),
                        Record::Applying => (
                            StateTag::Applying,
                            ActionRecord {
                                state: if step % 2 == 0 {
                                    Record::Applied {
                                        result: Arc::new(ToolResult::from_text(format!(
                                            "done at {step}"
                                        ))),
                                    }
                                } else {
                                    Record::Failed {
                                        retryable: step % 3 == 0,
                                        message: format!("failed at {step}"),
                                    }
                                },
                                ..record.clone()
                            },
                        ),
                        _ => continue,
                    };
                    let written = store.compare_and_set(from, &next).await.unwrap();
                    let claim = from != StateTag::Applying;
                    let own = claim || claimant.get(&id.0) == Some(&h);
                    assert_eq!(written, own, "claim or settle: {what}");
                    if written {
                        assert!(model.compare_and_set(from, &next).await.unwrap());
                        if claim {
                            claimant.insert(id.0, h);
                        }
                    }
                }
                3 => {
                    let Some(record) = known else { continue };
                    // What may be rejected: pending, or a failure that sent nothing.
                    if !matches!(
                        record.state,
                        Record::Pending
                            | Record::Failed {
                                retryable: true,
                                ..
                            }
                    ) {
                        continue;
                    }
                    let from = record.state.tag();
                    let rejected = ActionRecord {
                        state: Record::Rejected,
                        ..record
                    };
                    let written = store.compare_and_set(from, &rejected).await.unwrap();
                    let expected = model.compare_and_set(from, &rejected).await.unwrap();
                    assert_eq!(written, expected, "reject: {what}");
                }
                4 => {
                    let deleted = store.delete_pending(id).await.unwrap();
                    let expected = model.delete_pending(id).await.unwrap();
                    assert_eq!(deleted, expected, "discard: {what}");
                }
                _ => {
                    let pruned = store.prune_final(KEEP).await.unwrap();
                    let expected = model.prune_final(KEEP).await.unwrap();
                    assert_eq!(pruned, expected, "prune: {what}");
                }
            }
            // The acting handle answers as the model at once (from inside its open
            // transaction, where it defers its writes).
            assert_eq!(
                store.count_open().await.unwrap(),
                model.count_open().await.unwrap(),
                "open count, acting handle: {what}"
            );
            assert_eq!(
                store.get(id).await.unwrap(),
                model.get(id).await.unwrap(),
                "record {}, acting handle: {what}",
                id.0
            );
            handles.commit(h);
            // Both handles answer as the model, whatever each remembered.
            for other in 0..2 {
                let store = handles.store(other);
                let what = format!("{what}, read by handle {other}");
                assert_eq!(
                    store.count_open().await.unwrap(),
                    model.count_open().await.unwrap(),
                    "open count: {what}"
                );
                for n in 1..=highest {
                    let id = DriverActionId(n);
                    assert_eq!(
                        store.get(id).await.unwrap(),
                        model.get(id).await.unwrap(),
                        "record {n}: {what}"
                    );
                }
            }
        }
    }
}

/// An edit ([`ActionStorage::amend_pending`]) of `pending` to `edited` is written, and of
/// `decided` (calls applied, rejected, or never staged) refused; arguments that are not
/// an object are an error. Only `pending`'s arguments change: the caller checks that,
/// and that the edit is kept across a reopen, against what its store held before.
pub async fn an_edit_changes_only_a_pending_call(
    storage: &dyn ActionStorage,
    pending: DriverActionId,
    decided: &[DriverActionId],
    edited: serde_json::Value,
) {
    assert!(
        storage
            .amend_pending(pending, Arc::new(edited))
            .await
            .unwrap()
    );
    for refused in decided {
        assert!(
            !storage
                .amend_pending(*refused, Arc::new(serde_json::json!({"n": "edited"})))
                .await
                .unwrap(),
            "action {refused} is not pending"
        );
    }
    assert!(
        storage
            .amend_pending(
                pending,
                Arc::new(serde_json::json!(["not", "an", "object"]))
            )
            .await
            .is_err()
    );
}
