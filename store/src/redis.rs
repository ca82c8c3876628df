//! The Redis backend: subscription state shared by every hub process that
//! points at one Redis server, behind the `redis` feature.
//!
//! It owns the key layout below and the Lua scripts that keep it consistent;
//! the behaviour it promises is the [`SubscriptionStore`] contract.
//!
//! Every key of a store starts with the hash tag `{<prefix>}` (default
//! `{websub}`):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{p}:sub:<id>` | hash | one subscription (fields below) |
//! | `{p}:expiry` | sorted set | ids of leased subscriptions, scored by `expires_at` |
//! | `{p}:topic:<sha256(topic)>` | set | ids of the topic's subscriptions |
//! | `{p}:topics` | set | every topic with a subscription, as the topic string |
//! | `{p}:owner:<sha256(owner)>` | set | ids of the owner's subscriptions |
//!
//! `<id>` is the hex SHA-256 of the length-prefixed topic and callback, so
//! keys stay short whatever the URLs are. A subscription hash has the fields
//! `topic`, `callback`, `created_at`, `verified_at` and, when set, `secret`,
//! `lease_seconds`, `expires_at`, `owner`; timestamps are integer
//! microseconds since the Unix epoch. It also keeps `owner_id`, the owner's
//! digest, so a script that only has the hash can find the owner's set.
//!
//! [`list_by_topic_page`](SubscriptionStore::list_by_topic_page) walks a
//! topic in the order of its members' ids: a page reads and sorts every id of
//! the topic's set (in the server, without decoding any subscription) and
//! fetches only its own hashes. Walks in large pages keep that cheap.
//!
//! Redis TTLs are deliberately not used for leases: a hub has to see an
//! expired subscription to remove and report it, and an evaporated key
//! cannot be reported.

use std::collections::HashMap;
use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use redis::{Client, Script};
use sha2::{Digest, Sha256};

use crate::{OwnerQuota, StoreError, Subscription, SubscriptionStore, expiry_bound_micros};

/// The prefix [`RedisStore::connect`] uses.
pub const DEFAULT_PREFIX: &str = "websub";

/// Subscriptions kept in Redis, reached through a
/// [`ConnectionManager`] that reconnects on its own.
///
/// Cloning is cheap and clones share the connection.
#[derive(Debug, Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    keys: Keys,
}

impl RedisStore {
    /// Connects to the Redis server at `url` (e.g. `redis://127.0.0.1/`)
    /// with the prefix [`DEFAULT_PREFIX`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::with_prefix(url, DEFAULT_PREFIX).await
    }

    /// Connects to the Redis server at `url`, keeping every key under
    /// `prefix`; stores with different prefixes on one server never see each
    /// other's subscriptions.
    ///
    /// Fails with [`StoreError::Invalid`] if `prefix` is empty or contains
    /// `{` or `}`, since it becomes the keys' hash tag.
    pub async fn with_prefix(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let keys = Keys::new(prefix)?;
        let connection = ConnectionManager::new(Client::open(url)?).await?;
        Ok(Self { connection, keys })
    }

    /// A store over a connection manager the caller configured (timeouts,
    /// retries), keeping every key under `prefix` as in
    /// [`with_prefix`](Self::with_prefix).
    pub fn with_connection(
        connection: ConnectionManager,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            connection,
            keys: Keys::new(prefix)?,
        })
    }

    /// Runs the save script or the conditional one; they take the same keys
    /// and arguments except for the conditional one's limit, which comes
    /// before the hash fields.
    async fn run_save<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        subscription: &Subscription,
        limit: Option<u64>,
    ) -> Result<T, StoreError> {
        let id = subscription_id(&subscription.topic, &subscription.callback);
        let owner_id = subscription.owner.as_deref().map(digest);
        let expires_at = subscription
            .expires_at
            .map(|at| at.timestamp_micros().to_string());

        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.keys.subscription(&id))
            .key(self.keys.expiry())
            .key(self.keys.topic(&subscription.topic))
            .key(self.keys.topics());
        if let Some(owner_id) = &owner_id {
            invocation.key(self.keys.owner_by_id(owner_id));
        }
        invocation
            .arg(&id)
            .arg(&subscription.topic)
            .arg(expires_at.as_deref().unwrap_or(""))
            .arg(self.keys.owner_prefix())
            .arg(owner_id.as_deref().unwrap_or(""));
        if let Some(limit) = limit {
            invocation.arg(limit);
        }
        for (field, value) in encode(subscription, owner_id.as_deref()) {
            invocation.arg(field).arg(value);
        }
        Ok(invocation
            .invoke_async(&mut self.connection.clone())
            .await?)
    }
}

/// Key names of one store.
///
/// All of them carry the same hash tag, `{prefix}`, so they live in one
/// cluster hash slot: the scripts touch several keys at once, and some of
/// them (a previous owner's set, the hashes behind an index) only become
/// known inside the script. Redis Cluster runs a script only when all its
/// keys share a slot, so the tag is what keeps the layout cluster-ready.
/// The price is that one store lives on one cluster node, which subscription
/// state (small, and read far more than written) can afford.
#[derive(Debug, Clone)]
struct Keys {
    tag: String,
}

impl Keys {
    fn new(prefix: &str) -> Result<Self, StoreError> {
        // An empty tag `{}` is no tag at all to Redis, and a brace would end
        // the tag early; either would scatter the keys over slots.
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(StoreError::Invalid(format!(
                "redis key prefix {prefix:?} must be non-empty and without braces"
            )));
        }
        Ok(Self {
            tag: format!("{{{prefix}}}"),
        })
    }

    fn subscription_prefix(&self) -> String {
        format!("{}:sub:", self.tag)
    }

    fn subscription(&self, id: &str) -> String {
        format!("{}:sub:{id}", self.tag)
    }

    fn expiry(&self) -> String {
        format!("{}:expiry", self.tag)
    }

    fn topic(&self, topic: &str) -> String {
        format!("{}:topic:{}", self.tag, digest(topic))
    }

    fn topics(&self) -> String {
        format!("{}:topics", self.tag)
    }

    fn owner_prefix(&self) -> String {
        format!("{}:owner:", self.tag)
    }

    fn owner_by_id(&self, owner_id: &str) -> String {
        format!("{}:owner:{owner_id}", self.tag)
    }
}

/// Hex SHA-256 of a string, for key names of unbounded strings.
fn digest(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

/// The id of a pair. Both halves are length-prefixed so that no two pairs
/// hash the same input ("ab" + "c" versus "a" + "bc").
fn subscription_id(topic: &str, callback: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [topic, callback] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// The hash fields of a subscription; an absent field is `None`.
fn encode(subscription: &Subscription, owner_id: Option<&str>) -> Vec<(&'static str, String)> {
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
type RawHash = HashMap<Vec<u8>, Vec<u8>>;

/// The one place a stored hash becomes a [`Subscription`].
fn decode(mut hash: RawHash) -> Result<Subscription, StoreError> {
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

/// The body both saving scripts share: replaces the hash and moves the id
/// between indexes.
///
/// KEYS: subscription hash, expiry zset, topic set, topics set, and the
/// owner's set when there is an owner. ARGV: id, topic, expires_at in
/// microseconds or "" for permanent, the owner key prefix, the owner's digest
/// or "" for none; the hash's field/value pairs start at `first_field`.
///
/// The previous owner is read from the hash being replaced, which is why its
/// set's key is built here rather than passed in.
macro_rules! save_body {
    () => {
        r#"
local function save_subscription(first_field)
  local id = ARGV[1]
  local old_owner = redis.call('HGET', KEYS[1], 'owner_id')
  if old_owner and old_owner ~= ARGV[5] then
    redis.call('SREM', ARGV[4] .. old_owner, id)
  end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(ARGV, first_field))
  if ARGV[3] == '' then
    redis.call('ZREM', KEYS[2], id)
  else
    redis.call('ZADD', KEYS[2], ARGV[3], id)
  end
  redis.call('SADD', KEYS[3], id)
  redis.call('SADD', KEYS[4], ARGV[2])
  if ARGV[5] ~= '' then
    redis.call('SADD', KEYS[5], id)
  end
end
"#
    };
}

static SAVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(concat!(save_body!(), "save_subscription(6)\n")));

/// ARGV[6] is the limit. The count and the save run in one script, and Redis
/// runs one script at a time, which is what serialises conditional saves of
/// one owner across every process sharing the server. Returns the count it
/// saw when refusing, nil after saving.
static SAVE_WITHIN_LIMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        save_body!(),
        r#"
local used = redis.call('SCARD', KEYS[5])
if redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 1 then
  used = used - 1
end
if used >= tonumber(ARGV[6]) then
  return used
end
save_subscription(7)
return false
"#
    ))
});

/// KEYS: subscription hash, expiry zset, topic set, topics set. ARGV: id,
/// topic, owner key prefix. The indexes are cleaned even when the hash is
/// gone, which costs nothing and keeps a retried delete harmless.
static DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local id = ARGV[1]
local owner_id = redis.call('HGET', KEYS[1], 'owner_id')
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], id)
redis.call('SREM', KEYS[3], id)
if redis.call('SCARD', KEYS[3]) == 0 then
  redis.call('SREM', KEYS[4], ARGV[2])
end
if owner_id then
  redis.call('SREM', ARGV[3] .. owner_id, id)
end
"#,
    )
});

/// KEYS: the topic set. ARGV: subscription key prefix. One round trip for
/// the publish hot path instead of one per subscriber.
static LIST_MEMBERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local result = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local hash = redis.call('HGETALL', ARGV[1] .. id)
  if #hash > 0 then
    result[#result + 1] = hash
  end
end
return result
"#,
    )
});

/// KEYS: the topic set. ARGV: subscription key prefix, the id after which
/// the page starts ("" for the first page), the page size. A page follows
/// the order of the ids (hex digests of the pairs): the script reads every
/// member id of the topic, but only the page's hashes. An id whose hash is
/// missing is passed over, so a short page is still the last.
static LIST_PAGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local ids = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if id > ARGV[2] then
    ids[#ids + 1] = id
  end
end
table.sort(ids)
local limit = tonumber(ARGV[3])
local result = {}
for _, id in ipairs(ids) do
  if #result >= limit then
    break
  end
  local hash = redis.call('HGETALL', ARGV[1] .. id)
  if #hash > 0 then
    result[#result + 1] = hash
  end
end
return result
"#,
    )
});

/// KEYS: the expiry zset. ARGV: the score bound as ZRANGEBYSCORE takes it,
/// subscription key prefix.
static LIST_EXPIRING: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local result = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  local hash = redis.call('HGETALL', ARGV[2] .. id)
  if #hash > 0 then
    result[#result + 1] = hash
  end
end
return result
"#,
    )
});

/// Scores are doubles, which hold every integer up to 2^53 exactly: that is
/// microseconds until the year 2255.
const EXACT_SCORE_LIMIT: u64 = 1 << 53;

/// The ZRANGEBYSCORE upper bound that selects everything expiring strictly
/// before `before`, for stored expiries truncated to microseconds.
fn expiry_bound(before: DateTime<Utc>) -> String {
    let micros = expiry_bound_micros(before);
    if micros.unsigned_abs() < EXACT_SCORE_LIMIT {
        format!("({micros}")
    } else {
        // Beyond 2^53 neighbouring microseconds share a score, so an
        // exclusive bound could drop a subscription just before `before`;
        // the inclusive bound over-selects and the caller filters exactly.
        micros.to_string()
    }
}

#[async_trait]
impl SubscriptionStore for RedisStore {
    async fn save(&self, subscription: &Subscription) -> Result<(), StoreError> {
        self.run_save::<()>(&SAVE, subscription, None).await
    }

    async fn get(&self, topic: &str, callback: &str) -> Result<Subscription, StoreError> {
        let key = self.keys.subscription(&subscription_id(topic, callback));
        let hash: RawHash = redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut self.connection.clone())
            .await?;
        if hash.is_empty() {
            return Err(StoreError::unknown(topic, callback));
        }
        decode(hash)
    }

    async fn delete(&self, topic: &str, callback: &str) -> Result<(), StoreError> {
        let id = subscription_id(topic, callback);
        let () = DELETE
            .key(self.keys.subscription(&id))
            .key(self.keys.expiry())
            .key(self.keys.topic(topic))
            .key(self.keys.topics())
            .arg(&id)
            .arg(topic)
            .arg(self.keys.owner_prefix())
            .invoke_async(&mut self.connection.clone())
            .await?;
        Ok(())
    }

    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        let hashes: Vec<RawHash> = LIST_MEMBERS
            .key(self.keys.topic(topic))
            .arg(self.keys.subscription_prefix())
            .invoke_async(&mut self.connection.clone())
            .await?;
        hashes.into_iter().map(decode).collect()
    }

    async fn list_by_topic_page(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Subscription>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // The order is the ids', and the id of `after` is computed from the
        // pair, so a walk goes on past a callback deleted under it.
        let after = after.map(|callback| subscription_id(topic, callback));
        let hashes: Vec<RawHash> = LIST_PAGE
            .key(self.keys.topic(topic))
            .arg(self.keys.subscription_prefix())
            .arg(after.as_deref().unwrap_or(""))
            .arg(limit)
            .invoke_async(&mut self.connection.clone())
            .await?;
        hashes.into_iter().map(decode).collect()
    }

    async fn topics(&self) -> Result<Vec<String>, StoreError> {
        Ok(redis::cmd("SMEMBERS")
            .arg(self.keys.topics())
            .query_async(&mut self.connection.clone())
            .await?)
    }

    async fn list_expiring(&self, before: DateTime<Utc>) -> Result<Vec<Subscription>, StoreError> {
        let hashes: Vec<RawHash> = LIST_EXPIRING
            .key(self.keys.expiry())
            .arg(expiry_bound(before))
            .arg(self.keys.subscription_prefix())
            .invoke_async(&mut self.connection.clone())
            .await?;
        let mut expiring = Vec::with_capacity(hashes.len());
        for hash in hashes {
            let subscription = decode(hash)?;
            if subscription.expires_at.is_some_and(|at| at < before) {
                expiring.push(subscription);
            }
        }
        Ok(expiring)
    }

    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError> {
        Ok(redis::cmd("SCARD")
            .arg(self.keys.owner_by_id(&digest(owner)))
            .query_async(&mut self.connection.clone())
            .await?)
    }

    async fn list_by_owner(&self, owner: &str) -> Result<Vec<Subscription>, StoreError> {
        let hashes: Vec<RawHash> = LIST_MEMBERS
            .key(self.keys.owner_by_id(&digest(owner)))
            .arg(self.keys.subscription_prefix())
            .invoke_async(&mut self.connection.clone())
            .await?;
        hashes.into_iter().map(decode).collect()
    }

    async fn save_within_limit(
        &self,
        subscription: &Subscription,
        quota: &OwnerQuota,
    ) -> Result<(), StoreError> {
        if subscription.owner.is_none() {
            return Err(StoreError::MissingOwner);
        }
        let refused: Option<u64> = self
            .run_save(&SAVE_WITHIN_LIMIT, subscription, Some(quota.limit))
            .await?;
        match refused {
            None => Ok(()),
            Some(used) => Err(StoreError::LimitReached {
                limit: quota.limit,
                used,
            }),
        }
    }
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
        assert_eq!(
            Keys::new("hub").map(|keys| keys.expiry()).ok().as_deref(),
            Some("{hub}:expiry")
        );
    }

    #[test]
    fn expiry_bound_is_exclusive_and_rounds_up() {
        let at = |micros: i64, nanos| {
            DateTime::from_timestamp(micros / 1_000_000, nanos).unwrap_or_default()
        };
        assert_eq!(expiry_bound(at(10_000_000, 1_000)), "(10000001");
        assert_eq!(expiry_bound(at(10_000_000, 1_500)), "(10000002");
        let far = DateTime::from_timestamp(400_000_000_000, 0).unwrap_or_default();
        assert_eq!(expiry_bound(far), "400000000000000000");
    }

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
