//! The SQL the two SQL backends share, where SQLite's and PostgreSQL's
//! dialects agree: written once, as macros so that each backend's
//! statements stay `&'static str` built with `concat!`.

/// The columns each backend's `subscription_from_row` reads, in every
/// `SELECT`, and every insert's column list, in this order.
macro_rules! columns {
    () => {
        "topic, callback, secret, lease_seconds, created_at, verified_at, expires_at, owner"
    };
}

/// What a save replaces of a pair already stored: everything but the pair.
macro_rules! replace_on_conflict {
    () => {
        concat!(renew_on_conflict!(), ", created_at = excluded.created_at")
    };
}

/// What a renewal replaces of a pair already stored: everything but the
/// pair and when it was created.
macro_rules! renew_on_conflict {
    () => {
        " ON CONFLICT (topic, callback) DO UPDATE SET \
         secret = excluded.secret, \
         lease_seconds = excluded.lease_seconds, \
         verified_at = excluded.verified_at, \
         expires_at = excluded.expires_at, \
         owner = excluded.owner"
    };
}
