//! Signing what the hub sends and checking what a receiver gets: the WebSub
//! `X-Hub-Signature`, the outbox webhook signature, and the Standard
//! Webhooks signature an outbox feed may choose instead (over id, timestamp
//! and body, so that a receiver can refuse a replayed request by its age).
//! Pure functions, tested with fixed vectors.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Sha256, Sha384, Sha512};

/// The WebSub authenticated-distribution header.
pub const HUB_SIGNATURE_HEADER: &str = "X-Hub-Signature";
/// The header naming the event a WebSub delivery carries; receivers
/// de-duplicate on it (delivery is at least once).
pub const EVENT_ID_HEADER: &str = "X-WebSub-Event-ID";
/// The outbox webhook signature header (the messaging contract).
pub const MESSAGING_SIGNATURE_HEADER: &str = "X-Bootstrapify-Messaging-Signature";
/// The outbox webhook event-id header (the messaging contract).
pub const MESSAGING_EVENT_ID_HEADER: &str = "X-Bootstrapify-Messaging-Event-ID";

/// The prefix of a Standard Webhooks secret; the rest is the key, base64.
pub const STANDARD_SECRET_PREFIX: &str = "whsec_";

/// The key a Standard Webhooks secret (`whsec_<base64>`) holds, or why it
/// holds none.
pub fn standard_key(secret: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    let Some(encoded) = secret.strip_prefix(STANDARD_SECRET_PREFIX) else {
        return Err(format!("must start with {STANDARD_SECRET_PREFIX}"));
    };
    let key = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|error| format!("is not {STANDARD_SECRET_PREFIX} and base64: {error}"))?;
    if key.is_empty() {
        return Err("holds an empty key".to_owned());
    }
    Ok(key)
}

/// The Standard Webhooks `webhook-signature` value: `v1,<base64 of
/// HMAC-SHA256 over "<id>.<timestamp>.<body>" keyed with key>`.
pub fn sign_standard(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    use base64::Engine;
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// `sha256=<lowercase hex HMAC-SHA256 of body keyed with secret>`: the value
/// of both [`HUB_SIGNATURE_HEADER`] and [`MESSAGING_SIGNATURE_HEADER`].
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(body);
    // Into a buffer of the exact size: `hex::encode` builds its string a
    // character at a time, which shows at one signature per delivery.
    const PREFIX: &[u8] = b"sha256=";
    let mut value = [0_u8; PREFIX.len() + 64];
    let (prefix, digits) = value.split_at_mut(PREFIX.len());
    prefix.copy_from_slice(PREFIX);
    hex::encode_to_slice(mac.finalize().into_bytes(), digits)
        .unwrap_or_else(|_| unreachable!("a SHA-256 digest is 64 hex digits"));
    String::from_utf8(value.to_vec()).unwrap_or_else(|_| unreachable!("hex is ASCII"))
}

/// Checks a signature header over the raw body, before the body is decoded,
/// in constant time. Accepts every method the WebSub Recommendation names:
/// `sha1=` (which this hub never sends, but other hubs may), `sha256=`,
/// `sha384=` and `sha512=`; anything else (no header, another method, bad
/// hex) is `false`.
pub fn verify(secret: &[u8], body: &[u8], header: Option<&str>) -> bool {
    let Some((method, digest)) = header.and_then(|value| value.trim().split_once('=')) else {
        return false;
    };
    let Ok(digest) = hex::decode(digest) else {
        return false;
    };
    match method.to_ascii_lowercase().as_str() {
        "sha1" => check::<Hmac<sha1::Sha1>>(secret, body, &digest),
        "sha256" => check::<Hmac<Sha256>>(secret, body, &digest),
        "sha384" => check::<Hmac<Sha384>>(secret, body, &digest),
        "sha512" => check::<Hmac<Sha512>>(secret, body, &digest),
        _ => false,
    }
}

fn check<M: Mac + KeyInit>(secret: &[u8], body: &[u8], digest: &[u8]) -> bool {
    let Ok(mut mac) = <M as KeyInit>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    // verify_slice compares in constant time.
    mac.verify_slice(digest).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The Standard Webhooks specification's example.
    #[test]
    fn standard_signatures_match_the_specification() {
        let key = standard_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("a valid secret");
        assert_eq!(
            sign_standard(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn standard_secrets_need_their_prefix_and_base64() {
        assert!(standard_key("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(standard_key("whsec_not base64!").is_err());
        assert!(standard_key("whsec_").is_err());
    }

    // RFC 4231, test case 2.
    const KEY: &[u8] = b"Jefe";
    const DATA: &[u8] = b"what do ya want for nothing?";
    const SHA256: &str = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
    const SHA512: &str = "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737";

    #[test]
    fn signs_with_lowercase_hex_sha256() {
        assert_eq!(sign(KEY, DATA), format!("sha256={SHA256}"));
    }

    // RFC 2202, test case 2 (HMAC-SHA-1), and RFC 4231's SHA-384.
    const SHA1: &str = "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79";
    const SHA384: &str = "af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649";

    #[test]
    fn every_method_the_recommendation_names_verifies() {
        for (method, digest) in [
            ("sha1", SHA1),
            ("sha256", SHA256),
            ("sha384", SHA384),
            ("sha512", SHA512),
        ] {
            assert!(
                verify(KEY, DATA, Some(&format!("{method}={digest}"))),
                "{method}"
            );
            assert!(
                !verify(b"other", DATA, Some(&format!("{method}={digest}"))),
                "{method}"
            );
        }
        assert!(!verify(KEY, DATA, Some(&format!("md5={SHA1}"))));
    }

    #[test]
    fn verifies_what_it_signs_and_the_rfc_vectors() {
        assert!(verify(KEY, DATA, Some(&sign(KEY, DATA))));
        assert!(verify(KEY, DATA, Some(&format!("sha512={SHA512}"))));
        assert!(verify(
            KEY,
            DATA,
            Some(&format!("SHA256={}", SHA256.to_uppercase()))
        ));
    }

    #[test]
    fn refuses_tampering_and_garbage() {
        let signature = sign(KEY, DATA);
        assert!(!verify(
            KEY,
            b"what do ya want for nothing!",
            Some(&signature)
        ));
        assert!(!verify(b"other", DATA, Some(&signature)));
        assert!(!verify(KEY, DATA, None));
        assert!(!verify(KEY, DATA, Some("sha256=zz")));
        assert!(!verify(KEY, DATA, Some(&format!("md5={SHA256}"))));
        assert!(!verify(KEY, DATA, Some(SHA256)));
        assert!(!verify(KEY, DATA, Some(&signature[..signature.len() - 2])));
    }

    #[test]
    fn empty_secret_and_body_still_sign() {
        assert_eq!(
            sign(b"", b""),
            "sha256=b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"
        );
    }
}
