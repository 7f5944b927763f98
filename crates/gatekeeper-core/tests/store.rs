//! The action store's guarantees, observed through its public API and a fake service.

mod common;

use std::sync::Arc;

use common::{FakeService, FaultyStorage, clock};
use gatekeeper_core::store::{
    INTERRUPTED_MESSAGE, MAX_ARGUMENT_BYTES, OUTCOME_UNKNOWN_MESSAGE, PRUNE_EVERY,
    RETAINED_FINAL_ACTIONS,
};
use gatekeeper_core::{
    ActionState, ActionStorage, ActionStore, Applied, ApplyError, CallError, Discard,
    MemoryActionStorage, RejectError, Rejection, StageError, StateTag, ToolResult,
};
use kernel::DriverActionId;
use serde_json::{Value, json};

async fn open(storage: &MemoryActionStorage) -> ActionStore {
    ActionStore::open(Arc::new(storage.clone()), clock())
        .await
        .expect("open")
}

async fn state(store: &ActionStore, id: DriverActionId) -> ActionState {
    store.get(id).await.expect("get").expect("exists").state
}

/// An apply dropped while its written claim waits to become durable (the kernel's deadline
/// drops one) sent nothing, but its claim may be durable: it is recorded as interrupted
/// at the store's next use, never left applying and never sent.
#[tokio::test]
async fn an_apply_dropped_while_its_claim_waits_to_be_durable_is_recorded_as_interrupted() {
    let memory = MemoryActionStorage::new();
    let store = ActionStore::open(
        Arc::new(FaultyStorage::hanging_claims(memory.clone())),
        clock(),
    )
    .await
    .expect("open");
    let service = FakeService::new();
    let id = store.stage("write", json!({})).await.expect("staged");
    let apply = store.apply(id, service.as_ref());
    let waited = tokio::time::timeout(std::time::Duration::from_millis(50), apply).await;
    assert!(waited.is_err(), "the claim never became durable");
    assert_eq!(
        service.calls(),
        0,
        "nothing is sent before the claim is durable"
    );
    assert_eq!(
        memory.get(id).await.expect("get").expect("exists").state,
        ActionState::Applying,
        "the claim was written"
    );
    assert_eq!(
        store.apply(id, service.as_ref()).await,
        Err(ApplyError::NotRetryable {
            id,
            message: INTERRUPTED_MESSAGE.into()
        })
    );
    assert_eq!(service.calls(), 0);
    assert_eq!(store.count_open().await.expect("count"), 0);
}

#[tokio::test]
async fn stage_refuses_what_is_not_an_object_or_too_large_with_its_message() {
    let store = ActionStore::in_memory(clock());
    for not_object in [json!([1]), json!("x"), json!(1), Value::Null] {
        let error = store.stage("write", not_object).await.unwrap_err();
        assert_eq!(error.to_string(), "tool arguments must be a JSON object.");
    }
    // {"a":"…"} is 8 bytes of punctuation around the payload.
    let fits = "x".repeat(MAX_ARGUMENT_BYTES - 8);
    store
        .stage("write", json!({"a": fits}))
        .await
        .expect("exactly at the limit");
    let over = "x".repeat(MAX_ARGUMENT_BYTES - 7);
    let error = store.stage("write", json!({"a": over})).await.unwrap_err();
    assert_eq!(error, StageError::TooLarge { bytes: 65537 });
    assert_eq!(
        error.to_string(),
        "tool arguments are too large (maximum 65536 bytes)."
    );
    // Multi-byte characters count as their UTF-8 bytes.
    let wide = "é".repeat(MAX_ARGUMENT_BYTES / 2);
    assert!(matches!(
        store.stage("write", json!({"a": wide})).await,
        Err(StageError::TooLarge { .. })
    ));
    assert_eq!(store.count_open().await.expect("count"), 1);
}

#[tokio::test]
async fn the_fifty_first_open_call_is_refused_until_one_is_decided() {
    let store = ActionStore::in_memory(clock());
    let service = FakeService::new();
    let mut ids = Vec::new();
    for n in 0..50 {
        ids.push(store.stage("write", json!({"n": n})).await.expect("room"));
    }
    let error = store.stage("write", json!({})).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "50 calls to this server are already awaiting approval. Wait for them to be approved or rejected before queueing more."
    );
    assert_eq!(
        store.reject(ids[0]).await,
        Ok(Rejection::Rejected {
            was: StateTag::Pending
        })
    );
    store
        .stage("write", json!({}))
        .await
        .expect("a rejection frees a slot");
    assert!(store.stage("write", json!({})).await.is_err());
    assert_eq!(
        store.apply(ids[1], service.as_ref()).await,
        Ok(Applied::Sent)
    );
    store
        .stage("write", json!({}))
        .await
        .expect("an apply frees a slot");
}

#[tokio::test]
async fn apply_sends_once_and_a_second_apply_is_a_no_op() {
    let store = ActionStore::in_memory(clock());
    let service = FakeService::new();
    let id = store.stage("write", json!({"x": 1})).await.expect("staged");
    assert_eq!(service.calls(), 0, "staging sends nothing");
    assert_eq!(store.apply(id, service.as_ref()).await, Ok(Applied::Sent));
    assert_eq!(
        store.apply(id, service.as_ref()).await,
        Ok(Applied::AlreadyApplied)
    );
    assert_eq!(service.log(), [("write".to_owned(), json!({"x": 1}))]);
    let ActionState::Applied { result } = state(&store, id).await else {
        panic!("applied");
    };
    assert_eq!(result.text(), "ran write");
}

#[tokio::test]
async fn apply_refuses_unknown_rejected_and_final_failures_distinctly() {
    let store = ActionStore::in_memory(clock());
    let service = FakeService::new();
    let unknown = DriverActionId(99);
    assert_eq!(
        store.apply(unknown, service.as_ref()).await,
        Err(ApplyError::Unknown(unknown))
    );

    let rejected = store.stage("write", json!({})).await.expect("staged");
    let _ = store.reject(rejected).await.expect("rejected");
    assert_eq!(
        store.apply(rejected, service.as_ref()).await,
        Err(ApplyError::Rejected(rejected))
    );

    let lost = store.stage("write", json!({})).await.expect("staged");
    service.reply_next(Err(CallError::Unknown("connection reset".into())));
    let error = store.apply(lost, service.as_ref()).await.unwrap_err();
    assert!(!error.retryable());
    assert_eq!(error.to_string(), OUTCOME_UNKNOWN_MESSAGE);
    let again = store.apply(lost, service.as_ref()).await.unwrap_err();
    assert_eq!(
        again,
        ApplyError::NotRetryable {
            id: lost,
            message: OUTCOME_UNKNOWN_MESSAGE.into()
        }
    );
    assert_eq!(
        service.calls(),
        1,
        "a call that may have landed is never re-sent"
    );
}

#[tokio::test]
async fn a_refusal_before_dispatch_is_retryable_and_may_be_rejected() {
    let store = ActionStore::in_memory(clock());
    let service = FakeService::new();
    let id = store.stage("write", json!({})).await.expect("staged");
    service.reply_next(Err(CallError::Declined(
        "Access denied. Ask for access.".into(),
    )));
    let error = store.apply(id, service.as_ref()).await.unwrap_err();
    assert!(error.retryable());
    assert_eq!(error.to_string(), "Access denied. Ask for access.");
    assert_eq!(
        state(&store, id).await,
        ActionState::Failed {
            retryable: true,
            message: "Access denied. Ask for access.".into()
        }
    );
    // Our improvement over the reference: nothing was sent, so a person may say no.
    assert_eq!(
        store.reject(id).await,
        Ok(Rejection::Rejected {
            was: StateTag::Failed
        })
    );
    assert_eq!(state(&store, id).await, ActionState::Rejected);
}

#[tokio::test]
async fn reject_semantics_per_state() {
    let store = ActionStore::in_memory(clock());
    let service = FakeService::new();
    assert_eq!(
        store.reject(DriverActionId(42)).await,
        Ok(Rejection::Unknown)
    );

    let pending = store.stage("write", json!({})).await.expect("staged");
    assert_eq!(
        store.reject(pending).await,
        Ok(Rejection::Rejected {
            was: StateTag::Pending
        })
    );
    assert_eq!(store.reject(pending).await, Ok(Rejection::AlreadyRejected));

    let applied = store.stage("write", json!({})).await.expect("staged");
    let _ = store
        .apply(applied, service.as_ref())
        .await
        .expect("applied");
    assert_eq!(
        store.reject(applied).await,
        Err(RejectError::Applied(applied))
    );

    let unknown = store.stage("write", json!({})).await.expect("staged");
    service.reply_next(Err(CallError::Unknown("timeout".into())));
    let _ = store.apply(unknown, service.as_ref()).await.unwrap_err();
    assert_eq!(
        store.reject(unknown).await,
        Err(RejectError::NotRetryable(unknown))
    );
}

#[tokio::test]
async fn discard_deletes_only_a_pending_record() {
    let store = ActionStore::in_memory(clock());
    let id = store.stage("write", json!({})).await.expect("staged");
    assert_eq!(store.discard(id).await, Ok(Discard::Discarded));
    assert_eq!(store.get(id).await, Ok(None));
    assert_eq!(store.discard(id).await, Ok(Discard::NotPending));
    let rejected = store.stage("write", json!({})).await.expect("staged");
    let _ = store.reject(rejected).await.expect("rejected");
    assert_eq!(store.discard(rejected).await, Ok(Discard::NotPending));
    assert_eq!(state(&store, rejected).await, ActionState::Rejected);
    let next = store.stage("write", json!({})).await.expect("staged");
    assert!(next > rejected, "ids are never reused");
}

#[tokio::test]
async fn a_result_over_128_kib_keeps_what_fits_names_what_it_dropped_and_is_still_applied() {
    let store = ActionStore::in_memory(clock());
    let service = FakeService::new();
    let id = store.stage("write", json!({})).await.expect("staged");
    let text = "x".repeat(128 * 1024);
    let block = serde_json::to_vec(&json!({"type": "text", "text": text}))
        .expect("encodes")
        .len();
    let big = ToolResult::from_text(text).with_structured(json!({"k": 1}));
    service.reply_next(Ok(big));
    assert_eq!(store.apply(id, service.as_ref()).await, Ok(Applied::Sent));
    let ActionState::Applied { result } = state(&store, id).await else {
        panic!("still applied");
    };
    assert_eq!(
        result.text(),
        format!("(The server's text block was too large to retain: {block} bytes.)")
    );
    assert_eq!(result.structured_content, Some(json!({"k": 1})));
    assert_eq!(
        store.apply(id, service.as_ref()).await,
        Ok(Applied::AlreadyApplied)
    );
    assert_eq!(service.calls(), 1);
}

#[tokio::test]
async fn retention_prunes_only_final_records_beyond_the_newest_hundred_every_sixteenth_settle() {
    let storage = MemoryActionStorage::new();
    let store = open(&storage).await;
    let service = FakeService::new();
    let pending = store.stage("write", json!({})).await.expect("staged");
    let retryable = store.stage("write", json!({})).await.expect("staged");
    service.reply_next(Err(CallError::Declined("no".into())));
    let _ = store.apply(retryable, service.as_ref()).await.unwrap_err();
    // The failed apply was the first call settled; each rejection below is one more.
    let mut settled = 1;
    let mut finals = Vec::new();
    let mut pruned_to_the_limit = 0;
    for _ in 0..(RETAINED_FINAL_ACTIONS + 3 * PRUNE_EVERY) {
        let id = store.stage("write", json!({})).await.expect("staged");
        let _ = store.reject(id).await.expect("rejected");
        finals.push(id);
        settled += 1;
        let kept: Vec<DriverActionId> = storage.records().iter().map(|r| r.id).collect();
        assert_eq!(
            kept[..2],
            [pending, retryable],
            "open and retryable records survive"
        );
        let kept_finals = &kept[2..];
        // Always the newest, never fewer than the limit, and the limit after each prune.
        assert_eq!(kept_finals, &finals[finals.len() - kept_finals.len()..]);
        assert!(kept_finals.len() >= finals.len().min(RETAINED_FINAL_ACTIONS));
        if settled % PRUNE_EVERY == 0 && finals.len() >= RETAINED_FINAL_ACTIONS {
            assert_eq!(
                kept_finals.len(),
                RETAINED_FINAL_ACTIONS,
                "after {settled} settled"
            );
            pruned_to_the_limit += 1;
        } else if finals.len() > RETAINED_FINAL_ACTIONS + PRUNE_EVERY {
            // Nothing is pruned between two prunes: no look, no write.
            let since = settled % PRUNE_EVERY;
            assert_eq!(
                kept_finals.len(),
                RETAINED_FINAL_ACTIONS + since,
                "after {settled} settled"
            );
        }
    }
    // At 112, 128 and 144 calls settled.
    assert_eq!(pruned_to_the_limit, 3);
    assert_eq!(
        store.apply(finals[0], service.as_ref()).await,
        Err(ApplyError::Unknown(finals[0]))
    );
}

#[tokio::test]
async fn reopening_over_a_claim_fails_it_for_good_and_never_sends_it() {
    let storage = MemoryActionStorage::new();
    let store = open(&storage).await;
    let service = FakeService::new();
    let id = store.stage("write", json!({})).await.expect("staged");
    // A process wrote its claim (step 3) and died before sending or settling.
    let record = store.get(id).await.expect("get").expect("exists");
    let gatekeeper_core::store::ApplyStep::Claim(claimed) =
        record.begin_apply(kernel::Timestamp(1))
    else {
        panic!("pending records may be claimed");
    };
    assert!(
        storage
            .compare_and_set(StateTag::Pending, &claimed)
            .await
            .expect("written")
    );
    drop(store);

    let reopened = open(&storage).await;
    assert_eq!(
        state(&reopened, id).await,
        ActionState::Failed {
            retryable: false,
            message: INTERRUPTED_MESSAGE.into()
        }
    );
    let error = reopened.apply(id, service.as_ref()).await.unwrap_err();
    assert_eq!(error.to_string(), INTERRUPTED_MESSAGE);
    assert_eq!(service.calls(), 0);
}

#[tokio::test]
async fn a_storage_failure_at_each_write_of_apply_never_causes_a_second_send_nor_strands_the_claim()
{
    // Write 1 is the claim, write 2 the settlement.
    for failing_write in [1, 2] {
        let memory = MemoryActionStorage::new();
        let store = ActionStore::open(
            Arc::new(FaultyStorage::failing_cas(memory.clone(), failing_write)),
            clock(),
        )
        .await
        .expect("open");
        let service = FakeService::new();
        let id = store.stage("write", json!({})).await.expect("staged");
        let error = store.apply(id, service.as_ref()).await.unwrap_err();
        match failing_write {
            1 => {
                assert!(matches!(error, ApplyError::Storage(_)));
                assert!(error.retryable(), "nothing was sent: {error}");
                assert_eq!(service.calls(), 0);
                assert_eq!(store.apply(id, service.as_ref()).await, Ok(Applied::Sent));
            }
            _ => {
                assert!(matches!(error, ApplyError::OutcomeNotRecorded { .. }));
                assert!(!error.retryable(), "it was sent: {error}");
                // The claim is stranded, not "being applied" forever: once the disk
                // answers again it is an unknown outcome, without a restart.
                assert_eq!(
                    store.apply(id, service.as_ref()).await,
                    Err(ApplyError::NotRetryable {
                        id,
                        message: INTERRUPTED_MESSAGE.into()
                    })
                );
                assert_eq!(
                    store.reject(id).await,
                    Err(RejectError::NotRetryable(id)),
                    "it may have been sent: rejecting it is refused as for any unknown outcome"
                );
                assert_eq!(store.count_open().await.expect("count"), 0);
                let reopened = open(&memory).await;
                assert!(reopened.apply(id, service.as_ref()).await.is_err());
            }
        }
        assert_eq!(service.calls(), 1, "failing write {failing_write}");
    }
}
