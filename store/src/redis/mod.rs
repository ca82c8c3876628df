//! The Redis backend: subscription state shared by every hub process that
//! points at one Redis server or one Redis Cluster, behind the `redis`
//! feature.
//!
//! It owns the key layout below, the Lua scripts that keep each part of it
//! consistent, and the order in which a write steps through the parts; the
//! behaviour it promises is the [`SubscriptionStore`] contract.
//!
//! # Key layout
//!
//! The layout is the same on a single server and on a cluster; only the
//! connection differs ([`RedisStore::connect`] takes either kind of URL).
//! Keys are spread over hash slots by topic, and every script touches the
//! keys of one slot only, which is all Redis Cluster asks. With `p` the
//! prefix (default `websub`), `<t>` the hex SHA-256 of a topic and `<id>`
//! the hex SHA-256 of the length-prefixed topic and callback:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{p:<t>}:sub:<id>` | hash | one subscription (fields below) |
//! | `{p:<t>}:ids` | set | ids of the topic's subscriptions |
//! | `{p:expiry:<n>}` | sorted set | `<t>:<id>:<expires µs>` of leased subscriptions whose id starts with hex digit `n`, scored by the expiry |
//! | `{p:expiry:<n>}:tokens` | hash | the token of each entry of that bucket |
//! | `{p:owner:<sha256(owner)>}` | hash | `<t>:<id>` → token: the owner's reservations |
//! | `{p:owner:<sha256(owner)>}:pending` | hash | `<t>:<id>` → saves in flight on the reservation |
//! | `{p:topics}` | hash | topic → token: the registry of topics |
//! | `{p:topics}:pending` | hash | topic → saves in flight on the registration |
//! | `{p:topics}:layout` | string | the layout version, `2` |
//!
//! A topic's hashes and id set share the tag `{p:<t>}`, so
//! [`list_by_topic`](SubscriptionStore::list_by_topic) and
//! [`list_by_topic_page`](SubscriptionStore::list_by_topic_page) are one
//! script in one slot. A page walks the topic in the order of its ids: it
//! reads and sorts every id of the set in the server and fetches only its
//! own hashes, so walks in large pages stay cheap. The sixteen expiry
//! buckets are the only slots
//! [`list_expiring`](SubscriptionStore::list_expiring) visits besides the
//! hashes of what it finds. A subscription hash has the fields `topic`,
//! `callback`, `created_at`, `verified_at` and, when set, `secret`,
//! `lease_seconds`, `expires_at`, `owner`, and `owner_id` (the owner's
//! digest); timestamps are integer microseconds since the Unix epoch.
//!
//! Redis TTLs are deliberately not used for leases: a hub has to see an
//! expired subscription to remove and report it, and an evaporated key
//! cannot be reported.
//!
//! Layout 2 replaced layout 1, which kept every key of a store under the
//! single tag `{p}`. Nothing is migrated: a store written in layout 1 reads
//! as empty under this code, and in a store whose `{p:topics}:layout`
//! names another version every save that registers a topic is refused.
//!
//! # Steps, and what a crash between them leaves
//!
//! The hash of a subscription is the truth; the id sets live beside it, and
//! the owners' reservations, the registry and the expiry buckets are
//! indexes in slots of their own. Redis cannot update two slots at once, so
//! a save is a short sequence of single-slot steps:
//!
//! 1. *reserve* the pair in the owner's hash (for a conditional save this is
//!    where the limit is checked, atomically, against every reservation the
//!    owner holds), and *mark* the expiry bucket with the pair's entry for
//!    its new expiry;
//! 2. *write* the hash and the id set; a write into a topic without
//!    subscriptions first *registers* the topic in the registry;
//! 3. *settle* the reservation and the registration (one save fewer in
//!    flight on them), and *release* the previous owner's reservation when
//!    the owner changed.
//!
//! A delete removes the hash and the id first, then releases the owner's
//! reservation and, when the topic has no subscription left, unregisters
//! it. Every index is thus written before the hash that needs it and
//! cleared after the hash stops needing it: a crash between any two steps
//! leaves at most an entry too many, never a subscription missing from an
//! index, and never a subscription its owner's quota does not count. A
//! save has taken effect once its write step ran: an error from a later
//! step reports a save that happened, and a retry repeats it harmlessly.
//!
//! Readers treat the indexes as candidates and the hashes as the answer:
//! an owner's reservation counts in `count_by_owner` and `list_by_owner`
//! only if the hash exists and names that owner, a registered topic is
//! listed only if its id set is not empty, and a bucket entry is returned
//! only if the hash exists and still expires then. Those checks are one
//! request per entry, sent concurrently: `topics` asks each registered
//! topic's id set for its size, `list_by_owner` reads each reserved hash.
//! So `count_by_owner` is exact for the subscriptions that exist (it reads
//! the owner's hash of reservations, then one field per reserved pair),
//! while the limit of a conditional save is checked against the
//! reservations — a count that can only be higher, and the `used` a
//! refusal reports — so no leftover ever lets an owner past its quota.
//!
//! # Retiring leftovers
//!
//! An entry that no hash needs is removed by whoever finds it: a release or
//! an unregister right after the step that made it useless, a conditional
//! save refused at its limit (which then tries once more), `topics`, and
//! `list_expiring` for due bucket entries. Saves and deletes leave a bucket
//! entry made stale by a renewal or a delete to the `list_expiring` that
//! finds it due, which is when a reader would meet it anyway. Retiring is itself three steps —
//! read the entry's token, check the hash, remove the entry only if its
//! token has not moved — and it must not remove an entry a save still in
//! flight is about to rely on. Every claim or mark gives the entry a new
//! token from the server's clock, so a save that started after the read
//! keeps its entry. A save that started before the read is covered in one
//! of two ways:
//!
//! - reservations and registrations count the saves in flight on them and a
//!   reader retires an entry at once only when none is;
//! - otherwise the entry must be older than [`GRACE`], and the write step
//!   refuses to write on tokens older than half of it ([`WRITE_WINDOW`]),
//!   restarting the save: any save resting on an entry that old has written
//!   already, and the check of the hash sees it.
//!
//! The second way compares clocks of different nodes, so it assumes they
//! differ by less than the window (a minute); NTP keeps them within
//! milliseconds. A crash leaves an entry with a save in flight that never
//! settles; such an entry is retired once it is older than the grace.

mod codec;
mod connection;
mod keys;
mod scripts;
mod steps;

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::future::try_join_all;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use crate::{OwnerQuota, StoreError, Subscription, SubscriptionStore, expiry_bound_micros};
use codec::{RawHash, decode, owner_of};
pub use connection::CLUSTER_SCHEME;
use connection::Connection;
use keys::{EXPIRY_BUCKETS, Keys, Pair, digest};
use scripts::{DELETE, EXPIRY_DUE, LIST_MEMBERS, LIST_PAGE};
use steps::Index;

/// The prefix [`RedisStore::connect`] uses.
pub const DEFAULT_PREFIX: &str = "websub";

/// How old an index entry must be before a reader retires it while saves
/// may still be in flight on it: twice the [`WRITE_WINDOW`].
pub const GRACE: std::time::Duration = std::time::Duration::from_secs(120);

/// The longest a save may take from claiming its entries to writing its
/// hash; a save that takes longer starts over.
pub const WRITE_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// Subscriptions kept in Redis, on a single server (through a
/// [`ConnectionManager`] that reconnects on its own) or on a Redis Cluster.
///
/// Cloning is cheap and clones share the connection.
#[derive(Debug, Clone)]
pub struct RedisStore {
    connection: Connection,
    keys: Keys,
}

impl RedisStore {
    /// Connects with the prefix [`DEFAULT_PREFIX`] to the server at `url`
    /// (e.g. `redis://127.0.0.1/`), or to the Redis Cluster a URL with
    /// several nodes names (`redis://10.0.0.1:7000,10.0.0.2:7000/`, or
    /// with the [`CLUSTER_SCHEME`], which also takes a single node:
    /// `redis+cluster://10.0.0.1:7000/`).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::with_prefix(url, DEFAULT_PREFIX).await
    }

    /// Connects as [`connect`](Self::connect) does, keeping every key under
    /// `prefix`; stores with different prefixes on one server or cluster
    /// never see each other's subscriptions.
    ///
    /// Fails with [`StoreError::Invalid`] if `prefix` is empty or contains
    /// `{` or `}`, since it opens the keys' hash tags.
    pub async fn with_prefix(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let keys = Keys::new(prefix)?;
        let connection = Connection::open(url).await?;
        Ok(Self { connection, keys })
    }

    /// Connects with the prefix [`DEFAULT_PREFIX`] to the Redis Cluster
    /// that `nodes` belong to (`redis://host:port/` URLs of one or more of
    /// its nodes; the rest are discovered).
    pub async fn connect_cluster<S: AsRef<str>>(nodes: &[S]) -> Result<Self, StoreError> {
        Self::cluster_with_prefix(nodes, DEFAULT_PREFIX).await
    }

    /// Connects to a Redis Cluster as [`connect_cluster`](Self::connect_cluster)
    /// does, keeping every key under `prefix`.
    pub async fn cluster_with_prefix<S: AsRef<str>>(
        nodes: &[S],
        prefix: &str,
    ) -> Result<Self, StoreError> {
        let keys = Keys::new(prefix)?;
        let connection = Connection::cluster(nodes).await?;
        Ok(Self { connection, keys })
    }

    /// A store over a single-server connection manager the caller
    /// configured (timeouts, retries), keeping every key under `prefix` as
    /// in [`with_prefix`](Self::with_prefix).
    pub fn with_connection(
        connection: ConnectionManager,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            connection: Connection::Single(connection),
            keys: Keys::new(prefix)?,
        })
    }

    /// A store over a cluster connection the caller configured, keeping
    /// every key under `prefix`.
    pub fn with_cluster_connection(
        connection: ClusterConnection,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            connection: Connection::Cluster(connection),
            keys: Keys::new(prefix)?,
        })
    }

    /// A handle on the shared connection for one request.
    fn connection(&self) -> Connection {
        self.connection.clone()
    }

    /// The hash of every reservation of `owner` that still names it, with
    /// the reservations read first (see the module doc on readers).
    async fn owned(&self, owner: &str, whole: bool) -> Result<Vec<RawHash>, StoreError> {
        let owner_digest = digest(owner);
        let reserved: Vec<String> = redis::cmd("HKEYS")
            .arg(self.keys.owner(&owner_digest))
            .query_async(&mut self.connection())
            .await?;
        let hashes = try_join_all(reserved.iter().filter_map(|member| {
            let key = self.keys.subscription(&Pair::from_member(member)?);
            let mut connection = self.connection();
            Some(async move {
                let hash: redis::RedisResult<RawHash> = if whole {
                    redis::cmd("HGETALL")
                        .arg(key)
                        .query_async(&mut connection)
                        .await
                } else {
                    // A count needs only the owner of each hash.
                    redis::cmd("HGET")
                        .arg(key)
                        .arg("owner_id")
                        .query_async::<Option<Vec<u8>>>(&mut connection)
                        .await
                        .map(|owner| {
                            owner
                                .map(|owner| RawHash::from([(b"owner_id".to_vec(), owner)]))
                                .unwrap_or_default()
                        })
                };
                hash
            })
        }))
        .await?;
        Ok(hashes
            .into_iter()
            .filter(|hash| owner_of(hash) == Some(owner_digest.as_bytes()))
            .collect())
    }
}

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

/// One due entry of an expiry bucket, as `list_expiring` read it.
struct DueEntry {
    bucket: usize,
    /// The bucket's clock when the entry was read, for its age.
    now: i64,
    member: String,
    token: String,
    pair: Pair,
    expires: i64,
}

#[async_trait]
impl SubscriptionStore for RedisStore {
    async fn save(&self, subscription: &Subscription) -> Result<(), StoreError> {
        self.write(subscription, None).await.map(drop)
    }

    async fn get(&self, topic: &str, callback: &str) -> Result<Subscription, StoreError> {
        let key = self.keys.subscription(&Pair::of(topic, callback));
        let hash: RawHash = redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut self.connection())
            .await?;
        if hash.is_empty() {
            return Err(StoreError::unknown(topic, callback));
        }
        decode(hash)
    }

    async fn delete(&self, topic: &str, callback: &str) -> Result<(), StoreError> {
        let pair = Pair::of(topic, callback);
        // The hash goes first: from here on no reader counts or lists it,
        // and the indexes that still name it are only leftovers.
        let (owner, remaining): (String, String) = DELETE
            .key(self.keys.subscription(&pair))
            .key(self.keys.members(&pair.topic_digest))
            .arg(&pair.id)
            .invoke_async(&mut self.connection())
            .await?;
        let release = async {
            if owner.is_empty() {
                Ok(())
            } else {
                self.release(&owner, &pair).await
            }
        };
        let unregister = async {
            if remaining == "0" {
                self.unregister(topic).await
            } else {
                Ok(())
            }
        };
        // The expiry entry is left to `list_expiring`, which retires it when
        // it comes due: that is when a reader would meet it anyway.
        futures::try_join!(release, unregister)?;
        Ok(())
    }

    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        let topic_digest = digest(topic);
        let hashes: Vec<RawHash> = LIST_MEMBERS
            .key(self.keys.members(&topic_digest))
            .arg(self.keys.subscription_prefix(&topic_digest))
            .invoke_async(&mut self.connection())
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
        let after = after.map(|callback| Pair::of(topic, callback).id);
        let topic_digest = digest(topic);
        let hashes: Vec<RawHash> = LIST_PAGE
            .key(self.keys.members(&topic_digest))
            .arg(self.keys.subscription_prefix(&topic_digest))
            .arg(after.as_deref().unwrap_or(""))
            .arg(limit)
            .invoke_async(&mut self.connection())
            .await?;
        hashes.into_iter().map(decode).collect()
    }

    async fn has_subscriptions(&self, topic: &str) -> Result<bool, StoreError> {
        // The id set changes in the same script as the hashes, and Redis
        // deletes a set with its last member: the key exists exactly while
        // the topic has a subscription.
        let exists: bool = redis::cmd("EXISTS")
            .arg(self.keys.members(&digest(topic)))
            .query_async(&mut self.connection())
            .await?;
        Ok(exists)
    }

    async fn topics(&self) -> Result<Vec<String>, StoreError> {
        let registry = self.entries(Index::Registry, &[]).await?;
        let counts = try_join_all(registry.entries.iter().map(|entry| {
            let mut connection = self.connection();
            let key = self.keys.members(&digest(&entry.name));
            async move {
                redis::cmd("SCARD")
                    .arg(key)
                    .query_async::<u64>(&mut connection)
                    .await
            }
        }))
        .await?;
        let mut listed = Vec::new();
        let mut stale = Vec::new();
        for (entry, count) in registry.entries.iter().zip(counts) {
            if count > 0 {
                listed.push(entry.name.clone());
            } else if registry.retirable(entry) {
                stale.push((entry.name.clone(), entry.token.clone()));
            }
        }
        self.retire(Index::Registry, stale).await?;
        Ok(listed)
    }

    async fn list_expiring(&self, before: DateTime<Utc>) -> Result<Vec<Subscription>, StoreError> {
        let bound = expiry_bound(before);
        let buckets = try_join_all((0..EXPIRY_BUCKETS).map(|bucket| {
            let mut connection = self.connection();
            let invocation = {
                let mut invocation = EXPIRY_DUE.key(self.keys.expiry(bucket));
                invocation.key(self.keys.expiry_tokens(bucket)).arg(&bound);
                invocation
            };
            async move {
                invocation
                    .invoke_async::<Vec<String>>(&mut connection)
                    .await
            }
        }))
        .await?;

        let mut due = Vec::new();
        let mut stale: HashMap<usize, Vec<(String, String)>> = HashMap::new();
        for (bucket, reply) in buckets.into_iter().enumerate() {
            let mut reply = reply.into_iter();
            let now = reply.next().and_then(|now| now.parse().ok()).unwrap_or(0);
            while let (Some(member), Some(token)) = (reply.next(), reply.next()) {
                match Pair::from_expiry_member(&member) {
                    Some((pair, expires)) => due.push(DueEntry {
                        bucket,
                        now,
                        member,
                        token,
                        pair,
                        expires,
                    }),
                    // An entry this code did not write backs no hash.
                    None => stale.entry(bucket).or_default().push((member, token)),
                }
            }
        }

        // Each pair's hash once, however many entries name it.
        let mut pairs: Vec<Pair> = due.iter().map(|entry| entry.pair.clone()).collect();
        pairs.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        pairs.dedup();
        let hashes = try_join_all(pairs.iter().map(|pair| {
            let mut connection = self.connection();
            let key = self.keys.subscription(pair);
            async move {
                redis::cmd("HGETALL")
                    .arg(key)
                    .query_async::<RawHash>(&mut connection)
                    .await
            }
        }))
        .await?;
        let mut found: HashMap<Pair, Subscription> = HashMap::new();
        for (pair, hash) in pairs.into_iter().zip(hashes) {
            if !hash.is_empty() {
                found.insert(pair, decode(hash)?);
            }
        }

        for entry in due {
            let live = found
                .get(&entry.pair)
                .and_then(|subscription| subscription.expires_at)
                .is_some_and(|at| at.timestamp_micros() == entry.expires);
            if !live && steps::older_than_grace(entry.now, &entry.token) {
                stale
                    .entry(entry.bucket)
                    .or_default()
                    .push((entry.member, entry.token));
            }
        }
        self.retire_expiry(stale).await?;

        Ok(found
            .into_values()
            .filter(|subscription| subscription.expires_at.is_some_and(|at| at < before))
            .collect())
    }

    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError> {
        Ok(self.owned(owner, false).await?.len() as u64)
    }

    async fn list_by_owner(&self, owner: &str) -> Result<Vec<Subscription>, StoreError> {
        self.owned(owner, true)
            .await?
            .into_iter()
            .map(decode)
            .collect()
    }

    async fn save_within_limit(
        &self,
        subscription: &Subscription,
        quota: &OwnerQuota,
    ) -> Result<(), StoreError> {
        if subscription.owner.is_none() {
            return Err(StoreError::MissingOwner);
        }
        match self.write(subscription, Some(quota.limit)).await? {
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
    fn the_grace_covers_the_window_twice() {
        assert_eq!(GRACE, WRITE_WINDOW * 2);
    }
}
