//! The replicas sharing one PostgreSQL database: who is alive, and handing
//! back the claims of one that died.
//!
//! It owns the `websub_replicas` table and the `claimed_by` columns of the
//! claimable tables (`websub_deliveries`, `websub_verifications`,
//! `websub_fetches`; migration `0011_replicas.sql`). Every process on
//! PostgreSQL registers at start under a fresh id, and its event log and
//! backlog record that id with every claim they make. A task of its own
//! ([`keep_beating`]) beats every [`BEAT_INTERVAL`]; a replica whose beat is
//! older than [`DEAD_AFTER`] is dead, and the first live replica to notice
//! removes its row and hands back its claims in the same transaction (one
//! statement per table): they are claimable at once, not after the
//! visibility timeout. A clean shutdown deregisters, handing back whatever
//! its drain left claimed. The visibility timeout stays as the last resort,
//! for a live replica whose attempt hangs.
//!
//! Beats are judged on the database's clock, so replicas on hosts whose
//! clocks disagree by a second still agree on who is dead. Replicas doing
//! the takeover at once are safe: the removal of the dead one's row locks
//! it, so the second waits for the first to commit and then finds nothing
//! to remove, and hands back nothing.
//!
//! A replica also records its seat: its host's name and the address it
//! listens on ([`Replicas::sit`]). No two live processes listen on one
//! address of one host, so another replica registered at a replica's seat
//! is its predecessor, killed before it could leave: a takeover counts it
//! dead whatever its last beat, and a process restarted in place hands
//! back its predecessor's claims at once instead of after [`DEAD_AFTER`]. A process restarted elsewhere (another host, another
//! address) is a stranger to its predecessor and waits.
//!
//! SQLite has no replicas: one process uses a file, and it hands back all
//! claims at start (`DeliveryQueue::release_claims`).

use std::time::{Duration, Instant};

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{PgConnection, PgExecutor, Postgres, Row, Transaction};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

/// How often a replica beats.
pub const BEAT_INTERVAL: Duration = Duration::from_secs(1);

/// How old a replica's last beat is when it counts as dead: five beats
/// missed. A replica stalled this long (its database connection cut, its
/// host frozen) loses its claims to the others; delivery is at least once,
/// so what it then completes late is at worst delivered twice.
pub const DEAD_AFTER: Duration = Duration::from_secs(5);

/// Longest a beat (with its takeover) may take before it counts as missed.
const BEAT_TIMEOUT: Duration = Duration::from_secs(3);

/// `websub_claims_taken_over_total{kind}`: claims of dead replicas handed
/// back, and their unfinished expansions (`kind="expansion"`).
pub const CLAIMS_TAKEN_OVER_TOTAL: &str = "websub_claims_taken_over_total";

// Own row: a beat that finds it gone (this replica was judged dead while
// it stalled) registers again.
const BEAT: &str = "UPDATE websub_replicas SET beat_at = now() WHERE id = $1";

const REGISTER: &str = "INSERT INTO websub_replicas (id, started_at, beat_at, seat) \
     VALUES ($1, now(), now(), $2) \
     ON CONFLICT (id) DO UPDATE SET beat_at = excluded.beat_at";

// The dead, removed: those silent for $1 seconds, and any other at this
// replica's seat ($3; NULL matches none). The row lock makes a concurrent
// takeover of the same replica wait, then find the row gone.
const REMOVE_DEAD: &str = "DELETE FROM websub_replicas \
     WHERE id <> $2 AND (beat_at < now() - make_interval(secs => $1) OR seat = $3) \
     RETURNING id";

const DEREGISTER: &str = "DELETE FROM websub_replicas WHERE id = $1";

const SIT: &str = "UPDATE websub_replicas SET seat = $2 WHERE id = $1";

// One statement per table. `claimed_by` means something only while
// `processing_since` is set (a completion leaves it), so both are checked.
// The deliveries' statement walks the pending index (`processed_at IS
// NULL`): a finished record can hold no claim, and the records kept after
// delivery may far outnumber the pending ones.
// RETURNING reads the updated row, whose claimed_by is cleared: the holder
// comes from the joined list instead.
const RELEASE_DELIVERIES: &str = "WITH released AS ( \
         UPDATE websub_deliveries AS d SET processing_since = NULL, claimed_by = NULL \
         FROM unnest($1::uuid[]) AS h (holder) \
         WHERE d.processed_at IS NULL AND d.processing_since IS NOT NULL \
           AND d.claimed_by = h.holder \
         RETURNING h.holder) \
     SELECT holder AS replica, count(*) AS released FROM released GROUP BY holder";

const RELEASE_VERIFICATIONS: &str = "WITH released AS ( \
         UPDATE websub_verifications AS v SET processing_since = NULL, claimed_by = NULL \
         FROM unnest($1::uuid[]) AS h (holder) \
         WHERE v.processing_since IS NOT NULL AND v.claimed_by = h.holder \
         RETURNING h.holder) \
     SELECT holder AS replica, count(*) AS released FROM released GROUP BY holder";

const RELEASE_FETCHES: &str = "WITH released AS ( \
         UPDATE websub_fetches AS f SET processing_since = NULL, claimed_by = NULL \
         FROM unnest($1::uuid[]) AS h (holder) \
         WHERE f.processing_since IS NOT NULL AND f.claimed_by = h.holder \
         RETURNING h.holder) \
     SELECT holder AS replica, count(*) AS released FROM released GROUP BY holder";

// Unfinished expansions (`0022_expansion_owner.sql`): the unexpanded
// events' partial index, as the takeover runs with seqscan off.
const RELEASE_EXPANSIONS: &str = "WITH released AS ( \
         UPDATE websub_events AS e SET expanding_by = NULL \
         FROM unnest($1::uuid[]) AS h (holder) \
         WHERE e.expanded_at IS NULL AND e.expanding_by = h.holder \
         RETURNING h.holder) \
     SELECT holder AS replica, count(*) AS released FROM released GROUP BY holder";

/// Failures of the replica registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The database failed, or did not answer in time.
    #[error("replica registry database failed: {0}")]
    Database(#[from] sqlx::Error),
}

/// The claims handed back from one dead replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TakenOver {
    /// The dead replica.
    pub replica: Uuid,
    /// Delivery records it had claimed.
    pub deliveries: u64,
    /// Verifications of intent it had claimed.
    pub verifications: u64,
    /// Topic fetches it had claimed.
    pub fetches: u64,
    /// Events it was expanding, whose records it may have held in memory.
    pub expansions: u64,
}

impl TakenOver {
    /// Claims of every kind, expansions included.
    pub fn total(&self) -> u64 {
        self.deliveries + self.verifications + self.fetches + self.expansions
    }
}

/// What one beat found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Beat {
    /// This replica's row was gone: the others judged it dead (it stalled
    /// longer than [`DEAD_AFTER`]) and took its claims; it is registered
    /// again.
    pub registered_again: bool,
    /// The dead replicas whose claims this beat handed back.
    pub taken_over: Vec<TakenOver>,
}

/// This process's entry in the registry of replicas. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Replicas {
    pool: PgPool,
    id: Uuid,
    /// Its seat, once taken: a replica that registers again (taken for
    /// dead while it stalled) keeps it.
    seat: std::sync::Arc<std::sync::OnceLock<String>>,
}

impl Replicas {
    /// A registry on `url` (the hub's database, migrated by its event log)
    /// for a replica with a fresh id, on a small pool of its own: a beat
    /// must not wait behind a fan-out's statements for a connection.
    pub async fn connect(url: &str) -> Result<Self, ReplicaError> {
        // A beat lost in a database crash is made again a second later.
        let options = super::postgres_session(url)?.options([("synchronous_commit", "off")]);
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await?;
        Ok(Self::from_pool(pool, Uuid::now_v7()))
    }

    /// A registry on an existing pool, for the replica `id`.
    pub fn from_pool(pool: PgPool, id: Uuid) -> Self {
        Self {
            pool,
            id,
            seat: std::sync::Arc::default(),
        }
    }

    /// This replica's id: what its event log and backlog record with their
    /// claims (`PostgresEventLog::with_replica`).
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// Registers this replica (again, if it was), as beating now.
    pub async fn register(&self) -> Result<(), ReplicaError> {
        self.register_on(&self.pool).await
    }

    async fn register_on(&self, executor: impl PgExecutor<'_>) -> Result<(), ReplicaError> {
        sqlx::query(REGISTER)
            .bind(self.id)
            .bind(self.seat.get())
            .execute(executor)
            .await?;
        Ok(())
    }

    /// Beats: moves this replica's beat to now, registering it again if
    /// its row is gone. Takes over nothing.
    pub async fn beat(&self) -> Result<bool, ReplicaError> {
        self.beat_on(&mut *self.pool.acquire().await?).await
    }

    async fn beat_on(&self, connection: &mut PgConnection) -> Result<bool, ReplicaError> {
        let beat = sqlx::query(BEAT)
            .bind(self.id)
            .execute(&mut *connection)
            .await?;
        if beat.rows_affected() == 1 {
            return Ok(false);
        }
        self.register_on(connection).await?;
        Ok(true)
    }

    /// Removes the replicas whose last beat is older than `dead_after`, and
    /// any other at this replica's seat (never this one), and hands back
    /// their claims, in one transaction.
    /// Replicas calling it at once hand each dead one's claims back once.
    pub async fn take_over(&self, dead_after: Duration) -> Result<Vec<TakenOver>, ReplicaError> {
        self.take_over_on(&mut *self.pool.acquire().await?, dead_after)
            .await
    }

    async fn take_over_on(
        &self,
        connection: &mut PgConnection,
        dead_after: Duration,
    ) -> Result<Vec<TakenOver>, ReplicaError> {
        let mut tx = sqlx::Connection::begin(connection).await?;
        let dead: Vec<Uuid> = sqlx::query_scalar(REMOVE_DEAD)
            .bind(dead_after.as_secs_f64())
            .bind(self.id)
            .bind(self.seat.get())
            .fetch_all(&mut *tx)
            .await?;
        if dead.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let released = release(&mut tx, &dead).await?;
        tx.commit().await?;
        Ok(released)
    }

    /// Records `seat` ([`seat_of`]) as this replica's: from then on its
    /// takeovers count another replica at that seat dead.
    pub async fn sit(&self, seat: &str) -> Result<(), ReplicaError> {
        let _ = self.seat.set(seat.to_owned());
        sqlx::query(SIT)
            .bind(self.id)
            .bind(seat)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Leaves the registry on a clean shutdown, handing back whatever this
    /// replica still has claimed (what the drain cut short): with its row
    /// gone no beat could ever go stale for them. Returns how many claims
    /// it handed back.
    pub async fn deregister(&self) -> Result<u64, ReplicaError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(DEREGISTER)
            .bind(self.id)
            .execute(&mut *tx)
            .await?;
        let released = release(&mut tx, &[self.id]).await?;
        tx.commit().await?;
        Ok(released.iter().map(TakenOver::total).sum())
    }

    /// One beat and, when this replica was alive (beating) all along, the
    /// takeover of the dead: see [`keep_beating`].
    async fn beat_and_take_over(
        &self,
        connection: &mut PgConnection,
        take_over: bool,
    ) -> Result<Beat, ReplicaError> {
        let registered_again = self.beat_on(connection).await?;
        let taken_over = if take_over {
            self.take_over_on(connection, DEAD_AFTER).await?
        } else {
            Vec::new()
        };
        Ok(Beat {
            registered_again,
            taken_over,
        })
    }
}

/// The seat of a process listening on `address` on this host: the host's
/// name and the address. `None` for an address the system chose (port 0),
/// which no successor could listen on again.
pub fn seat_of(address: std::net::SocketAddr) -> Option<String> {
    if address.port() == 0 {
        return None;
    }
    let host = rustix::system::uname();
    Some(format!("{} {address}", host.nodename().to_string_lossy()))
}

/// Hands back, on `tx`, every claim held by one of `holders`, per holder.
async fn release(
    tx: &mut Transaction<'_, Postgres>,
    holders: &[Uuid],
) -> Result<Vec<TakenOver>, ReplicaError> {
    let mut taken: Vec<TakenOver> = holders
        .iter()
        .map(|replica| TakenOver {
            replica: *replica,
            ..TakenOver::default()
        })
        .collect();
    // The pending index, whatever the statistics say (see RELEASE_DELIVERIES).
    sqlx::query("SET LOCAL enable_seqscan = off")
        .execute(&mut **tx)
        .await?;
    for (statement, field) in [
        (RELEASE_DELIVERIES, Kind::Deliveries),
        (RELEASE_VERIFICATIONS, Kind::Verifications),
        (RELEASE_FETCHES, Kind::Fetches),
        (RELEASE_EXPANSIONS, Kind::Expansions),
    ] {
        for row in sqlx::query(statement)
            .bind(holders)
            .fetch_all(&mut **tx)
            .await?
        {
            let replica: Uuid = row.try_get("replica")?;
            let released: i64 = row.try_get("released")?;
            let released = u64::try_from(released).unwrap_or(0);
            if let Some(entry) = taken.iter_mut().find(|entry| entry.replica == replica) {
                match field {
                    Kind::Deliveries => entry.deliveries += released,
                    Kind::Verifications => entry.verifications += released,
                    Kind::Fetches => entry.fetches += released,
                    Kind::Expansions => entry.expansions += released,
                }
            }
        }
    }
    Ok(taken)
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Deliveries,
    Verifications,
    Fetches,
    Expansions,
}

/// Beats every [`BEAT_INTERVAL`] until `stop`, taking over the claims of
/// replicas dead for [`DEAD_AFTER`] and calling `taken_over` when it took
/// some (to wake the workers that claim them). Logs each takeover at info.
///
/// A replica whose own beats failed for [`DEAD_AFTER`] (its database
/// connection cut, as everyone's may have been) takes over nothing at its
/// first beat back: the others, cut off as well, get a beat to show they
/// are alive before anyone judges them.
pub async fn keep_beating(
    replicas: Replicas,
    taken_over: impl Fn() + Send + 'static,
    stop: CancellationToken,
) {
    let mut every = tokio::time::interval(BEAT_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_beat = Some(Instant::now());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let alive_all_along = last_beat.is_some_and(|at| at.elapsed() < DEAD_AFTER);
        // On a connection of its own, closed if the beat times out: handed
        // back, a silenced one would hold its place in the pool for good.
        let beat = super::bounded(BEAT_TIMEOUT, &replicas.pool, async |connection| {
            replicas
                .beat_and_take_over(connection, alive_all_along)
                .await
        })
        .await;
        match beat {
            Ok(beat) => {
                last_beat = Some(Instant::now());
                if beat.registered_again {
                    warn!(
                        replica = %replicas.id(),
                        "this replica missed its beats and was taken for dead: its claims went \
                         to the others; registered again"
                    );
                }
                if report(&beat.taken_over) {
                    taken_over();
                }
            }
            Err(error) => warn!(%error, replica = %replicas.id(), "beating failed"),
        }
    }
}

/// Logs and counts what was taken over; whether anything was.
pub fn report(taken_over: &[TakenOver]) -> bool {
    let mut any = false;
    for taken in taken_over {
        info!(
            dead = %taken.replica,
            deliveries = taken.deliveries,
            verifications = taken.verifications,
            fetches = taken.fetches,
            expansions = taken.expansions,
            "took over the claims of a dead replica"
        );
        for (kind, count) in [
            ("delivery", taken.deliveries),
            ("verification", taken.verifications),
            ("fetch", taken.fetches),
            ("expansion", taken.expansions),
        ] {
            if count > 0 {
                metrics::counter!(CLAIMS_TAKEN_OVER_TOTAL, "kind" => kind).increment(count);
            }
        }
        any |= taken.total() > 0;
    }
    any
}
