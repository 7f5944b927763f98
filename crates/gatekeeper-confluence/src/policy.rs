//! The policy: the reference's behaviour, or ours, or any mix a lecture wants to show.
//!
//! Every difference between the reference (the Confluence gatekeeper of Cloudflare OS's
//! Gatekeeper, `cloudflare/cloudflare-os`) and this driver is one switch here, five in
//! all: three for the reference's pitfalls, two for further gaps (see
//! `docs/ARCHITECTURE.md`). So a lecture can run the same script twice and print both
//! outcomes side by side. The overlay rules themselves (`overlay.rs`) are the same under
//! every policy.

use std::fmt;

/// Which of the reference's gaps this driver closes. [`Policy::default`] is
/// [`Policy::GUARDED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Pitfall 1, stale proposals. A replace or retitle remembers the version it was
    /// staged against: the one the agent's session last read (the version at staging,
    /// said on the card, if it never read the page); if the page moved on (other than by
    /// this gatekeeper's own earlier actions) applying it writes nothing and fails for
    /// good, naming both versions. A replace, append or retitle of a page in the trash
    /// writes nothing (an update would restore it), and an append stacked on a replace
    /// that failed for good fails for good too.
    /// Off (reference): the replace is applied over whatever the page holds now, and an
    /// edit of a trashed page publishes it again.
    pub refuse_stale: bool,
    /// Pitfall 2, semantic dependencies. A session remembers the pending actions whose
    /// effect it has read, and the actions it staged itself; every action it stages
    /// afterwards carries in `depends_on` those it read (pending, rejected or failed for
    /// good) and its own still pending, the latter as a chain (the latest one names the
    /// one before). The kernel flags it when one of them is
    /// rejected, fails for good or is reverted, and the driver refuses to apply it while
    /// one of them is still pending ("approve or reject #k first").
    /// Off (reference): nothing is remembered.
    pub track_dependencies: bool,
    /// Pitfall 3, revert that respects others. Revert of an append removes exactly the
    /// appended block; revert of a replace or retitle proceeds only if the page has not
    /// changed since the apply; a label revert undoes only a change it made; a create is
    /// trashed only while the page is unchanged since it was created. Revert never takes
    /// a page out of the trash, and refuses when the record holds no apply data.
    /// Otherwise revert refuses and writes nothing.
    /// Off (reference): revert writes back the snapshot taken at staging.
    pub careful_revert: bool,
    /// Apply in simulation order: an action is refused ("apply #k first") while an
    /// earlier action on the same content, or on its provisional parent, is pending.
    /// Off (reference): actions are applied in whatever order they are approved.
    pub ordered_apply: bool,
    /// Report the actions a rejected create took with it as `RejectOutcome::cascaded`,
    /// so the kernel marks them rejected. Off (reference): they vanish from the driver
    /// but stay pending in the kernel, and approving one fails with "unknown action".
    pub report_cascade: bool,
}

impl Policy {
    /// The reference's behaviour, gaps included, for side-by-side lectures.
    pub const REFERENCE: Policy = Policy {
        refuse_stale: false,
        track_dependencies: false,
        careful_revert: false,
        ordered_apply: false,
        report_cascade: false,
    };

    /// Ours: every gap closed. The default.
    pub const GUARDED: Policy = Policy {
        refuse_stale: true,
        track_dependencies: true,
        careful_revert: true,
        ordered_apply: true,
        report_cascade: true,
    };

    /// The reference's behaviour.
    pub fn reference() -> Self {
        Self::REFERENCE
    }

    /// Ours.
    pub fn guarded() -> Self {
        Self::GUARDED
    }

    /// "reference", "guarded", or "custom" for a mix.
    pub fn name(&self) -> &'static str {
        if *self == Self::REFERENCE {
            "reference"
        } else if *self == Self::GUARDED {
            "guarded"
        } else {
            "custom"
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self::GUARDED
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
