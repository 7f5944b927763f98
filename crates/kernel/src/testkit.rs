//! Conformance checks for [`LedgerStore`] backends (feature `testkit`): what every durable
//! ledger must do, written once and run by each store's tests against its own handles.

use std::sync::Arc;

use crate::{
    ActionDescription, ActionEntry, ActionKind, ActionState, DriverActionId, EntryBody,
    LedgerEntry, LedgerId, LedgerStore, MemoryLedger, Resolution, Timestamp,
};

/// A small deterministic generator for the random sequences of these checks.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator for `seed` (any value; zero is avoided).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A builder for [`LedgerStore::insert`]: a pending action of `gatekeeper` with driver id
/// `driver` (also its creation time), submitted by `agent`.
pub fn pending_entry(
    gatekeeper: &str,
    driver: u64,
    description: ActionDescription,
) -> impl FnMut(LedgerId) -> LedgerEntry {
    let gatekeeper: Arc<str> = Arc::from(gatekeeper);
    let description = Arc::new(description);
    move |id| LedgerEntry {
        id,
        gatekeeper: gatekeeper.clone(),
        caller: Arc::from("agent"),
        created_at: Timestamp(driver),
        body: EntryBody::Action(ActionEntry {
            driver_id: DriverActionId(driver),
            description: description.clone(),
            state: ActionState::Pending,
            resolution: None,
            failure: None,
            depends_on: vec![],
            blocked_by: None,
            restart_requested: false,
            revert: None,
        }),
    }
}

/// Two handles on one durable ledger, as two processes would hold it.
pub trait TwoLedgers {
    /// Handle `0` or `1`.
    fn ledger(&self, handle: usize) -> &dyn LedgerStore;
    /// Make what `handle` wrote visible to the other handle (commit what it deferred).
    fn commit(&self, handle: usize);
}

/// Drive two handles of a fresh ledger (`open`, once per seed) through random inserts,
/// decisions and flags, and check after every step that both answer exactly as one
/// [`MemoryLedger`] would: entries, open actions, each entry and each driver id. The
/// acting handle also answers as the model before its writes are committed.
pub fn two_ledgers_answer_as_one_model<H: TwoLedgers>(mut open: impl FnMut() -> H) {
    for seed in 1..=25u64 {
        let handles = open();
        let model = MemoryLedger::new();
        let mut rng = XorShift::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let mut highest = 0u64;
        for step in 0..60u64 {
            let h = rng.below(2) as usize;
            let ledger = handles.ledger(h);
            let id = LedgerId(1 + rng.below(highest.max(1) + 1));
            let known = model.get(id).unwrap();
            let op = rng.below(5);
            let what = format!("seed {seed}, step {step}, handle {h}, op {op}, entry {id}");
            let decided = |by: &str| Resolution {
                by: by.into(),
                auto: step % 2 == 0,
                at: Timestamp(step),
                cause: None,
            };
            match op {
                0 | 1 => {
                    let driver = 100 + step;
                    let mut made =
                        pending_entry("gk", driver, ActionDescription::new("write", "body"));
                    let stored = ledger.insert(&mut made).unwrap();
                    let expected = model.insert(&mut made).unwrap();
                    assert_eq!(stored, expected, "insert: {what}");
                    highest = highest.max(stored.0);
                }
                2 => {
                    // A person's decision on a pending action, approver first.
                    let Some(mut entry) = known
                        .filter(|e| e.action().is_some_and(|a| a.state == ActionState::Pending))
                    else {
                        continue;
                    };
                    ledger.record_attempt(id, &decided("ana")).unwrap();
                    model.record_attempt(id, &decided("ana")).unwrap();
                    // The acting handle answers as the model at once (from inside its open
                    // transaction, where it defers the write); both do once it commits.
                    assert_eq!(ledger.get(id).unwrap(), model.get(id).unwrap(), "{what}");
                    handles.commit(h);
                    for other in 0..2 {
                        let other = handles.ledger(other);
                        assert_eq!(other.get(id).unwrap(), model.get(id).unwrap(), "{what}");
                    }
                    let action = entry.action_mut().unwrap();
                    action.state = if step % 3 == 0 {
                        ActionState::Rejected
                    } else {
                        ActionState::Approved
                    };
                    action.resolution = Some(decided("ana"));
                    ledger.put(entry.clone()).unwrap();
                    model.put(entry).unwrap();
                }
                3 => {
                    // Flag an open action as blocked by another (a rejected dependency).
                    let Some(mut entry) = known.filter(|e| e.action().is_some_and(|a| a.is_open()))
                    else {
                        continue;
                    };
                    entry.action_mut().unwrap().blocked_by = Some(LedgerId(1));
                    ledger.put(entry.clone()).unwrap();
                    model.put(entry).unwrap();
                }
                _ => {}
            }
            handles.commit(h);
            // Both handles answer as the model, whatever each remembered.
            for other in 0..2 {
                let ledger = handles.ledger(other);
                let what = format!("{what}, read by handle {other}");
                assert_eq!(
                    ledger.entries().unwrap(),
                    model.entries().unwrap(),
                    "entries: {what}"
                );
                assert_eq!(
                    ledger.open_action_ids("gk").unwrap(),
                    model.open_action_ids("gk").unwrap(),
                    "open: {what}"
                );
                for n in 1..=highest + 1 {
                    let id = LedgerId(n);
                    assert_eq!(
                        ledger.get(id).unwrap(),
                        model.get(id).unwrap(),
                        "get {n}: {what}"
                    );
                    let driver = DriverActionId(100 + n);
                    assert_eq!(
                        ledger.find_action("gk", driver).unwrap(),
                        model.find_action("gk", driver).unwrap(),
                        "find driver {}: {what}",
                        driver.0
                    );
                }
            }
        }
    }
}

/// A rule with every part of its scope set, enabled at a time of its own.
pub fn scoped_rule() -> crate::AutoApprovalRule {
    crate::AutoApprovalRule {
        enabled_at: crate::Timestamp(1234),
        scope: crate::RuleScope {
            caller: Some("agent-7".into()),
            session: Some("session-3".into()),
            until: Some(crate::Timestamp(86_400_000)),
            arguments: vec![
                crate::ArgumentTest {
                    argument: "path".into(),
                    check: crate::ArgumentCheck::Under("/tmp/a".into()),
                },
                crate::ArgumentTest {
                    argument: "count".into(),
                    check: crate::ArgumentCheck::AtMost(10),
                },
            ],
        },
        ..crate::AutoApprovalRule::new("gk", ActionKind::new("gk:write", "write"), "carol")
    }
}

/// Entry `id` as `ledger` reads it, rejected by "reviewer" and written back with `put`
/// (a decision made through another handle than the one that wrote the entry).
pub fn reject_by_reviewer(ledger: &dyn LedgerStore, id: LedgerId) -> LedgerEntry {
    let mut decided = ledger.get(id).unwrap().unwrap();
    let action = decided.action_mut().unwrap();
    action.state = ActionState::Rejected;
    action.resolution = Some(Resolution {
        by: "reviewer".into(),
        auto: false,
        at: Timestamp(9),
        cause: None,
    });
    ledger.put(decided.clone()).unwrap();
    decided
}

/// Put rules into `ledger` so that each way of writing one is taken: the scoped rule
/// over an older whole-kind rule of its kind, and a whole-kind rule over an older scoped
/// one (which must lose its scope). Returns the rules as `rules()` must answer them.
pub fn put_scoped_rules(ledger: &dyn LedgerStore) -> Vec<crate::AutoApprovalRule> {
    let scoped = scoped_rule();
    ledger
        .put_rule(&crate::AutoApprovalRule::new(
            "gk",
            ActionKind::new("gk:write", "write"),
            "bob",
        ))
        .unwrap();
    ledger.put_rule(&scoped).unwrap();
    let read = ActionKind::new("gk:read", "read");
    ledger
        .put_rule(&crate::AutoApprovalRule {
            kind: read.clone(),
            ..scoped_rule()
        })
        .unwrap();
    let whole = crate::AutoApprovalRule::new("gk", read, "dave");
    ledger.put_rule(&whole).unwrap();
    // Ordered by gatekeeper, then tag.
    vec![whole, scoped]
}

/// `ledger` answers `expected` (ordered as `rules()` orders them) exactly, from
/// `rules()` and from `rule()` of each.
pub fn assert_rules(ledger: &dyn LedgerStore, expected: &[crate::AutoApprovalRule]) {
    assert_eq!(ledger.rules().unwrap(), expected);
    for rule in expected {
        let read = ledger.rule(&rule.gatekeeper, &rule.kind.tag).unwrap();
        assert_eq!(read.as_deref(), Some(rule));
    }
}
