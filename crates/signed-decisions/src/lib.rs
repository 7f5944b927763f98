//! A person's decision signed with a passkey over exactly what was shown: the paired
//! devices and their passkeys, the signed record of every decision made on the review page,
//! and how `gate ledger verify` checks each one again from the record alone.
//!
//! A decision's WebAuthn challenge is not random: it is the SHA-256 of a [`Statement`]
//! (the decision, the ledger ids, each call's digest as the person saw it, the reason, a
//! fresh nonce and the page's origin). The authenticator signs the challenge, so the
//! signature covers exactly what was shown; the record keeps the statement and the whole
//! assertion, and anyone holding the data directory can check both again with the same
//! code that accepted them ([`verify`]).

/// The WebAuthn library the ceremonies run on, for the page that starts them.
pub use webauthn_rs;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use webauthn_rs::prelude::{
    AuthenticationResult, Passkey, PasskeyAuthentication, PublicKeyCredential,
    RequestChallengeResponse, Url, Webauthn, WebauthnBuilder,
};

/// The file of paired devices in the data directory (owner-only).
pub const DEVICES_FILE: &str = "devices.json";
/// The append-only file of decisions signed on the review page (owner-only).
pub const SIGNED_FILE: &str = "web-decisions.jsonl";

/// One paired device: its name, whose it is, its passkey as registered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Device {
    /// The name the person gave it at pairing (`phone`).
    pub name: String,
    /// The operating system's user who ran `gate pair`: the person it decides as.
    pub owner: String,
    /// The passkey as registered; kept unchanged so old assertions verify against it.
    pub passkey: Passkey,
    /// When it was paired (milliseconds since the Unix epoch).
    pub paired_at: u64,
    /// When it was revoked, if it was: decisions it signs after that are refused.
    #[serde(default)]
    pub revoked_at: Option<u64>,
    /// The highest signature counter seen from it (a counter that goes back means a
    /// copied authenticator, and is refused).
    #[serde(default)]
    pub counter: u32,
}

impl Device {
    /// Whether it may sign now.
    pub fn active(&self) -> bool {
        self.revoked_at.is_none()
    }

    /// Whether `raw_id` is its credential.
    pub fn holds(&self, raw_id: &[u8]) -> bool {
        self.passkey.cred_id().as_slice() == raw_id
    }
}

/// The paired devices, kept in [`DEVICES_FILE`] and rewritten whole (temporary file,
/// sync, rename) on every change.
#[derive(Debug)]
pub struct Devices {
    path: PathBuf,
    list: Vec<Device>,
}

impl Devices {
    /// Read the devices of `data_dir` (none when the file does not exist yet).
    pub fn open(data_dir: &Path) -> Result<Self, String> {
        let path = data_dir.join(DEVICES_FILE);
        let list = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{} cannot be read ({e}); restore it from a backup, or move it away and pair the devices again with `gate pair`",
                    path.display()
                )
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(error) => return Err(format!("could not read {}: {error}", path.display())),
        };
        Ok(Self { path, list })
    }

    /// Every device, revoked ones included.
    pub fn all(&self) -> &[Device] {
        &self.list
    }

    /// The passkeys that may sign now.
    pub fn active_passkeys(&self) -> Vec<Passkey> {
        self.list
            .iter()
            .filter(|d| d.active())
            .map(|d| d.passkey.clone())
            .collect()
    }

    /// The device whose credential is `raw_id`.
    pub fn holding(&self, raw_id: &[u8]) -> Option<&Device> {
        self.list.iter().find(|d| d.holds(raw_id))
    }

    /// Add a device; a name already in use (by an active device) is refused.
    pub fn add(&mut self, device: Device) -> Result<(), String> {
        if self
            .list
            .iter()
            .any(|d| d.active() && d.name == device.name)
        {
            return Err(format!(
                "a device is already paired as {:?}; choose another name, or revoke that one first (`gate devices revoke {}`)",
                device.name, device.name
            ));
        }
        self.list.push(device);
        self.save()
    }

    /// Revoke the active device called `name`, at `now`; its name, or why not.
    pub fn revoke(&mut self, name: &str, now: u64) -> Result<(), String> {
        let Some(device) = self.list.iter_mut().find(|d| d.active() && d.name == name) else {
            let names: Vec<&str> = self
                .list
                .iter()
                .filter(|d| d.active())
                .map(|d| d.name.as_str())
                .collect();
            return Err(if names.is_empty() {
                format!("no device is paired as {name:?}; no device is paired at all")
            } else {
                format!(
                    "no device is paired as {name:?}; the paired ones are: {}",
                    names.join(", ")
                )
            });
        };
        device.revoked_at = Some(now);
        self.save()
    }

    /// Record that `raw_id` signed with `counter`; refused when the counter went back
    /// (a cloned authenticator). A counter of 0 means the authenticator keeps none.
    pub fn advance(&mut self, raw_id: &[u8], counter: u32) -> Result<(), String> {
        let Some(device) = self.list.iter_mut().find(|d| d.holds(raw_id)) else {
            return Err("that passkey belongs to no paired device".to_owned());
        };
        if counter != 0 && counter <= device.counter {
            return Err(format!(
                "device {:?} signed with counter {counter}, not above the {} it reached before: its passkey may have been copied; revoke it (`gate devices revoke {}`) and pair it again",
                device.name, device.counter, device.name
            ));
        }
        if counter != 0 {
            device.counter = counter;
            self.save()?;
        }
        Ok(())
    }

    fn save(&self) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("could not write {}: {e}", self.path.display());
        let temporary = self.path.with_extension("json.new");
        let text = serde_json::to_vec_pretty(&self.list).expect("devices serialise");
        let mut file = private_file(&temporary, true).map_err(fail)?;
        file.write_all(&text).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        std::fs::rename(&temporary, &self.path).map_err(fail)?;
        Ok(())
    }
}

/// Open `path` for writing, created owner-only (0600); truncated or appended to.
fn private_file(path: &Path, truncate: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(truncate)
        .append(!truncate)
        .mode(0o600)
        .open(path)
}

/// What a decision on the page says, signed as its challenge's preimage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    /// `approve`, `approve-all-of-kind`, `reject` or `revoke-rule`.
    pub decision: String,
    /// The ledger ids it decides (none for a rule's revocation).
    pub ids: Vec<u64>,
    /// For each id, the digest of the call as the page showed it (tool, definition and
    /// arguments: `gatekeeper_core::edit::call_digest`).
    pub digests: Vec<String>,
    /// The reason given with a rejection, or the rule a revocation names.
    pub reason: Option<String>,
    /// Whether the page showed every character of the arguments.
    pub full_seen: bool,
    /// Fresh for each decision: a statement is accepted once.
    pub nonce: String,
    /// The page's origin the assertion must come from.
    pub origin: String,
    /// When the page asked to sign (milliseconds since the Unix epoch).
    pub issued_at: u64,
}

impl Statement {
    /// The challenge the authenticator signs: SHA-256 of the statement's JSON.
    pub fn challenge(&self) -> Vec<u8> {
        Sha256::digest(serde_json::to_vec(self).expect("a statement serialises")).to_vec()
    }
}

/// One signed decision as [`SIGNED_FILE`] keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Signed {
    /// What was decided.
    pub statement: Statement,
    /// The device that signed, by name.
    pub device: String,
    /// The relying party id the passkey is bound to (`localhost`, or the page's host).
    pub rp_id: String,
    /// The assertion, as the browser sent it.
    pub assertion: PublicKeyCredential,
}

/// The relying party of `origin`: its host name and the WebAuthn checks bound to it.
pub fn relying_party(origin: &str) -> Result<(String, Webauthn), String> {
    let url = Url::parse(origin).map_err(|e| format!("the page's origin {origin:?}: {e}"))?;
    let host = url
        .host_str()
        .ok_or_else(|| format!("the page's origin {origin:?} names no host"))?
        .to_owned();
    let webauthn = WebauthnBuilder::new(&host, &url)
        .and_then(|b| b.rp_name("gate").build())
        .map_err(|e| format!("passkeys cannot be bound to {origin:?}: {e}"))?;
    Ok((host, webauthn))
}

/// Begin an assertion by any of `passkeys` whose challenge is `challenge` (a decision's
/// [`Statement::challenge`]) instead of the crate's random one: the options for the browser
/// and the state to finish with.
pub fn bound_assertion(
    webauthn: &Webauthn,
    passkeys: &[Passkey],
    challenge: &[u8],
) -> Result<(RequestChallengeResponse, PasskeyAuthentication), String> {
    let (mut options, state) = webauthn
        .start_passkey_authentication(passkeys)
        .map_err(|e| format!("could not start a passkey assertion: {e}"))?;
    options.public_key.challenge = challenge.to_vec();
    // The state's challenge is private to the crate; it is set through its serialised form,
    // where it is the unpadded base64url text of the bytes.
    let mut value = serde_json::to_value(&state).expect("the ceremony's state serialises");
    let slot = value
        .pointer_mut("/ast/challenge")
        .ok_or("the passkey crate's state has no challenge where expected")?;
    *slot = serde_json::Value::String(base64url(challenge));
    let state = serde_json::from_value(value)
        .map_err(|e| format!("the passkey crate's state could not be rebuilt: {e}"))?;
    Ok((options, state))
}

/// Check `assertion` against `passkey` for `statement`: the signature, the origin, the
/// user's verification, and that its challenge is the statement's.
pub fn check(
    webauthn: &Webauthn,
    passkey: &Passkey,
    statement: &Statement,
    assertion: &PublicKeyCredential,
) -> Result<AuthenticationResult, String> {
    let (_, state) = bound_assertion(
        webauthn,
        std::slice::from_ref(passkey),
        &statement.challenge(),
    )?;
    webauthn
        .finish_passkey_authentication(assertion, &state)
        .map_err(|e| format!("the assertion does not verify: {e}"))
}

/// Append a signed decision to `data_dir`'s [`SIGNED_FILE`], synced before it returns.
pub fn append(data_dir: &Path, signed: &Signed) -> Result<(), String> {
    let path = data_dir.join(SIGNED_FILE);
    let fail = |e: std::io::Error| {
        format!(
            "could not record the signed decision in {}: {e}",
            path.display()
        )
    };
    let mut line = serde_json::to_vec(signed).expect("a signed decision serialises");
    line.push(b'\n');
    let mut file = private_file(&path, false).map_err(fail)?;
    file.write_all(&line).map_err(fail)?;
    file.sync_data().map_err(fail)?;
    Ok(())
}

/// What `gate ledger verify` found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Decisions whose signature and binding check.
    pub good: usize,
    /// Each one that does not: its line in the file and why.
    pub bad: Vec<(usize, String)>,
}

/// Check every decision recorded in `data_dir`'s [`SIGNED_FILE`] against the devices
/// registered there: a readable record, a device holding the signing credential, not
/// revoked before the decision, the statement's digest as the challenge, a valid signature.
pub fn verify(data_dir: &Path) -> Result<Verified, String> {
    let devices = Devices::open(data_dir)?;
    let path = data_dir.join(SIGNED_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(format!("could not read {}: {error}", path.display())),
    };
    let mut verified = Verified::default();
    for (index, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match verify_line(&devices, line) {
            Ok(()) => verified.good += 1,
            Err(why) => verified.bad.push((index + 1, why)),
        }
    }
    Ok(verified)
}

fn verify_line(devices: &Devices, line: &str) -> Result<(), String> {
    let signed: Signed =
        serde_json::from_str(line).map_err(|e| format!("the record cannot be read: {e}"))?;
    let device = devices
        .holding(&signed.assertion.raw_id)
        .ok_or("it was signed by a passkey no paired device holds")?;
    if device.name != signed.device {
        return Err(format!(
            "it says device {:?} signed, but the passkey is device {:?}'s",
            signed.device, device.name
        ));
    }
    if device
        .revoked_at
        .is_some_and(|revoked| revoked <= signed.statement.issued_at)
    {
        return Err(format!(
            "device {:?} was revoked before this decision was made",
            device.name
        ));
    }
    let (rp_id, webauthn) = relying_party(&signed.statement.origin)?;
    if rp_id != signed.rp_id {
        return Err(format!(
            "it names relying party {:?}, but its origin's is {rp_id:?}",
            signed.rp_id
        ));
    }
    check(
        &webauthn,
        &device.passkey,
        &signed.statement,
        &signed.assertion,
    )
    .map(|_| ())
}

/// `bytes` as unpadded base64url text.
pub fn base64url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
