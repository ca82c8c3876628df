//! The Lua scripts of the Redis store. Each one touches the keys of a
//! single hash slot, which is what lets Redis Cluster run it; the
//! [module doc](super) says how the steps combine.
//!
//! Tokens are the server's clock in microseconds (`TIME`), made strictly
//! greater than the token they replace, and kept as decimal strings so that
//! they compare exactly.

use std::sync::LazyLock;

use redis::Script;

/// Helpers every token-handling script starts with.
macro_rules! prelude {
    () => {
        r#"
local function now_micros()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local function next_token(previous)
  local token = now_micros()
  if previous and tonumber(previous) >= token then
    token = tonumber(previous) + 1
  end
  return string.format('%.0f', token)
end
"#
    };
}

/// A claim on an entry of an index kept as a token hash beside a pending
/// hash: an owner's reservations, or the topic registry.
///
/// KEYS: the token hash, the pending hash, and (registry only) the layout
/// key. ARGV: the entry, the limit or "" for none, and (with the layout key)
/// the layout version. An entry already there is claimed again whatever the
/// limit: a re-save of a held pair never counts as new. A claim refreshes
/// the entry's token and counts one more save in flight on it.
///
/// Returns `{"claimed", token}` or `{"refused", entries held}`.
pub(super) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        prelude!(),
        r#"
if KEYS[3] then
  redis.call('SET', KEYS[3], ARGV[3], 'NX')
  local layout = redis.call('GET', KEYS[3])
  if layout ~= ARGV[3] then
    return redis.error_reply('the store is in key layout ' .. layout .. ', not ' .. ARGV[3])
  end
end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current and ARGV[2] ~= '' then
  local used = redis.call('HLEN', KEYS[1])
  if used >= tonumber(ARGV[2]) then
    return {'refused', tostring(used)}
  end
end
local token = next_token(current)
redis.call('HSET', KEYS[1], ARGV[1], token)
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
return {'claimed', token}
"#
    ))
});

/// Ends one save in flight on an entry. KEYS: the pending hash. ARGV: the
/// entry.
pub(super) static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
"#,
    )
});

/// Reads entries of a token index with their tokens and saves in flight,
/// and the server's clock, for a reader about to check them.
///
/// KEYS: the token hash, the pending hash. ARGV: the entries to read, or
/// none for all of them. Returns `{now, entry, token, pending, ...}`;
/// entries that are not there are left out.
pub(super) static ENTRIES: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        prelude!(),
        r#"
local result = {string.format('%.0f', now_micros())}
local function add(entry, token)
  result[#result + 1] = entry
  result[#result + 1] = token
  result[#result + 1] = redis.call('HGET', KEYS[2], entry) or '0'
end
if #ARGV == 0 then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    add(all[i], all[i + 1])
  end
else
  for _, entry in ipairs(ARGV) do
    local token = redis.call('HGET', KEYS[1], entry)
    if token then
      add(entry, token)
    end
  end
end
return result
"#
    ))
});

/// Removes entries of a token index whose token has not moved since they
/// were read. KEYS: the token hash, the pending hash. ARGV: entry, token
/// pairs. Returns how many went.
pub(super) static RETIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local removed = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    removed = removed + 1
  end
end
return removed
"#,
    )
});

/// Adds (or refreshes) a pair's entry for one expiry in its bucket.
///
/// KEYS: the bucket's sorted set, its token hash. ARGV: the entry, its
/// score (the expiry in microseconds). Returns the entry's new token.
pub(super) static MARK_EXPIRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        prelude!(),
        r#"
local token = next_token(redis.call('HGET', KEYS[2], ARGV[1]))
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], token)
return token
"#
    ))
});

/// The entries of a bucket due before a bound, with their tokens and the
/// server's clock.
///
/// KEYS: the bucket's sorted set, its token hash. ARGV: the score bound as
/// ZRANGEBYSCORE takes it. Returns `{now, entry, token, ...}`.
pub(super) static EXPIRY_DUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        prelude!(),
        r#"
local result = {string.format('%.0f', now_micros())}
for _, entry in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  result[#result + 1] = entry
  result[#result + 1] = redis.call('HGET', KEYS[2], entry) or '0'
end
return result
"#
    ))
});

/// Removes bucket entries whose token has not moved since they were read.
/// KEYS: the bucket's sorted set, its token hash. ARGV: entry, token pairs.
pub(super) static RETIRE_EXPIRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
for i = 1, #ARGV, 2 do
  if (redis.call('HGET', KEYS[2], ARGV[i]) or '0') == ARGV[i + 1] then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
"#,
    )
});

/// Replaces a subscription hash and adds its id to the topic's id set.
///
/// KEYS: the hash, the topic's id set. ARGV: the id, the write window in
/// microseconds, then the tokens of the topic's registration, the owner's
/// reservation and the expiry entry this write rests on ("" for none), then
/// the hash's field/value pairs.
///
/// A write into a topic without subscriptions needs a registration (the
/// topic may be missing from the registry): without one it returns
/// `{"unregistered"}` and writes nothing. A write whose tokens are older
/// than the window returns `{"late"}` and writes nothing, which is what
/// lets a reader retire an old entry without racing a save still in flight
/// on it. Otherwise it returns `{"written", previous owner digest or ""}`.
pub(super) static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        prelude!(),
        r#"
if ARGV[3] == '' and redis.call('SCARD', KEYS[2]) == 0 then
  return {'unregistered'}
end
local now = now_micros()
for i = 3, 5 do
  if ARGV[i] ~= '' and now - tonumber(ARGV[i]) > tonumber(ARGV[2]) then
    return {'late'}
  end
end
local previous = redis.call('HGET', KEYS[1], 'owner_id')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('SADD', KEYS[2], ARGV[1])
return {'written', previous or ''}
"#
    ))
});

/// Removes a subscription hash and its id from the topic's id set.
///
/// KEYS: the hash, the topic's id set. ARGV: the id. Returns
/// `{owner digest of the removed hash or "", ids left in the topic}`.
pub(super) static DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local owner = redis.call('HGET', KEYS[1], 'owner_id')
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return {owner or '', tostring(redis.call('SCARD', KEYS[2]))}
"#,
    )
});

/// KEYS: the topic's id set. ARGV: subscription key prefix. One round trip
/// for the publish hot path instead of one per subscriber.
pub(super) static LIST_MEMBERS: LazyLock<Script> = LazyLock::new(|| {
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

/// KEYS: the topic's id set. ARGV: subscription key prefix, the id after
/// which the page starts ("" for the first page), the page size. A page
/// follows the order of the ids (hex digests of the pairs): the script reads
/// every member id of the topic, but only the page's hashes. An id whose
/// hash is missing is passed over, so a short page is still the last.
pub(super) static LIST_PAGE: LazyLock<Script> = LazyLock::new(|| {
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
