//! Key names of one Redis store, and the digests and ids they are built
//! from. The layout itself is described in the [module doc](super).

use sha2::{Digest, Sha256};

use crate::StoreError;

/// The layout this code writes, kept in the registry's slot so that a store
/// written in another layout is refused rather than misread.
pub(super) const LAYOUT_VERSION: &str = "2";

/// How many expiry buckets a store has. Fixed: the buckets are the slots
/// `list_expiring` visits, and an id's bucket must never move.
pub(super) const EXPIRY_BUCKETS: usize = 16;

/// Key names of one store, all built from its prefix.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: String,
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Result<Self, StoreError> {
        // The prefix opens every hash tag: a brace would end or open a tag
        // early and move keys out of the slot they must share.
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(StoreError::Invalid(format!(
                "redis key prefix {prefix:?} must be non-empty and without braces"
            )));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    /// The hash tag of a topic: the topic's hashes and its id set share it.
    fn topic_tag(&self, topic_digest: &str) -> String {
        format!("{{{}:{topic_digest}}}", self.prefix)
    }

    pub(super) fn subscription(&self, pair: &Pair) -> String {
        format!("{}:sub:{}", self.topic_tag(&pair.topic_digest), pair.id)
    }

    /// What a script appends an id to for the subscription hashes of the
    /// topic whose id set it was given.
    pub(super) fn subscription_prefix(&self, topic_digest: &str) -> String {
        format!("{}:sub:", self.topic_tag(topic_digest))
    }

    pub(super) fn members(&self, topic_digest: &str) -> String {
        format!("{}:ids", self.topic_tag(topic_digest))
    }

    pub(super) fn expiry(&self, bucket: usize) -> String {
        format!("{{{}:expiry:{bucket:x}}}", self.prefix)
    }

    pub(super) fn expiry_tokens(&self, bucket: usize) -> String {
        format!("{}:tokens", self.expiry(bucket))
    }

    pub(super) fn owner(&self, owner_digest: &str) -> String {
        format!("{{{}:owner:{owner_digest}}}", self.prefix)
    }

    pub(super) fn owner_pending(&self, owner_digest: &str) -> String {
        format!("{}:pending", self.owner(owner_digest))
    }

    pub(super) fn registry(&self) -> String {
        format!("{{{}:topics}}", self.prefix)
    }

    pub(super) fn registry_pending(&self) -> String {
        format!("{}:pending", self.registry())
    }

    pub(super) fn layout(&self) -> String {
        format!("{}:layout", self.registry())
    }
}

/// Where one (topic, callback) pair lives: its topic's digest (the hash
/// tag) and its id. The index entries that point at a subscription name
/// both, as [`member`](Self::member), so a reader can build the hash's key
/// from the entry alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Pair {
    pub(super) topic_digest: String,
    pub(super) id: String,
}

impl Pair {
    pub(super) fn of(topic: &str, callback: &str) -> Self {
        Self {
            topic_digest: digest(topic),
            id: subscription_id(topic, callback),
        }
    }

    /// `<topic digest>:<id>`, the entry of an owner's reservations.
    pub(super) fn member(&self) -> String {
        format!("{}:{}", self.topic_digest, self.id)
    }

    /// Reads a [`member`](Self::member) back; `None` for anything else.
    pub(super) fn from_member(member: &str) -> Option<Self> {
        let (topic_digest, id) = member.split_once(':')?;
        let hex = |part: &str| part.len() == 64 && part.bytes().all(|b| b.is_ascii_hexdigit());
        (hex(topic_digest) && hex(id)).then(|| Self {
            topic_digest: topic_digest.to_owned(),
            id: id.to_owned(),
        })
    }

    /// The expiry bucket of the pair, from the first digit of its id: ids
    /// are uniform, so the buckets fill evenly.
    pub(super) fn bucket(&self) -> usize {
        self.id
            .bytes()
            .next()
            .and_then(|digit| char::from(digit).to_digit(16))
            .map_or(0, |digit| digit as usize % EXPIRY_BUCKETS)
    }

    /// `<topic digest>:<id>:<expires_at µs>`, the pair's entry in its expiry
    /// bucket for one expiry. The expiry is part of the entry so that
    /// concurrent saves with different expiries each leave an entry of
    /// their own, and the entry of the hash's actual expiry is always there.
    pub(super) fn expiry_member(&self, expires_micros: i64) -> String {
        format!("{}:{}:{expires_micros}", self.topic_digest, self.id)
    }

    /// Reads an [`expiry_member`](Self::expiry_member) back.
    pub(super) fn from_expiry_member(member: &str) -> Option<(Self, i64)> {
        let (pair, expires) = member.rsplit_once(':')?;
        Some((Self::from_member(pair)?, expires.parse().ok()?))
    }
}

/// Hex SHA-256 of a string, for key names of unbounded strings.
pub(super) fn digest(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

/// The id of a pair. Both halves are length-prefixed so that no two pairs
/// hash the same input ("ab" + "c" versus "a" + "bc").
pub(super) fn subscription_id(topic: &str, callback: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [topic, callback] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_do_not_depend_on_where_topic_ends() {
        assert_ne!(subscription_id("ab", "c"), subscription_id("a", "bc"));
        assert_eq!(subscription_id("ab", "c").len(), 64);
    }

    #[test]
    fn prefixes_that_break_the_hash_tag_are_refused() {
        for prefix in ["", "a{b", "a}b"] {
            assert!(matches!(Keys::new(prefix), Err(StoreError::Invalid(_))));
        }
    }

    #[test]
    fn a_topic_keys_share_its_tag_and_indexes_have_their_own() {
        let Ok(keys) = Keys::new("hub") else {
            panic!("a valid prefix");
        };
        let pair = Pair::of("https://example.com/feed", "https://sub.example/cb");
        let tag = format!("{{hub:{}}}", pair.topic_digest);
        assert!(keys.subscription(&pair).starts_with(&tag));
        assert!(keys.members(&pair.topic_digest).starts_with(&tag));
        assert_eq!(keys.expiry(10), "{hub:expiry:a}");
        assert_eq!(keys.expiry_tokens(10), "{hub:expiry:a}:tokens");
        assert_eq!(keys.registry(), "{hub:topics}");
        assert_eq!(keys.layout(), "{hub:topics}:layout");
        assert!(keys.owner(&digest("alice")).starts_with("{hub:owner:"));
    }

    #[test]
    fn members_read_back() {
        let pair = Pair::of("t", "c");
        assert_eq!(Pair::from_member(&pair.member()), Some(pair.clone()));
        assert_eq!(
            Pair::from_expiry_member(&pair.expiry_member(-5)),
            Some((pair.clone(), -5))
        );
        assert_eq!(Pair::from_member("nonsense"), None);
        assert_eq!(Pair::from_expiry_member(&pair.member()), None);
        assert!(pair.bucket() < EXPIRY_BUCKETS);
    }
}
