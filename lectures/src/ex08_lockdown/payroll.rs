//! A tiny second driver for ex08: a payroll service whose one read is sensitive.
//!
//! Written in the style of `gatekeeper-issues`: the service is outside the OS (it keeps a
//! table and counts calls); the driver is a kernel [`Gatekeeper`] with no actions, and the
//! agent reaches the table only through a [`PayrollSession`], which asks the kernel to
//! authorize the read as an observation with `prohibit_all_sharing` set, and hands the data
//! over only if the kernel said yes. The lecture never calls the kernel for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use kernel::{
    ActionKind, ApprovalQueue, DriverActionId, Gatekeeper, GatekeeperError, LedgerId,
    ObservationDescription, Overseer, QueueError, RejectOutcome, RevertOutcome,
};
use prompt_sanitize::{MAX_INLINE_CHARS, Markdown, Sanitized, plain_inline};

/// OUTSIDE THE OS: the payroll system, a table of salaries.
#[derive(Debug, Default)]
pub(crate) struct PayrollService {
    calls: AtomicUsize,
}

impl PayrollService {
    /// How many reads reached the payroll system.
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn salaries(&self) -> String {
        self.calls.fetch_add(1, Ordering::SeqCst);
        "name   | salary\nAiko   | 9,100,000\nBruno  | 8,400,000\nChidi  | 7,950,000".to_owned()
    }
}

/// The payroll driver: reads only, every one of them sensitive.
pub(crate) struct PayrollGatekeeper {
    name: String,
    service: Arc<PayrollService>,
}

impl PayrollGatekeeper {
    pub(crate) fn new(name: &str, service: Arc<PayrollService>) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            service,
        })
    }

    /// A session over the payroll table for `caller`, recording through the kernel.
    pub(crate) fn grant(
        self: &Arc<Self>,
        overseer: &Overseer,
        caller: &str,
    ) -> Result<PayrollSession, kernel::DecisionError> {
        Ok(PayrollSession {
            gatekeeper: self.clone(),
            queue: overseer.queue_for(&self.name, caller)?,
        })
    }
}

const NO_ACTIONS: &str = "the payroll gatekeeper submits no actions, so there is nothing to decide";

#[async_trait]
impl Gatekeeper for PayrollGatekeeper {
    fn name(&self) -> &str {
        &self.name
    }

    async fn apply_action(&self, _action: DriverActionId) -> Result<(), GatekeeperError> {
        Err(GatekeeperError::fatal(NO_ACTIONS))
    }

    async fn reject_action(
        &self,
        _action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        Err(GatekeeperError::fatal(NO_ACTIONS))
    }

    async fn revert_action(
        &self,
        _action: DriverActionId,
    ) -> Result<RevertOutcome, GatekeeperError> {
        Err(GatekeeperError::fatal(NO_ACTIONS))
    }

    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        Vec::new()
    }
}

/// The agent's handle on the payroll table.
pub(crate) struct PayrollSession {
    gatekeeper: Arc<PayrollGatekeeper>,
    queue: Arc<dyn ApprovalQueue>,
}

impl PayrollSession {
    /// Reads the salaries table. The data is returned only after the kernel authorized the
    /// observation, which is marked sensitive: authorizing it latches lockdown.
    pub(crate) async fn read_salaries(&self) -> Result<(String, LedgerId), QueueError> {
        let data = self.gatekeeper.service.salaries();
        let server = plain_inline("Payroll", MAX_INLINE_CHARS);
        let title = Sanitized::concat(&[&server, &Sanitized::literal(": read salaries")]);
        let description = Markdown::new()
            .line(&[
                &Sanitized::literal("Read the **salaries** table of **"),
                &server,
                &Sanitized::literal("**."),
            ])
            .text("It holds personal data: once it is read, nothing may leave this workspace.")
            .build();
        let observation = self
            .queue
            .authorize_observation(ObservationDescription {
                title: title.into_string(),
                description: description.into_string(),
                prohibit_all_sharing: true,
            })
            .await?;
        Ok((data, observation))
    }
}
