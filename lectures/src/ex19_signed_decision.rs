//! ex19: a decision signed over exactly what the person was shown.
//!
//! The review page (`[web]` in `gate.toml`) lets the person decide from a phone. Every
//! decision there is a passkey assertion whose challenge is the digest of a statement: the
//! decision, the ledger ids and each call's digest as the page showed it. This lecture runs
//! that mechanism (`signed-decisions`, the code the daemon and `gate ledger verify` use)
//! without a browser: the relying party of `http://localhost:8790`, and a software passkey
//! standing in for the phone's, a fixed P-256 key so that the transcript repeats. It shows
//! the signature accepted for what was shown, refused for a call that changed, refused when
//! replayed or copied, and checked again from the record alone, where one changed byte
//! fails.

use std::io::Write;
use std::path::PathBuf;

use gatekeeper_core::edit::call_digest;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use signed_decisions::webauthn_rs::prelude::{
    CreationChallengeResponse, PublicKeyCredential, RegisterPublicKeyCredential,
    RequestChallengeResponse, Uuid,
};
use signed_decisions::{Device, Devices, Signed, Statement, base64url};

use crate::setup::paragraph;
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex19",
    title: "a decision signed over exactly what was shown",
    summary: "a passkey signs the digest of the calls a page showed; a changed call, a replay and a copied key are refused, and the record verifies alone",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// The review page's origin in the lecture.
const ORIGIN: &str = "http://localhost:8790";

/// A passkey in software, standing in for the one a phone keeps in its secure hardware:
/// it answers the browser's two ceremonies (create, get) as an authenticator does, with a
/// fixed key and credential id.
struct SoftPasskey {
    key: SigningKey,
    id: Vec<u8>,
    counter: u32,
}

impl SoftPasskey {
    fn new() -> anyhow::Result<Self> {
        let key = SigningKey::from_slice(&[7u8; 32])?;
        Ok(Self {
            key,
            id: b"lecture-phone-passkey".to_vec(),
            counter: 0,
        })
    }

    /// The authenticator data: the relying party's hash, the flags, the counter, and
    /// (registering) the credential with its public key.
    fn authenticator_data(&self, rp_id: &str, flags: u8, credential: Option<&[u8]>) -> Vec<u8> {
        let mut data = Sha256::digest(rp_id.as_bytes()).to_vec();
        data.push(flags);
        data.extend_from_slice(&self.counter.to_be_bytes());
        if let Some(public_key) = credential {
            data.extend_from_slice(&[0u8; 16]); // no AAGUID
            data.extend_from_slice(&u16::try_from(self.id.len()).unwrap_or(0).to_be_bytes());
            data.extend_from_slice(&self.id);
            data.extend_from_slice(public_key);
        }
        data
    }

    /// The public key as a COSE map in CBOR: EC2, ES256, P-256, x, y.
    fn cose_key(&self) -> Vec<u8> {
        let point = self.key.verifying_key().to_sec1_point(false);
        let bytes = point.as_bytes();
        let (x, y) = (&bytes[1..33], &bytes[33..65]);
        let mut key = vec![0xa5, 0x01, 0x02, 0x03, 0x26, 0x20, 0x01, 0x21, 0x58, 0x20];
        key.extend_from_slice(x);
        key.extend_from_slice(&[0x22, 0x58, 0x20]);
        key.extend_from_slice(y);
        key
    }

    fn client_data(kind: &str, challenge: &[u8]) -> Vec<u8> {
        json!({"type": kind, "challenge": base64url(challenge), "origin": ORIGIN, "crossOrigin": false})
            .to_string()
            .into_bytes()
    }

    /// `navigator.credentials.create`: a new credential, attested with format "none".
    fn create(
        &self,
        options: &CreationChallengeResponse,
    ) -> anyhow::Result<RegisterPublicKeyCredential> {
        let rp_id = options.public_key.rp.id.clone();
        // User present, user verified, credential data included.
        let data = self.authenticator_data(&rp_id, 0x45, Some(&self.cose_key()));
        let mut object = vec![0xa3, 0x63];
        object.extend_from_slice(b"fmt");
        object.push(0x64);
        object.extend_from_slice(b"none");
        object.push(0x67);
        object.extend_from_slice(b"attStmt");
        object.push(0xa0);
        object.push(0x68);
        object.extend_from_slice(b"authData");
        object.push(0x58);
        object.push(u8::try_from(data.len())?);
        object.extend_from_slice(&data);
        let client = Self::client_data("webauthn.create", &options.public_key.challenge);
        Ok(serde_json::from_value(json!({
            "id": base64url(&self.id),
            "rawId": base64url(&self.id),
            "type": "public-key",
            "response": {
                "attestationObject": base64url(&object),
                "clientDataJSON": base64url(&client),
            },
        }))?)
    }

    /// `navigator.credentials.get`: sign the authenticator data and the client data's hash.
    fn get(&mut self, options: &RequestChallengeResponse) -> anyhow::Result<PublicKeyCredential> {
        self.counter += 1;
        let data = self.authenticator_data(&options.public_key.rp_id, 0x05, None);
        let client = Self::client_data("webauthn.get", &options.public_key.challenge);
        let mut signed = data.clone();
        signed.extend_from_slice(&Sha256::digest(&client));
        let signature: Signature = self.key.sign(&signed);
        Ok(serde_json::from_value(json!({
            "id": base64url(&self.id),
            "rawId": base64url(&self.id),
            "type": "public-key",
            "response": {
                "authenticatorData": base64url(&data),
                "clientDataJSON": base64url(&client),
                "signature": base64url(signature.to_der().as_bytes()),
                "userHandle": null,
            },
        }))?)
    }
}

/// A scratch data directory, removed at the end.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The first line of an error, for the transcript.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    let scratch =
        Scratch(std::env::temp_dir().join(format!("gate-lecture-ex19-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    std::fs::create_dir_all(&scratch.0)?;
    let data_dir = scratch.0.as_path();
    let (rp_id, webauthn) = signed_decisions::relying_party(ORIGIN).map_err(anyhow::Error::msg)?;
    let mut phone = SoftPasskey::new()?;
    paragraph(
        cx,
        &[
            "The review page lets the person decide from a phone. Its passkey signs every",
            "decision; the gate accepts a signature only over what the page showed. A software",
            "passkey with a fixed key plays the phone here; the checks are the daemon's own.",
        ],
    )?;

    cx.section("1. alice pairs her phone (`gate pair --name phone`)")?;
    let (options, state) =
        webauthn.start_passkey_registration(Uuid::nil(), "alice@gate", "alice (phone)", None)?;
    let created = phone.create(&options)?;
    let passkey = webauthn.finish_passkey_registration(&created, &state)?;
    let mut devices = Devices::open(data_dir).map_err(anyhow::Error::msg)?;
    devices
        .add(Device {
            name: "phone".into(),
            owner: "alice".into(),
            passkey: passkey.clone(),
            paired_at: 1_000,
            revoked_at: None,
            counter: 0,
        })
        .map_err(anyhow::Error::msg)?;
    cx.evidence("relying party", &rp_id)?;
    cx.evidence("passkey registered for device", "phone, deciding as alice")?;

    cx.section("2. The page shows #1 and alice approves it")?;
    let shown = json!({"text": "release notes for 2.4"});
    let digest = call_digest("write_note", "v1", &shown);
    cx.evidence("#1 write_note, as shown", &shown)?;
    cx.evidence("its digest (tool, definition, arguments)", &digest)?;
    let statement = Statement {
        decision: "approve".into(),
        ids: vec![1],
        digests: vec![digest],
        reason: None,
        full_seen: false,
        nonce: "nonce-1".into(),
        origin: ORIGIN.into(),
        issued_at: 2_000,
    };
    let challenge = statement.challenge();
    cx.evidence(
        "challenge = sha256(statement)",
        challenge
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            + "…",
    )?;
    let (options, _) =
        signed_decisions::bound_assertion(&webauthn, std::slice::from_ref(&passkey), &challenge)
            .map_err(anyhow::Error::msg)?;
    let assertion = phone.get(&options)?;
    let result = signed_decisions::check(&webauthn, &passkey, &statement, &assertion)
        .map_err(anyhow::Error::msg)?;
    devices
        .advance(result.cred_id().as_slice(), result.counter())
        .map_err(anyhow::Error::msg)?;
    cx.evidence("the gate checks the signature", "accepted")?;
    signed_decisions::append(
        data_dir,
        &Signed {
            statement: statement.clone(),
            device: "phone".into(),
            rp_id: rp_id.clone(),
            assertion: assertion.clone(),
        },
    )
    .map_err(anyhow::Error::msg)?;
    writeln!(
        cx,
        "  recorded in web-decisions.jsonl (synced), then approved as \"alice via passkey phone\""
    )?;

    cx.section("3. Had the call changed after the page showed it")?;
    let changed = json!({"text": "release notes for 2.4, and delete the wiki"});
    let other = Statement {
        digests: vec![call_digest("write_note", "v1", &changed)],
        ..statement.clone()
    };
    cx.evidence("#1 write_note, as it would be sent", &changed)?;
    let refused = signed_decisions::check(&webauthn, &passkey, &other, &assertion)
        .err()
        .unwrap_or_else(|| "accepted".into());
    cx.evidence("alice's signature over it", first_line(&refused))?;

    cx.section("4. The same signature replayed for another decision")?;
    let replay = Statement {
        decision: "approve".into(),
        ids: vec![2],
        digests: vec![call_digest("write_note", "v1", &json!({"text": "notes"}))],
        nonce: "nonce-2".into(),
        ..statement.clone()
    };
    let refused = signed_decisions::check(&webauthn, &passkey, &replay, &assertion)
        .err()
        .unwrap_or_else(|| "accepted".into());
    cx.evidence("approve #2 with #1's signature", first_line(&refused))?;
    let copied = devices
        .advance(result.cred_id().as_slice(), result.counter())
        .err()
        .unwrap_or_else(|| "accepted".into());
    cx.evidence(
        "the same counter again (a copied passkey)",
        first_line(&copied),
    )?;

    cx.section("5. `gate ledger verify`: the record alone")?;
    let verified = signed_decisions::verify(data_dir).map_err(anyhow::Error::msg)?;
    cx.evidence(
        "verified, failed",
        format!("{}, {}", verified.good, verified.bad.len()),
    )?;
    let file = data_dir.join(signed_decisions::SIGNED_FILE);
    let text = std::fs::read_to_string(&file)?;
    let mut record: Value = serde_json::from_str(text.trim())?;
    let tampered = record["statement"]["digests"][0]
        .as_str()
        .unwrap_or_default()
        .replacen('a', "b", 1);
    record["statement"]["digests"][0] = json!(tampered);
    std::fs::write(&file, format!("{record}\n"))?;
    let verified = signed_decisions::verify(data_dir).map_err(anyhow::Error::msg)?;
    cx.evidence(
        "one digest byte changed: verified, failed",
        format!("{}, {}", verified.good, verified.bad.len()),
    )?;
    for (line, why) in &verified.bad {
        cx.evidence(&format!("line {line}"), first_line(why))?;
    }
    std::fs::write(&file, text)?;
    devices.revoke("phone", 1_500).map_err(anyhow::Error::msg)?;
    let verified = signed_decisions::verify(data_dir).map_err(anyhow::Error::msg)?;
    writeln!(
        cx,
        "  the file restored, and the phone marked revoked before the decision was made:"
    )?;
    for (line, why) in &verified.bad {
        cx.evidence(&format!("line {line}"), first_line(why))?;
    }
    Ok(())
}
