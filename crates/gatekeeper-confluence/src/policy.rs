//! The policy: the reference's behaviour, or ours, or any mix a lecture wants to show.
//!
//! Every difference between the reference (cloudflare-os `gatekeeper-confluence` at
//! HEAD, spec `reference-confluence.md`) and this driver is one switch here, so a
//! lecture can run the same script twice and print both outcomes side by side. The
//! overlay rules themselves (spec §3) are the same under every policy.

use std::fmt;

/// Which of the reference's gaps this driver closes. [`Policy::default`] is
/// [`Policy::GUARDED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Pitfall 1, stale proposals. A replace or retitle remembers the version it was
    /// staged against; if the page moved on (other than by this gatekeeper's own earlier
    /// actions) applying it writes nothing and fails for good, naming both versions.
    /// Off (reference): the replace is applied over whatever the page holds now.
    pub refuse_stale: bool,
    /// Pitfall 2, semantic dependencies. A session remembers the pending actions whose
    /// effect it has read, and every action it stages afterwards carries them in
    /// `depends_on`; the kernel then flags it when one of them is rejected.
    /// Off (reference): nothing is remembered.
    pub track_dependencies: bool,
    /// Pitfall 3, revert that respects others. Revert of an append removes exactly the
    /// appended block; revert of a replace or retitle proceeds only if the page has not
    /// changed since the apply; a label revert undoes only a change it made. Otherwise
    /// revert refuses and writes nothing.
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
