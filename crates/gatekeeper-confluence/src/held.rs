//! One stored action as the driver's in-memory index holds it: the value stored in the
//! key-value port, shared with the port, and what reads and the indexes need, as
//! fixed-size fields and spans of that value.
//!
//! A record is held once. The index keeps the stored value itself, a [`Bytes`] handle:
//! with the in-memory store ([`crate::MemoryKv`]) the very allocation the store's map
//! holds; with SQLite the buffer the row was read into (the file is SQLite's). Beside it,
//! parsed once when the record is written or loaded: its id, ledger id and state, its
//! action with every text (body, title, label, comment, space key) as a [`Span`] of the
//! value, and where its `depends_on` ids lie in the value. A read folds the texts in
//! place ([`Pending`]): nothing is decoded on a read, which matters because decoding a
//! record costs over 100 ns, several µs per read of a page with 50 pending actions. The
//! rest of a record (what staging captured, what applying did, why it failed) is decoded
//! on demand ([`HeldRecord::record`]), by apply, reject and revert.
//!
//! The spans are found by reading the value with borrowed mirrors of the stored layout
//! ([`ActionRecord`] in [`StoredRecord`]), which postcard encodes field after field with
//! no framing: the mirrors read the envelope and the record up to `depends_on` with
//! their texts borrowed, then the ids, then the rest, which must end the value.

use std::ops::Range;

use bytes::Bytes;
use kernel::{DriverActionId, LedgerId, Timestamp};
use serde::Deserialize;

use crate::overlay::Pending;
use crate::record::{ActionRecord, Applied, RecordState, StoredRecord, StoredV1, WikiActionOf};

/// Where one text of a record lies in its stored value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    start: u32,
    len: u32,
}

impl Span {
    /// Where `part`, borrowed from `value` by the decoder, lies in it. `value` is at most
    /// `u32::MAX` bytes long ([`HeldRecord::parse`] checks).
    fn of(value: &[u8], part: &[u8]) -> Self {
        let start = (part.as_ptr() as usize).saturating_sub(value.as_ptr() as usize);
        Self {
            start: start as u32,
            len: part.len() as u32,
        }
    }

    /// From byte `start` of the value to byte `end`.
    fn between(start: usize, end: usize) -> Self {
        Self {
            start: start as u32,
            len: end.saturating_sub(start) as u32,
        }
    }

    fn range(self) -> Range<usize> {
        let start = self.start as usize;
        start..start + self.len as usize
    }
}

/// [`StoredRecord`], read as far as an action's `depends_on`.
#[derive(Deserialize)]
enum EnvelopeHead<'a> {
    #[serde(borrow)]
    V1(ValueHead<'a>),
}

/// [`StoredV1`], read as far as an action's `depends_on`. The other values are only
/// told apart by their position, so they are never read.
#[derive(Deserialize)]
#[allow(dead_code)]
enum ValueHead<'a> {
    Counter(u64),
    #[serde(borrow)]
    Action(RecordHead<'a>),
    Provisional(u64),
    Space(u64),
}

/// The fields of [`ActionRecord`] before `depends_on`, in their order, texts borrowed.
#[derive(Deserialize)]
struct RecordHead<'a> {
    id: DriverActionId,
    ledger: Option<LedgerId>,
    #[serde(borrow)]
    action: WikiActionOf<&'a str>,
    state: RecordState,
    _submitted_at: Timestamp,
    #[serde(borrow)]
    _staging: StagingHead<'a>,
}

/// [`crate::record::Staging`], texts borrowed: read only to get past it.
#[derive(Deserialize)]
struct StagingHead<'a> {
    _base_version: u64,
    #[serde(borrow)]
    _previous_markdown: Option<&'a str>,
    #[serde(borrow)]
    _previous_title: Option<&'a str>,
}

/// The fields of [`ActionRecord`] after `depends_on`, in their order: decoded for a
/// moment when a value is held, to check that they end it and to see whether applying
/// recorded a write.
#[derive(Deserialize)]
struct RecordTail {
    applied: Option<Applied>,
    _failure: Option<String>,
}

/// One stored action record, held once: its stored value, and what reads and the
/// indexes need as fixed-size fields and spans of it.
#[derive(Debug)]
pub(crate) struct HeldRecord {
    value: Bytes,
    id: DriverActionId,
    ledger: Option<LedgerId>,
    state: RecordState,
    action: WikiActionOf<Span>,
    /// The ids of `depends_on`, after its length.
    depends_on: Span,
    /// Whether applying it recorded a write that moved the content's version.
    wrote: bool,
}

impl HeldRecord {
    /// Hold `value`, a value read from or written to the port. `Ok(None)`: it is a valid
    /// value, but not an action record.
    pub(crate) fn parse(value: Bytes) -> Result<Option<Self>, postcard::Error> {
        let whole: &[u8] = &value;
        if u32::try_from(whole.len()).is_err() {
            return Err(postcard::Error::DeserializeBadEncoding);
        }
        let (EnvelopeHead::V1(head), rest) = postcard::take_from_bytes::<EnvelopeHead<'_>>(whole)?;
        let ValueHead::Action(head) = head else {
            if rest.is_empty() {
                return Ok(None);
            }
            return Err(postcard::Error::DeserializeBadEncoding);
        };
        let action = head.action.map(|text| Span::of(whole, text.as_bytes()));
        let (count, mut rest) = postcard::take_from_bytes::<usize>(rest)?;
        let ids_start = whole.len() - rest.len();
        for _ in 0..count {
            (_, rest) = postcard::take_from_bytes::<DriverActionId>(rest)?;
        }
        let depends_on = Span::between(ids_start, whole.len() - rest.len());
        let (tail, rest) = postcard::take_from_bytes::<RecordTail>(rest)?;
        if !rest.is_empty() {
            return Err(postcard::Error::DeserializeBadEncoding);
        }
        Ok(Some(Self {
            id: head.id,
            ledger: head.ledger,
            state: head.state,
            action,
            depends_on,
            wrote: tail.applied.is_some_and(|a| a.write.is_some()),
            value,
        }))
    }

    /// The value as stored in the port: the same allocation when the port keeps
    /// [`Bytes`] itself ([`crate::MemoryKv`]).
    pub(crate) fn value(&self) -> &Bytes {
        &self.value
    }

    /// Where the record is in its life.
    pub(crate) fn state(&self) -> RecordState {
        self.state
    }

    /// The kernel's id for it, once `submit_action` answered.
    pub(crate) fn ledger(&self) -> Option<LedgerId> {
        self.ledger
    }

    /// Whether applying it recorded a write that moved its content's version.
    pub(crate) fn wrote(&self) -> bool {
        self.wrote
    }

    /// What it depends on, read from the stored value.
    pub(crate) fn depends_on(&self) -> impl Iterator<Item = DriverActionId> + '_ {
        let mut rest = self.text(&self.depends_on);
        std::iter::from_fn(move || {
            let (id, more) = postcard::take_from_bytes::<DriverActionId>(rest).ok()?;
            rest = more;
            Some(id)
        })
    }

    /// One of its texts, copied out.
    pub(crate) fn string(&self, text: &Span) -> String {
        crate::overlay::copy_text(self.text(text))
    }

    /// How people name it: the ledger id (`#5`) once known, else the driver id.
    pub(crate) fn display_id(&self) -> String {
        crate::record::display_id(self.id, self.ledger)
    }

    /// The whole record, decoded from the stored value.
    pub(crate) fn record(&self) -> ActionRecord {
        match StoredRecord::decode(&self.value) {
            Ok(StoredRecord::V1(StoredV1::Action(record))) => *record,
            // `parse` read this very value as an action, through mirrors of the same
            // layout (the tests below check that the two readings agree).
            _ => unreachable!("a held value decodes as the action it was parsed as"),
        }
    }
}

impl Pending for HeldRecord {
    type Text = Span;

    fn id(&self) -> DriverActionId {
        self.id
    }

    fn action(&self) -> &WikiActionOf<Span> {
        &self.action
    }

    fn text<'s>(&'s self, text: &'s Span) -> &'s [u8] {
        self.value.get(text.range()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::ContentHandle;
    use crate::record::{ContentKind, ContentStatus, Parent, Staging, VersionedWrite, WikiAction};

    const PAGE: ContentHandle = ContentHandle::Real(100);

    /// One action of every kind, each text distinct and some not ASCII.
    fn actions() -> Vec<WikiAction> {
        vec![
            WikiAction::Create {
                provisional: 2,
                kind: ContentKind::Page,
                parent: Parent::Page {
                    parent: ContentHandle::Provisional(1),
                    space: "ÖPS".into(),
                },
                title: "Child".into(),
                content: Some("stop — now".into()),
                status: ContentStatus::Draft,
            },
            WikiAction::Create {
                provisional: 3,
                kind: ContentKind::BlogPost,
                parent: Parent::Space {
                    space: "NEWS".into(),
                },
                title: String::new(),
                content: None,
                status: ContentStatus::Current,
            },
            WikiAction::SetContent {
                target: PAGE,
                markdown: "# Runbook\n\nall new".into(),
            },
            WikiAction::AppendContent {
                target: ContentHandle::Provisional(7),
                markdown: "Step 1: check the dashboards.".into(),
            },
            WikiAction::SetTitle {
                target: PAGE,
                title: "Renamed ✓".into(),
            },
            WikiAction::AddComment {
                target: PAGE,
                text: "looks right".into(),
            },
            WikiAction::AddLabel {
                target: PAGE,
                name: "urgent".into(),
            },
            WikiAction::RemoveLabel {
                target: PAGE,
                name: "stale".into(),
            },
            WikiAction::Trash { target: PAGE },
            WikiAction::Restore { target: PAGE },
        ]
    }

    /// `action` in records as full as a record gets, and as empty.
    fn records(id: u64, action: WikiAction) -> [ActionRecord; 2] {
        let full = ActionRecord {
            id: DriverActionId(id),
            ledger: Some(kernel::LedgerId(id + 40)),
            action: action.clone(),
            state: RecordState::Applied,
            submitted_at: Timestamp(1_700_000_000_000),
            staging: Staging {
                base_version: 3,
                previous_markdown: Some("old body".into()),
                previous_title: Some("old title".into()),
            },
            depends_on: vec![
                DriverActionId(1),
                DriverActionId(300),
                DriverActionId(u64::MAX),
            ],
            applied: Some(Applied {
                created: Some(9),
                write: Some(VersionedWrite {
                    before: 3,
                    after: 4,
                    previous_body: "<p>old</p>".into(),
                    previous_title: "old".into(),
                }),
                appended: Some("<p>more</p>".into()),
                label_changed: Some(true),
            }),
            failure: Some("stale".into()),
        };
        [full, ActionRecord::pending(id, action)]
    }

    fn held(record: &ActionRecord) -> HeldRecord {
        let value = StoredRecord::V1(StoredV1::Action(Box::new(record.clone()))).encode();
        HeldRecord::parse(Bytes::from(value)).unwrap().unwrap()
    }

    #[test]
    fn the_spans_read_back_every_text_and_the_rest_decodes_on_demand() {
        for (n, action) in (1..).zip(actions()) {
            for record in records(n, action) {
                let held = held(&record);
                let texts = held.action().map(|span| held.string(&span));
                assert_eq!(texts, record.action, "{record:?}");
                assert_eq!(held.id(), record.id);
                assert_eq!(held.ledger(), record.ledger);
                assert_eq!(held.state(), record.state);
                assert_eq!(held.depends_on().collect::<Vec<_>>(), record.depends_on);
                assert_eq!(
                    held.wrote(),
                    record.applied.as_ref().is_some_and(|a| a.write.is_some())
                );
                assert_eq!(held.display_id(), record.display_id());
                assert_eq!(held.record(), record);
            }
        }
    }

    #[test]
    fn every_span_lies_in_the_stored_value() {
        let record = &records(4, actions().remove(0))[0];
        let held = held(record);
        let value = held.value().as_ptr_range();
        let WikiActionOf::Create {
            parent,
            title,
            content: Some(content),
            ..
        } = held.action()
        else {
            panic!("a create");
        };
        for span in [parent.space(), title, content] {
            let text = held.text(span).as_ptr_range();
            assert!(value.start <= text.start && text.end <= value.end);
        }
    }

    #[test]
    fn other_values_are_not_actions_and_damaged_ones_are_refused() {
        for other in [
            StoredV1::Counter(7),
            StoredV1::Provisional(200),
            StoredV1::Space(98_304),
        ] {
            let value = Bytes::from(StoredRecord::V1(other).encode());
            assert!(HeldRecord::parse(value).unwrap().is_none());
        }
        let whole = StoredRecord::V1(StoredV1::Action(Box::new(
            records(5, actions().remove(2))[0].clone(),
        )))
        .encode();
        for cut in [1, whole.len() / 2, whole.len() - 1] {
            let value = Bytes::copy_from_slice(&whole[..cut]);
            assert!(HeldRecord::parse(value).is_err(), "cut at {cut}");
        }
        let mut longer = whole.clone();
        longer.push(0);
        assert!(HeldRecord::parse(Bytes::from(longer)).is_err());
    }
}
