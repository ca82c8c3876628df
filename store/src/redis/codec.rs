//! The one encoding of a subscription as a Redis hash, both ways.

use std::collections::HashMap;

use chrono::DateTime;

use crate::{StoreError, Subscription};

/// The hash fields of a subscription; an absent field is `None`.
pub(super) fn encode(
    subscription: &Subscription,
    owner_id: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut fields = vec![
        ("topic", subscription.topic.clone()),
        ("callback", subscription.callback.clone()),
        (
            "created_at",
            subscription.created_at.timestamp_micros().to_string(),
        ),
        (
            "verified_at",
            subscription.verified_at.timestamp_micros().to_string(),
        ),
    ];
    if let Some(secret) = &subscription.secret {
        fields.push(("secret", secret.clone()));
    }
    if let Some(lease) = subscription.lease_seconds {
        fields.push(("lease_seconds", lease.to_string()));
    }
    if let Some(expires_at) = subscription.expires_at {
        fields.push(("expires_at", expires_at.timestamp_micros().to_string()));
    }
    if let Some(owner) = &subscription.owner {
        fields.push(("owner", owner.clone()));
    }
    if let Some(owner_id) = owner_id {
        fields.push(("owner_id", owner_id.to_owned()));
    }
    fields
}

/// A subscription hash as Redis returns it. Bytes rather than strings so a
/// value that is not UTF-8 is reported as [`StoreError::Invalid`] by
/// [`decode`] instead of failing inside the client.
pub(super) type RawHash = HashMap<Vec<u8>, Vec<u8>>;

/// The one place a stored hash becomes a [`Subscription`].
pub(super) fn decode(mut hash: RawHash) -> Result<Subscription, StoreError> {
    let mut text = |field: &str| -> Result<Option<String>, StoreError> {
        hash.remove(field.as_bytes())
            .map(|bytes| {
                String::from_utf8(bytes)
                    .map_err(|_| StoreError::Invalid(format!("redis field {field} is not UTF-8")))
            })
            .transpose()
    };
    let required = |field: &str, value: Option<String>| {
        value.ok_or_else(|| StoreError::Invalid(format!("redis subscription lacks {field}")))
    };
    let time = |field: &str, value: String| {
        value
            .parse::<i64>()
            .ok()
            .and_then(DateTime::from_timestamp_micros)
            .ok_or_else(|| StoreError::Invalid(format!("redis field {field} is not a timestamp")))
    };

    let topic = required("topic", text("topic")?)?;
    let callback = required("callback", text("callback")?)?;
    let created_at = time("created_at", required("created_at", text("created_at")?)?)?;
    let verified_at = time(
        "verified_at",
        required("verified_at", text("verified_at")?)?,
    )?;
    let expires_at = text("expires_at")?
        .map(|value| time("expires_at", value))
        .transpose()?;
    let lease_seconds = text("lease_seconds")?
        .map(|value| {
            value.parse::<u32>().map_err(|_| {
                StoreError::Invalid("redis field lease_seconds is not a u32".to_owned())
            })
        })
        .transpose()?;
    let secret = text("secret")?;
    let owner = text("owner")?;
    Ok(Subscription {
        topic,
        callback,
        secret,
        lease_seconds,
        created_at,
        verified_at,
        expires_at,
        owner,
    })
}

/// The digest of the owner a stored hash names, if any.
pub(super) fn owner_of(hash: &RawHash) -> Option<&[u8]> {
    hash.get(b"owner_id".as_slice()).map(Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_hashes_are_invalid() {
        let sub = Subscription::new("t", "c").with_secret("").with_owner("o");
        let hash = |fields: Vec<(&'static str, String)>| -> RawHash {
            fields
                .into_iter()
                .map(|(field, value)| (field.as_bytes().to_vec(), value.into_bytes()))
                .collect()
        };
        let good = encode(&sub, Some("x"));
        assert_eq!(owner_of(&hash(good.clone())), Some(b"x".as_slice()));
        assert_eq!(decode(hash(good.clone())).ok(), Some(sub));

        let without_topic = good
            .iter()
            .filter(|(f, _)| *f != "topic")
            .cloned()
            .collect();
        assert!(matches!(
            decode(hash(without_topic)),
            Err(StoreError::Invalid(_))
        ));

        let mut bad_time = good.clone();
        bad_time.push(("expires_at", "soon".to_owned()));
        assert!(matches!(
            decode(hash(bad_time)),
            Err(StoreError::Invalid(_))
        ));

        let mut not_utf8 = hash(good);
        not_utf8.insert(b"callback".to_vec(), vec![0xff]);
        assert!(matches!(decode(not_utf8), Err(StoreError::Invalid(_))));
    }
}
