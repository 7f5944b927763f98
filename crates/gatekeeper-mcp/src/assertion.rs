//! A signed client assertion (RFC 7523, `private_key_jwt`): how a gate that is a client
//! of its own proves who it is to an authorization server with a key instead of a shared
//! secret. ES256 (P-256) signed with ring, which the TLS stack already carries: rmcp's
//! own support for it comes with a JWT library built on aws-lc, which needs cmake.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom as _, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject as _;
use serde_json::json;

/// How long an assertion is valid: long enough for one token request.
const LIFETIME_SECONDS: u64 = 60;

/// The assertion's `client_assertion_type`.
pub const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// A P-256 private key that signs assertions.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    random: SystemRandom,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(ES256)")
    }
}

impl SigningKey {
    /// The key in `pem` (PKCS #8, `BEGIN PRIVATE KEY`), which must be a P-256 key.
    pub fn from_pem(pem: &str) -> Result<Self, String> {
        let key = PrivateKeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| format!("it is not a PEM private key ({e})"))?;
        let PrivateKeyDer::Pkcs8(der) = key else {
            return Err(
                "it is not a PKCS #8 key (BEGIN PRIVATE KEY); convert it with `openssl pkcs8 -topk8 -nocrypt`"
                    .to_owned(),
            );
        };
        let random = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            der.secret_pkcs8_der(),
            &random,
        )
        .map_err(|e| format!("it is not a P-256 key for ES256 ({e})"))?;
        Ok(Self { pair, random })
    }

    /// A signed assertion that `client_id` is asking `audience` (the authorization
    /// server's issuer) for a token, issued at `now` (seconds since the epoch).
    pub fn assertion(&self, client_id: &str, audience: &str, now: u64) -> Result<String, String> {
        let mut id = [0u8; 16];
        self.random
            .fill(&mut id)
            .map_err(|_| "no random bytes for the assertion's id".to_owned())?;
        let header = json!({"alg": "ES256", "typ": "JWT"});
        let claims = json!({
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "iat": now,
            "exp": now + LIFETIME_SECONDS,
            "jti": id.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .pair
            .sign(&self.random, signed.as_bytes())
            .map_err(|_| "the assertion could not be signed".to_owned())?;
        Ok(format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ECDSA_P256_SHA256_FIXED, KeyPair as _, UnparsedPublicKey};

    #[test]
    fn an_assertion_is_signed_by_the_key_and_names_the_client_and_the_audience() {
        let random = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &random).expect("a key");
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        let key = SigningKey::from_pem(&pem).expect("a P-256 key");
        let jwt = key
            .assertion("gate", "https://as.example", 1000)
            .expect("signed");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("base64url"))
                .expect("json");
        assert_eq!(claims["iss"], "gate");
        assert_eq!(claims["sub"], "gate");
        assert_eq!(claims["aud"], "https://as.example");
        assert_eq!(claims["exp"], 1060);
        let public =
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, key.pair.public_key().as_ref());
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).expect("base64url");
        public
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
            .expect("the signature verifies");
        let mut forged = signature.clone();
        forged[0] ^= 1;
        assert!(
            public
                .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &forged)
                .is_err()
        );
        assert!(SigningKey::from_pem("not a key").is_err());
    }
}
