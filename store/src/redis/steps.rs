//! The single-slot steps of the Redis store's writes, and of retiring the
//! index entries no hash needs any more. The [module doc](super) gives the
//! order and why it is safe; this module keeps to it.

use std::collections::HashMap;

use futures::future::try_join_all;

use super::keys::{LAYOUT_VERSION, Pair, digest};
use super::scripts::{CLAIM, ENTRIES, MARK_EXPIRY, RETIRE, RETIRE_EXPIRY, SETTLE, WRITE};
use super::{GRACE, RedisStore, WRITE_WINDOW, codec};
use crate::{StoreError, Subscription};

/// How many times a save starts over when its write step found its tokens
/// older than the write window (a process stalled between steps).
const SAVE_ATTEMPTS: usize = 3;

fn micros(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// Whether an entry with `token`, read when the server's clock said `now`,
/// is old enough to retire while saves may still be in flight on it. A
/// token that does not parse was not written by this code: it is old.
pub(super) fn older_than_grace(now: i64, token: &str) -> bool {
    token
        .parse::<i64>()
        .map_or(true, |token| now.saturating_sub(token) > micros(GRACE))
}

/// An index whose entries carry a token and a count of saves in flight.
#[derive(Debug, Clone, Copy)]
pub(super) enum Index<'a> {
    /// The reservations of the owner with this digest.
    Owner(&'a str),
    /// The topic registry.
    Registry,
}

/// What a claim on an index entry came to.
#[derive(Debug)]
pub(super) enum Claim {
    /// Claimed, with the entry's new token.
    Claimed(String),
    /// Refused at the limit, with the number of entries held.
    Refused(u64),
}

/// One entry of an index as a reader found it.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) token: String,
    pending: u64,
}

/// Entries of an index and the server's clock when they were read.
#[derive(Debug)]
pub(super) struct Entries {
    now: i64,
    pub(super) entries: Vec<Entry>,
}

impl Entries {
    fn parse(reply: Vec<String>) -> Self {
        let mut reply = reply.into_iter();
        let now = reply.next().and_then(|now| now.parse().ok()).unwrap_or(0);
        let mut entries = Vec::new();
        while let (Some(name), Some(token), Some(pending)) =
            (reply.next(), reply.next(), reply.next())
        {
            entries.push(Entry {
                name,
                token,
                pending: pending.parse().unwrap_or(0),
            });
        }
        Self { now, entries }
    }

    /// Whether a reader that now finds no hash needing `entry` may remove
    /// it: no save is in flight on it, or any that was has written by now.
    pub(super) fn retirable(&self, entry: &Entry) -> bool {
        entry.pending == 0 || older_than_grace(self.now, &entry.token)
    }
}

/// What the write step did.
enum Written {
    /// The hash is written; the digest of the owner it replaced, if any.
    Done(Option<String>),
    /// The save's tokens were too old: nothing written, start over.
    Late,
}

impl RedisStore {
    fn index_keys(&self, index: Index<'_>) -> (String, String) {
        match index {
            Index::Owner(owner_digest) => (
                self.keys.owner(owner_digest),
                self.keys.owner_pending(owner_digest),
            ),
            Index::Registry => (self.keys.registry(), self.keys.registry_pending()),
        }
    }

    /// Claims `entry` in `index`, refusing at `limit` entries unless the
    /// entry is already there. A registry claim also checks the layout.
    pub(super) async fn claim(
        &self,
        index: Index<'_>,
        entry: &str,
        limit: Option<u64>,
    ) -> Result<Claim, StoreError> {
        let (tokens, pending) = self.index_keys(index);
        let mut invocation = CLAIM.key(tokens);
        invocation.key(pending);
        if let Index::Registry = index {
            invocation.key(self.keys.layout());
        }
        invocation
            .arg(entry)
            .arg(limit.map(|limit| limit.to_string()).unwrap_or_default());
        if let Index::Registry = index {
            invocation.arg(LAYOUT_VERSION);
        }
        let (outcome, value): (String, String) =
            invocation.invoke_async(&mut self.connection()).await?;
        match outcome.as_str() {
            "claimed" => Ok(Claim::Claimed(value)),
            "refused" => Ok(Claim::Refused(value.parse().unwrap_or(0))),
            other => Err(StoreError::Invalid(format!(
                "redis claim answered {other:?}"
            ))),
        }
    }

    /// Ends one save in flight on `entry`.
    async fn settle(&self, index: Index<'_>, entry: &str) -> Result<(), StoreError> {
        let (_, pending) = self.index_keys(index);
        let () = SETTLE
            .key(pending)
            .arg(entry)
            .invoke_async(&mut self.connection())
            .await?;
        Ok(())
    }

    /// The entries `names` of `index` that exist, or all of them when
    /// `names` is empty, with the clock to judge their age by.
    pub(super) async fn entries(
        &self,
        index: Index<'_>,
        names: &[&str],
    ) -> Result<Entries, StoreError> {
        let (tokens, pending) = self.index_keys(index);
        let mut invocation = ENTRIES.key(tokens);
        invocation.key(pending);
        for name in names {
            invocation.arg(*name);
        }
        let reply: Vec<String> = invocation.invoke_async(&mut self.connection()).await?;
        Ok(Entries::parse(reply))
    }

    /// Removes the (entry, token) pairs of `index` whose token has not
    /// moved since it was read; returns how many went.
    pub(super) async fn retire(
        &self,
        index: Index<'_>,
        stale: Vec<(String, String)>,
    ) -> Result<u64, StoreError> {
        if stale.is_empty() {
            return Ok(0);
        }
        let (tokens, pending) = self.index_keys(index);
        let mut invocation = RETIRE.key(tokens);
        invocation.key(pending);
        for (entry, token) in stale {
            invocation.arg(entry).arg(token);
        }
        Ok(invocation.invoke_async(&mut self.connection()).await?)
    }

    /// Removes stale expiry entries, bucket by bucket.
    pub(super) async fn retire_expiry(
        &self,
        stale: HashMap<usize, Vec<(String, String)>>,
    ) -> Result<(), StoreError> {
        try_join_all(stale.into_iter().map(|(bucket, entries)| {
            let mut invocation = RETIRE_EXPIRY.key(self.keys.expiry(bucket));
            invocation.key(self.keys.expiry_tokens(bucket));
            for (entry, token) in entries {
                invocation.arg(entry).arg(token);
            }
            let mut connection = self.connection();
            async move { invocation.invoke_async::<()>(&mut connection).await }
        }))
        .await?;
        Ok(())
    }

    /// Drops the reservation of `pair` by the owner with `owner_digest` if
    /// no save is in flight on it and the hash does not name that owner.
    pub(super) async fn release(&self, owner_digest: &str, pair: &Pair) -> Result<(), StoreError> {
        let index = Index::Owner(owner_digest);
        let member = pair.member();
        let read = self.entries(index, &[member.as_str()]).await?;
        let Some(entry) = read.entries.first() else {
            return Ok(());
        };
        if !read.retirable(entry) {
            // A save of this owner is under way on the pair; if it never
            // writes, a refused conditional save retires the entry later.
            return Ok(());
        }
        let owner: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.keys.subscription(pair))
            .arg("owner_id")
            .query_async(&mut self.connection())
            .await?;
        if owner.as_deref() != Some(owner_digest.as_bytes()) {
            self.retire(index, vec![(member, entry.token.clone())])
                .await?;
        }
        Ok(())
    }

    /// Removes `topic` from the registry if no save is in flight on its
    /// registration and it has no subscription.
    pub(super) async fn unregister(&self, topic: &str) -> Result<(), StoreError> {
        let read = self.entries(Index::Registry, &[topic]).await?;
        let Some(entry) = read.entries.first() else {
            return Ok(());
        };
        if !read.retirable(entry) {
            return Ok(());
        }
        let left: u64 = redis::cmd("SCARD")
            .arg(self.keys.members(&digest(topic)))
            .query_async(&mut self.connection())
            .await?;
        if left == 0 {
            self.retire(
                Index::Registry,
                vec![(topic.to_owned(), entry.token.clone())],
            )
            .await?;
        }
        Ok(())
    }

    /// Retires every reservation of the owner that no hash needs; returns
    /// how many went.
    async fn clean_owner(&self, owner_digest: &str) -> Result<u64, StoreError> {
        let index = Index::Owner(owner_digest);
        let read = self.entries(index, &[]).await?;
        let candidates: Vec<&Entry> = read
            .entries
            .iter()
            .filter(|entry| read.retirable(entry))
            .collect();
        let owners = try_join_all(candidates.iter().map(|entry| {
            let key = Pair::from_member(&entry.name).map(|pair| self.keys.subscription(&pair));
            let mut connection = self.connection();
            async move {
                match key {
                    Some(key) => {
                        redis::cmd("HGET")
                            .arg(key)
                            .arg("owner_id")
                            .query_async::<Option<Vec<u8>>>(&mut connection)
                            .await
                    }
                    // Not a member this code wrote: it backs nothing.
                    None => Ok(None),
                }
            }
        }))
        .await?;
        let stale = candidates
            .into_iter()
            .zip(owners)
            .filter(|(_, owner)| owner.as_deref() != Some(owner_digest.as_bytes()))
            .map(|(entry, _)| (entry.name.clone(), entry.token.clone()))
            .collect();
        self.retire(index, stale).await
    }

    /// Reserves `pair` for the owner; at the limit, retires the owner's
    /// leftovers and tries once more.
    async fn reserve(
        &self,
        owner_digest: &str,
        member: &str,
        limit: Option<u64>,
    ) -> Result<Claim, StoreError> {
        let index = Index::Owner(owner_digest);
        let claim = self.claim(index, member, limit).await?;
        if let Claim::Refused(_) = claim
            && self.clean_owner(owner_digest).await? > 0
        {
            return self.claim(index, member, limit).await;
        }
        Ok(claim)
    }

    /// Adds the pair's entry for `expires` to its bucket; returns its token.
    async fn mark_expiry(&self, pair: &Pair, expires: i64) -> Result<String, StoreError> {
        let bucket = pair.bucket();
        Ok(MARK_EXPIRY
            .key(self.keys.expiry(bucket))
            .key(self.keys.expiry_tokens(bucket))
            .arg(pair.expiry_member(expires))
            .arg(expires)
            .invoke_async(&mut self.connection())
            .await?)
    }

    /// Saves `subscription`, held to `limit` reservations of its owner when
    /// given; returns the count a refusal saw.
    pub(super) async fn write(
        &self,
        subscription: &Subscription,
        limit: Option<u64>,
    ) -> Result<Option<u64>, StoreError> {
        let pair = Pair::of(&subscription.topic, &subscription.callback);
        let member = pair.member();
        let owner = subscription.owner.as_deref().map(digest);
        let expires = subscription.expires_at.map(|at| at.timestamp_micros());

        for _ in 0..SAVE_ATTEMPTS {
            let reserve = async {
                match &owner {
                    Some(owner) => self.reserve(owner, &member, limit).await.map(Some),
                    None => Ok(None),
                }
            };
            let mark = async {
                match expires {
                    Some(expires) => self.mark_expiry(&pair, expires).await.map(Some),
                    None => Ok(None),
                }
            };
            let (reservation, expiry_token) = if limit.is_some() {
                // A refused conditional save leaves nothing behind: the
                // expiry entry waits for the reservation.
                match reserve.await? {
                    Some(Claim::Refused(used)) => return Ok(Some(used)),
                    reservation => (reservation, mark.await?),
                }
            } else {
                futures::try_join!(reserve, mark)?
            };
            let owner_token = match reservation {
                Some(Claim::Claimed(token)) => Some(token),
                Some(Claim::Refused(used)) => return Ok(Some(used)),
                None => None,
            };

            let written = self
                .write_hash(
                    subscription,
                    &pair,
                    owner.as_deref(),
                    owner_token.as_deref(),
                    expiry_token.as_deref(),
                )
                .await?;
            if let Some(owner) = &owner {
                self.settle(Index::Owner(owner), &member).await?;
            }
            match written {
                Written::Late => continue,
                Written::Done(previous) => {
                    if let Some(previous) = previous
                        && Some(&previous) != owner.as_ref()
                    {
                        self.release(&previous, &pair).await?;
                    }
                    return Ok(None);
                }
            }
        }
        Err(StoreError::backend(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "a redis save took longer than {}s between its steps, {SAVE_ATTEMPTS} times",
                WRITE_WINDOW.as_secs()
            ),
        )))
    }

    /// The write step, registering the topic first when it has no
    /// subscription yet.
    async fn write_hash(
        &self,
        subscription: &Subscription,
        pair: &Pair,
        owner: Option<&str>,
        owner_token: Option<&str>,
        expiry_token: Option<&str>,
    ) -> Result<Written, StoreError> {
        let mut registration: Option<String> = None;
        let written = loop {
            let mut invocation = WRITE.key(self.keys.subscription(pair));
            invocation
                .key(self.keys.members(&pair.topic_digest))
                .arg(&pair.id)
                .arg(micros(WRITE_WINDOW))
                .arg(registration.as_deref().unwrap_or(""))
                .arg(owner_token.unwrap_or(""))
                .arg(expiry_token.unwrap_or(""));
            for (field, value) in codec::encode(subscription, owner) {
                invocation.arg(field).arg(value);
            }
            let reply: Vec<String> = invocation.invoke_async(&mut self.connection()).await?;
            match reply.first().map(String::as_str) {
                Some("unregistered") if registration.is_none() => {
                    match self
                        .claim(Index::Registry, &subscription.topic, None)
                        .await?
                    {
                        Claim::Claimed(token) => registration = Some(token),
                        Claim::Refused(_) => {
                            return Err(StoreError::Invalid(
                                "redis refused a registration without a limit".to_owned(),
                            ));
                        }
                    }
                }
                Some("late") => break Written::Late,
                Some("written") => {
                    let previous = reply.get(1).filter(|owner| !owner.is_empty()).cloned();
                    break Written::Done(previous);
                }
                other => {
                    return Err(StoreError::Invalid(format!(
                        "redis write answered {other:?}"
                    )));
                }
            }
        };
        if registration.is_some() {
            self.settle(Index::Registry, &subscription.topic).await?;
        }
        Ok(written)
    }
}
