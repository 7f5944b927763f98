//! Folding a batch of journal records before the applier writes it: a later change of a
//! ledger entry or a staged call that an earlier record of the same batch already wrote
//! is merged into that record, so the file gets each row once per batch.
//!
//! A cycle leaves six records in the journal (the stage, its ledger entry, who decided,
//! the claim, the driver's outcome, the ledger's outcome), each synced or written when it
//! happened. The file needs only their net effect: when a whole cycle falls in one batch,
//! the applier inserts the ledger entry and the staged call as they last stood, settled:
//! two rows written once each, in one transaction, instead of six writes, and no read of
//! a row just written.
//!
//! What may be merged, and why it is safe, record by record:
//!
//! - A ledger entry's later records ([`Op::ActionPut`], the decision of an
//!   [`Op::LedgerAttempt`], an observation's [`Op::LedgerPut`]) are merged into the
//!   batch's [`Op::LedgerInsert`] of it, or into its previous put. Entries are
//!   independent rows: writing one earlier changes what no other record of the batch
//!   reads. A decision is merged only into the insert (it also names the process deciding,
//!   which an insert leaves empty; behind a journal one process owns the file and opening
//!   settles every claim, so nobody reads it); after an unmerged one, a later put starts
//!   a new record.
//! - A staged call's later [`Op::ActionSet`] is merged into the batch's
//!   [`Op::ActionInsert`] of it (the row is inserted in the state it reached, see
//!   `SqliteActionStorage::stage`), or into its previous set (the first set's `from` is
//!   kept); the last move's state and claim time win. The merged move then happens
//!   earlier in the batch than the later set did. Between the two, only a call staged in
//!   the same store could see the difference, through its cap on open calls; a set never
//!   reopens a settled call, so the file then counts at most as many open calls as the
//!   copy in memory did, and takes the stage as the copy did. A prune names the settled
//!   calls it deleted ([`Op::ActionPruned`]), so a move merged across it changes nothing
//!   it deletes; a prune recorded by an earlier build ([`Op::ActionPrune`]) counts
//!   settled calls instead, and ends the merging of that store's calls.
//! - A call that the batch stages and a later [`Op::ActionPruned`] of the same batch
//!   deletes, with every move between merged into its stage (so it is settled), is
//!   passed over: its stage becomes an [`Op::ActionPassed`], which hands out its id
//!   under the same cap but writes no row, and the prune names it in `passed` instead
//!   of `ids`, so the file still records its id as handed out (the highest of both
//!   lists) and deletes only the others. The file would have inserted the row and
//!   deleted it in the same transaction; a settled row counts for no cap in between.
//!   Under sixteen sessions about a third of the pruned calls were passed over.
//! - A staged call's [`Op::ActionAmend`] (a person's edit of its arguments, recorded
//!   only while the call is pending) is merged into the batch's [`Op::ActionInsert`] of
//!   it, which is then still pending, since no move returns a call to pending: the
//!   insert takes the new arguments and the amend is dropped, so the row is inserted
//!   with the arguments the copy in memory had after the edit. The insert stays the
//!   record that the call's later [`Op::ActionSet`]s merge into (and that a later prune
//!   may pass over), as if the edit had come with the stage. An amend of a call staged in
//!   an earlier batch is kept in its place, and no later move of that call merges across
//!   it: merged into an earlier move, the call would no longer be pending when the amend
//!   is written.
//! - Everything else (rules, the lockdown, deletes, prunes) is kept as it is, in its
//!   place.
//!
//! A call inserted as still claimed records this process as its claimant, as a claim
//! does; a claim and its outcome merged into one write leave the row's `claimed_by`
//! empty, since the claim was never in the file on its own. Only a shared file's other
//! processes read it.

use std::collections::HashMap;
use std::sync::Arc;

use gatekeeper_core::ActionState;
use kernel::{DriverActionId, EntryBody, LedgerEntry, LedgerId};

use crate::journaled::Op;

/// `records` (journal number, record), in order, with later changes merged into earlier
/// records as the module docs say. Each kept record keeps the number of the first record
/// merged into it.
pub(crate) fn fold(records: Vec<(u64, Op)>) -> Vec<(u64, Op)> {
    let mut out: Vec<(u64, Op)> = Vec::with_capacity(records.len());
    // The index in `out` of the record a later change of this entry may merge into.
    let mut entries: HashMap<LedgerId, usize> = HashMap::new();
    // The index in `out` of this staged call's stage or last move.
    let mut calls: HashMap<(Arc<str>, DriverActionId), usize> = HashMap::new();
    for (seq, op) in records {
        let op = match op {
            Op::ActionPruned {
                gatekeeper,
                ids,
                passed,
            } => pass_over(gatekeeper, ids, passed, &mut out, &mut calls),
            op => op,
        };
        match &op {
            Op::LedgerInsert(entry) => {
                entries.insert(entry.id, out.len());
            }
            Op::ActionPut { id, .. } => {
                let id = *id;
                if let Some(&at) = entries.get(&id) {
                    match &mut out[at].1 {
                        Op::LedgerInsert(LedgerEntry {
                            body: EntryBody::Action(action),
                            ..
                        }) => {
                            op.move_action(action);
                            continue;
                        }
                        earlier @ Op::ActionPut { .. } => {
                            // A put carries everything that moves: the later one wins.
                            *earlier = op;
                            continue;
                        }
                        _ => {}
                    }
                }
                entries.insert(id, out.len());
            }
            Op::LedgerAttempt { id, resolution } => {
                if let Some(&at) = entries.get(id)
                    && let Op::LedgerInsert(LedgerEntry {
                        body: EntryBody::Action(action),
                        ..
                    }) = &mut out[at].1
                    && action.is_open()
                {
                    action.resolution = Some(resolution.clone());
                    continue;
                }
                entries.remove(id);
            }
            Op::LedgerPut(entry) => {
                if let Some(&at) = entries.get(&entry.id)
                    && let Op::LedgerInsert(earlier) | Op::LedgerPut(earlier) = &mut out[at].1
                    && earlier.action().is_none()
                    && entry.action().is_none()
                {
                    *earlier = entry.clone();
                    continue;
                }
                entries.insert(entry.id, out.len());
            }
            Op::ActionInsert {
                gatekeeper, record, ..
            } => {
                calls.insert((gatekeeper.clone(), record.id), out.len());
            }
            Op::ActionSet {
                gatekeeper,
                id,
                from,
                state,
                claimed_at,
            } => {
                let key = (gatekeeper.clone(), *id);
                if let Some(&at) = calls.get(&key) {
                    let (earlier, earlier_claim) = match &mut out[at].1 {
                        Op::ActionInsert { record, .. } => {
                            (&mut record.state, &mut record.claimed_at)
                        }
                        Op::ActionSet {
                            state, claimed_at, ..
                        } => (state, claimed_at),
                        _ => unreachable!("`calls` points at stages and moves"),
                    };
                    if earlier.tag() == *from {
                        *earlier = state.clone();
                        *earlier_claim = *claimed_at;
                        continue;
                    }
                }
                calls.insert(key, out.len());
            }
            Op::ActionAmend {
                gatekeeper,
                id,
                args,
            } => {
                let key = (gatekeeper.clone(), *id);
                if let Some(&at) = calls.get(&key)
                    && let Op::ActionInsert { record, .. } = &mut out[at].1
                    && record.state == ActionState::Pending
                {
                    record.args = args.clone();
                    continue;
                }
                calls.remove(&key);
            }
            Op::ActionDelete { gatekeeper, id } => {
                calls.remove(&(gatekeeper.clone(), *id));
            }
            Op::ActionPrune { gatekeeper, .. } => {
                calls.retain(|(store, _), _| store != gatekeeper);
            }
            // `pass_over` took its calls out of `calls`: none merges again.
            Op::ActionPruned { .. } => {}
            Op::ActionPassed { .. } => unreachable!("only `fold` makes ActionPassed"),
            Op::RulePut(_) | Op::RuleRemove { .. } | Op::Lockdown => {}
        }
        out.push((seq, op));
    }
    out
}

/// The prune ([`Op::ActionPruned`]) of `ids` of `gatekeeper` (with any calls already
/// `passed`) as the file should take it: a pruned call whose stage `out` holds with every
/// later move merged into it (settled, since the prune chose it) is passed over, its stage
/// replaced by [`Op::ActionPassed`] and its id moved from the prune's `ids` to its
/// `passed`; the file would insert the row and delete it in the same transaction. The
/// others are deleted as named. None of the pruned calls merges again.
fn pass_over(
    gatekeeper: Arc<str>,
    ids: Vec<DriverActionId>,
    mut passed: Vec<DriverActionId>,
    out: &mut [(u64, Op)],
    calls: &mut HashMap<(Arc<str>, DriverActionId), usize>,
) -> Op {
    let mut deleted = Vec::with_capacity(ids.len());
    for id in ids {
        let staged = calls.remove(&(gatekeeper.clone(), id));
        if let Some(stage) = staged.map(|at| &mut out[at].1)
            && let Op::ActionInsert {
                record, max_open, ..
            } = stage
            && !record.state.is_open()
        {
            *stage = Op::ActionPassed {
                gatekeeper: gatekeeper.clone(),
                id,
                max_open: *max_open,
            };
            passed.push(id);
        } else {
            deleted.push(id);
        }
    }
    Op::ActionPruned {
        gatekeeper,
        ids: deleted,
        passed,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gatekeeper_core::{ActionRecord, ActionState, StateTag, ToolResult};
    use kernel::{
        ActionDescription, ActionEntry, DriverActionId, EntryBody, LedgerEntry, LedgerId,
        ObservationDescription, Resolution, Timestamp,
    };
    use serde_json::json;

    use super::fold;
    use crate::journaled::Op;

    fn entry(id: u64) -> LedgerEntry {
        LedgerEntry {
            id: LedgerId(id),
            gatekeeper: Arc::from("issues"),
            caller: Arc::from("agent"),
            created_at: Timestamp(id),
            body: EntryBody::Action(ActionEntry {
                driver_id: DriverActionId(id),
                description: Arc::new(ActionDescription::new("Add dark mode", "")),
                state: kernel::ActionState::Pending,
                resolution: None,
                failure: None,
                depends_on: Vec::new(),
                blocked_by: None,
                restart_requested: false,
                revert: None,
            }),
        }
    }

    fn alice() -> Resolution {
        Resolution {
            by: "alice".into(),
            auto: false,
            at: Timestamp(7),
            cause: None,
        }
    }

    fn stage(id: u64) -> Op {
        Op::ActionInsert {
            gatekeeper: Arc::from("issues"),
            record: ActionRecord {
                id: DriverActionId(id),
                tool: Arc::from("createIssue"),
                definition: None,
                args: Arc::new(json!({"n": id})),
                submitted_at: Timestamp(id),
                claimed_at: None,
                state: ActionState::Pending,
            },
            max_open: 50,
        }
    }

    fn set(id: u64, from: StateTag, state: ActionState) -> Op {
        Op::ActionSet {
            gatekeeper: Arc::from("issues"),
            id: DriverActionId(id),
            from,
            state,
            claimed_at: Some(Timestamp(8)),
        }
    }

    fn amend(id: u64, text: &str) -> Op {
        Op::ActionAmend {
            gatekeeper: Arc::from("issues"),
            id: DriverActionId(id),
            args: Arc::new(json!({ "n": id, "edited": text })),
        }
    }

    fn pruned(ids: &[u64]) -> Op {
        Op::ActionPruned {
            gatekeeper: Arc::from("issues"),
            ids: ids.iter().copied().map(DriverActionId).collect(),
            passed: Vec::new(),
        }
    }

    fn prune(store: &str) -> Op {
        Op::ActionPrune {
            gatekeeper: Arc::from(store),
            keep: 100,
            pruned: 1,
        }
    }

    fn applied() -> ActionState {
        ActionState::Applied {
            result: Arc::new(ToolResult::from_text("done")),
        }
    }

    fn outcome(id: u64, state: kernel::ActionState) -> Op {
        Op::ActionPut {
            id: LedgerId(id),
            state,
            resolution: Some(alice()),
            failure: None,
            blocked_by: None,
            restart_requested: false,
            revert: None,
        }
    }

    /// The six records of one cycle, as the journal holds them.
    fn cycle(id: u64) -> Vec<Op> {
        vec![
            stage(id),
            Op::LedgerInsert(entry(id)),
            Op::LedgerAttempt {
                id: LedgerId(id),
                resolution: alice(),
            },
            set(id, StateTag::Pending, ActionState::Applying),
            set(id, StateTag::Applying, applied()),
            outcome(id, kernel::ActionState::Approved),
        ]
    }

    fn numbered(ops: Vec<Op>) -> Vec<(u64, Op)> {
        (1..).zip(ops).collect()
    }

    /// What each kept record is, in order, with its number.
    fn shape(folded: &[(u64, Op)]) -> Vec<(u64, String)> {
        folded
            .iter()
            .map(|(seq, op)| {
                let name = format!("{op:?}");
                let name = name.split([' ', '(']).next().unwrap_or_default();
                (*seq, name.to_owned())
            })
            .collect()
    }

    #[test]
    fn a_whole_cycle_folds_into_two_rows_written_once() {
        let folded = fold(numbered(cycle(1)));
        assert_eq!(
            shape(&folded),
            [
                (1, "ActionInsert".to_owned()),
                (2, "LedgerInsert".to_owned())
            ]
        );
        // The call is staged as it last stood, with its claim time.
        let Op::ActionInsert { record, .. } = &folded[0].1 else {
            unreachable!()
        };
        assert_eq!(record.state, applied());
        assert_eq!(record.claimed_at, Some(Timestamp(8)));
        // The entry is inserted settled, with who decided.
        let Op::LedgerInsert(inserted) = &folded[1].1 else {
            unreachable!()
        };
        let action = inserted.action().unwrap();
        assert_eq!(action.state, kernel::ActionState::Approved);
        assert_eq!(action.resolution, Some(alice()));
    }

    #[test]
    fn moves_after_a_stage_staged_earlier_merge_into_one_move() {
        // The stage was applied in an earlier batch: the claim and the outcome become one
        // move, from pending straight to the outcome.
        let records = vec![
            set(1, StateTag::Pending, ActionState::Applying),
            set(1, StateTag::Applying, applied()),
        ];
        let folded = fold(numbered(records));
        let [(1, Op::ActionSet { from, state, .. })] = &folded[..] else {
            panic!("{folded:?}")
        };
        assert_eq!((*from, state), (StateTag::Pending, &applied()));
    }

    #[test]
    fn interleaved_cycles_fold_each_into_its_own_rows() {
        let (a, b) = (cycle(1), cycle(2));
        let mixed: Vec<Op> = a.into_iter().zip(b).flat_map(|(x, y)| [x, y]).collect();
        let folded = fold(numbered(mixed));
        assert_eq!(folded.len(), 4);
        for (_, op) in &folded {
            if let Op::LedgerInsert(entry) = op {
                assert_eq!(entry.action().unwrap().state, kernel::ActionState::Approved);
            }
        }
    }

    #[test]
    fn a_change_of_a_row_written_in_an_earlier_batch_is_kept_but_merged_with_its_successors() {
        // The stage and the entry were applied in an earlier batch: the decision, the claim
        // and both outcomes remain, each row's changes merged into one write.
        let records = cycle(1).into_iter().skip(2).collect();
        let folded = fold(numbered(records));
        assert_eq!(
            shape(&folded),
            [
                (1, "LedgerAttempt".to_owned()),
                (2, "ActionSet".to_owned()),
                (4, "ActionPut".to_owned())
            ]
        );
    }

    #[test]
    fn a_put_after_a_decision_it_could_not_merge_starts_a_new_record() {
        let records = vec![
            outcome(1, kernel::ActionState::Pending),
            Op::LedgerAttempt {
                id: LedgerId(1),
                resolution: alice(),
            },
            outcome(1, kernel::ActionState::Approved),
            outcome(1, kernel::ActionState::Approved),
        ];
        assert_eq!(
            shape(&fold(numbered(records))),
            [
                (1, "ActionPut".to_owned()),
                (2, "LedgerAttempt".to_owned()),
                (3, "ActionPut".to_owned())
            ]
        );
    }

    #[test]
    fn a_prune_that_names_its_records_lets_the_calls_around_it_merge() {
        let records = vec![
            stage(2),
            set(1, StateTag::Applying, applied()),
            pruned(&[1]),
            set(2, StateTag::Pending, ActionState::Applying),
            pruned(&[3]),
            set(2, StateTag::Applying, applied()),
        ];
        let folded = fold(numbered(records));
        assert_eq!(
            shape(&folded),
            [
                (1, "ActionInsert".to_owned()),
                (2, "ActionSet".to_owned()),
                (3, "ActionPruned".to_owned()),
                (5, "ActionPruned".to_owned())
            ]
        );
        let Op::ActionInsert { record, .. } = &folded[0].1 else {
            unreachable!()
        };
        assert_eq!(record.state, applied());
        // A later move of a pruned call (there is none: it was settled) starts anew.
        let records = vec![
            set(1, StateTag::Pending, ActionState::Applying),
            pruned(&[1]),
            set(1, StateTag::Applying, applied()),
        ];
        assert_eq!(fold(numbered(records)).len(), 3);
    }

    #[test]
    fn a_call_staged_and_pruned_in_one_batch_is_passed_over_and_its_id_still_recorded() {
        let mut records = cycle(1);
        records.extend([
            stage(2),
            pruned(&[1]),
            set(2, StateTag::Pending, ActionState::Rejected),
        ]);
        let folded = fold(numbered(records));
        assert_eq!(
            shape(&folded),
            [
                (1, "ActionPassed".to_owned()),
                (2, "LedgerInsert".to_owned()),
                (7, "ActionInsert".to_owned()),
                (8, "ActionPruned".to_owned())
            ]
        );
        let Op::ActionPassed { id, max_open, .. } = &folded[0].1 else {
            unreachable!()
        };
        assert_eq!((*id, *max_open), (DriverActionId(1), 50));
        let Op::ActionPruned { ids, passed, .. } = &folded[3].1 else {
            unreachable!()
        };
        assert_eq!((&ids[..], &passed[..]), (&[][..], &[DriverActionId(1)][..]));
        // The next call's moves still merge into its stage.
        let Op::ActionInsert { record, .. } = &folded[2].1 else {
            unreachable!()
        };
        assert_eq!(record.state, ActionState::Rejected);
    }

    #[test]
    fn a_pruned_call_is_deleted_when_its_row_is_written_apart_from_its_stage() {
        // Its stage came in an earlier batch; or a move could not merge into its stage; or
        // (the file refuses this prune, as it would have unfolded) it is still open.
        for records in [
            vec![set(1, StateTag::Applying, applied()), pruned(&[1])],
            vec![
                stage(1),
                set(1, StateTag::Applying, applied()),
                pruned(&[1]),
            ],
            vec![stage(1), pruned(&[1])],
        ] {
            let folded = fold(numbered(records));
            let Some((_, Op::ActionPruned { ids, passed, .. })) = folded.last() else {
                panic!("{folded:?}")
            };
            assert_eq!((&ids[..], &passed[..]), (&[DriverActionId(1)][..], &[][..]));
            assert!(
                !folded
                    .iter()
                    .any(|(_, op)| matches!(op, Op::ActionPassed { .. }))
            );
        }
    }

    #[test]
    fn a_prune_stops_a_claim_and_its_outcome_from_merging() {
        // A prune of an earlier build, which recorded only how many it deleted: merged,
        // the outcome would settle the call before the prune counted settled calls.
        let records = vec![
            stage(1),
            prune("issues"),
            set(1, StateTag::Pending, ActionState::Applying),
        ];
        assert_eq!(fold(numbered(records)).len(), 3);
        let records = vec![
            set(1, StateTag::Pending, ActionState::Applying),
            prune("issues"),
            set(1, StateTag::Applying, applied()),
        ];
        assert_eq!(fold(numbered(records)).len(), 3);
        // Another store's prune does not.
        let records = vec![
            set(1, StateTag::Pending, ActionState::Applying),
            prune("wiki"),
            set(1, StateTag::Applying, applied()),
        ];
        assert_eq!(fold(numbered(records)).len(), 2);
    }

    #[test]
    fn a_set_that_does_not_start_where_the_last_ended_is_kept_apart() {
        // The file then refuses it, as it would have unfolded.
        let records = vec![
            set(1, StateTag::Pending, ActionState::Rejected),
            set(1, StateTag::Applying, applied()),
        ];
        assert_eq!(fold(numbered(records)).len(), 2);
        let records = vec![stage(1), set(1, StateTag::Applying, applied())];
        assert_eq!(fold(numbered(records)).len(), 2);
    }

    #[test]
    fn an_observation_is_inserted_as_it_last_stood() {
        let observation = |text: &str| LedgerEntry {
            body: EntryBody::Observation(ObservationDescription::new("Read", text)),
            ..entry(3)
        };
        let records = vec![
            Op::LedgerInsert(observation("first")),
            Op::LedgerPut(observation("second")),
        ];
        let folded = fold(numbered(records));
        assert_eq!(folded.len(), 1);
        let Op::LedgerInsert(inserted) = &folded[0].1 else {
            unreachable!()
        };
        assert_eq!(inserted, &observation("second"));
    }

    #[test]
    fn rules_stages_and_deletes_keep_their_place() {
        let records = vec![
            stage(1),
            Op::Lockdown,
            Op::ActionDelete {
                gatekeeper: Arc::from("issues"),
                id: DriverActionId(1),
            },
            stage(2),
        ];
        assert_eq!(
            shape(&fold(numbered(records))),
            [
                (1, "ActionInsert".to_owned()),
                (2, "Lockdown".to_owned()),
                (3, "ActionDelete".to_owned()),
                (4, "ActionInsert".to_owned())
            ]
        );
    }

    #[test]
    fn an_edit_of_a_call_staged_in_the_batch_is_staged_with_it_and_later_moves_still_merge() {
        let mut records = cycle(1);
        records.insert(1, amend(1, "first"));
        records.insert(2, amend(1, "second"));
        let folded = fold(numbered(records));
        assert_eq!(
            shape(&folded),
            [
                (1, "ActionInsert".to_owned()),
                (4, "LedgerInsert".to_owned())
            ]
        );
        let Op::ActionInsert { record, .. } = &folded[0].1 else {
            unreachable!()
        };
        assert_eq!(*record.args, json!({ "n": 1, "edited": "second" }));
        assert_eq!(record.state, applied());
        assert_eq!(record.claimed_at, Some(Timestamp(8)));
        // Staged, edited, rejected and pruned in one batch: passed over all the same.
        let records = vec![
            stage(2),
            amend(2, "edited"),
            set(2, StateTag::Pending, ActionState::Rejected),
            pruned(&[2]),
        ];
        assert_eq!(
            shape(&fold(numbered(records))),
            [
                (1, "ActionPassed".to_owned()),
                (4, "ActionPruned".to_owned())
            ]
        );
    }

    #[test]
    fn an_edit_of_a_call_staged_earlier_keeps_its_place_and_no_move_merges_across_it() {
        let records = vec![
            amend(1, "edited"),
            set(1, StateTag::Pending, ActionState::Applying),
            set(1, StateTag::Applying, applied()),
        ];
        let folded = fold(numbered(records));
        assert_eq!(
            shape(&folded),
            [(1, "ActionAmend".to_owned()), (2, "ActionSet".to_owned())]
        );
        let Op::ActionSet { from, state, .. } = &folded[1].1 else {
            unreachable!()
        };
        assert_eq!((*from, state), (StateTag::Pending, &applied()));
        // An edit the copy never made of a call the batch moved on (the file refuses it,
        // as it would have unfolded) stays after that move.
        let records = vec![
            stage(2),
            set(2, StateTag::Pending, ActionState::Rejected),
            amend(2, "late"),
        ];
        let folded = fold(numbered(records));
        assert_eq!(
            shape(&folded),
            [
                (1, "ActionInsert".to_owned()),
                (3, "ActionAmend".to_owned())
            ]
        );
        let Op::ActionInsert { record, .. } = &folded[0].1 else {
            unreachable!()
        };
        assert_eq!(*record.args, json!({ "n": 2 }));
    }
}
