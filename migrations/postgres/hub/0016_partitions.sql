-- The event log, its delivery records and their attempts, partitioned by
-- the event's id, so that retention drops whole partitions instead of
-- deleting rows (a large DELETE leaves dead tuples and bloat behind, and
-- costs as much as the rows it removes).
--
-- The key is the event's id because it is the one column all three tables
-- share, and every key the statements look rows up by starts with it: the
-- primary keys, the ON CONFLICT targets and the cascades stay what they
-- were, and each lookup by event prunes to one partition. Ids are UUIDv7,
-- whose first 48 bits are the Unix time in milliseconds, so a range of ids
-- is a range of recording times: the partitions of one range, in the three
-- tables, hold the events of that time with their records and attempts,
-- and go together.
--
-- The rows already here stay where they are: each table becomes the
-- partition `*_legacy` of a new partitioned table, covering every id up to
-- now, with its indexes attached rather than rebuilt. Partitions ahead of
-- the clock are created by the hub (`LogUpkeep::partition_ahead`, named
-- `*_p<first millisecond>`), and dropped by retention once every event in
-- them is older than the cutoff; a DEFAULT partition takes any id no range
-- covers (an id from a producer's own scheme, a clock far ahead), and
-- retention deletes its rows by age, as it does elsewhere.

ALTER TABLE websub_events RENAME TO websub_events_legacy;
ALTER INDEX websub_events_pkey RENAME TO websub_events_legacy_pkey;
ALTER INDEX websub_events_created_at RENAME TO websub_events_legacy_created_at;
ALTER INDEX websub_events_topic_created_at RENAME TO websub_events_legacy_topic_created_at;
ALTER INDEX websub_events_unexpanded RENAME TO websub_events_legacy_unexpanded;
DROP TRIGGER websub_events_cascade_deliveries ON websub_events_legacy;
DROP TRIGGER websub_events_cascade_attempts ON websub_events_legacy;
DROP TRIGGER websub_events_id_fixed ON websub_events_legacy;

ALTER TABLE websub_deliveries RENAME TO websub_deliveries_legacy;
ALTER INDEX websub_deliveries_pkey RENAME TO websub_deliveries_legacy_pkey;
ALTER INDEX websub_deliveries_pending RENAME TO websub_deliveries_legacy_pending;
ALTER INDEX websub_deliveries_lane RENAME TO websub_deliveries_legacy_lane;
ALTER INDEX websub_deliveries_ordered RENAME TO websub_deliveries_legacy_ordered;
DROP TRIGGER websub_deliveries_check_events ON websub_deliveries_legacy;
DROP TRIGGER websub_deliveries_event_id_fixed ON websub_deliveries_legacy;

ALTER TABLE websub_attempts RENAME TO websub_attempts_legacy;
ALTER INDEX websub_attempts_delivery RENAME TO websub_attempts_legacy_delivery;

CREATE TABLE websub_events (
    LIKE websub_events_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED
) PARTITION BY RANGE (id);
ALTER TABLE websub_events ADD CONSTRAINT websub_events_pkey PRIMARY KEY (id);
CREATE INDEX websub_events_created_at ON websub_events (created_at);
CREATE INDEX websub_events_topic_created_at ON websub_events (topic, created_at);
CREATE INDEX websub_events_unexpanded
    ON websub_events (created_at, id)
    WHERE expanded_at IS NULL;

CREATE TABLE websub_deliveries (
    LIKE websub_deliveries_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED
) PARTITION BY RANGE (event_id);
ALTER TABLE websub_deliveries
    ADD CONSTRAINT websub_deliveries_pkey PRIMARY KEY (event_id, subscriber);
CREATE INDEX websub_deliveries_pending
    ON websub_deliveries (next_attempt_at)
    WHERE processed_at IS NULL;
CREATE INDEX websub_deliveries_lane
    ON websub_deliveries (lane, next_attempt_at)
    WHERE processed_at IS NULL;
CREATE INDEX websub_deliveries_ordered
    ON websub_deliveries (lane, order_key, event_id)
    WHERE processed_at IS NULL AND order_key IS NOT NULL;

CREATE TABLE websub_attempts (
    LIKE websub_attempts_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED
) PARTITION BY RANGE (event_id);
CREATE INDEX websub_attempts_delivery
    ON websub_attempts (event_id, subscriber, attempted_at);

-- The legacy partitions cover every id below the first millisecond after
-- now and after the greatest id in the log (a producer's id may run ahead
-- of the clock); attaching checks that, in one scan of each table.
DO $$
DECLARE
    last_ms BIGINT;
    bound   TEXT;
BEGIN
    SELECT greatest(
        floor(extract(EPOCH FROM clock_timestamp()) * 1000)::BIGINT,
        coalesce((
            SELECT ('x' || substr(replace(id::TEXT, '-', ''), 1, 12))::BIT(48)::BIGINT
            FROM websub_events_legacy ORDER BY id DESC LIMIT 1), 0),
        coalesce((
            SELECT ('x' || substr(replace(event_id::TEXT, '-', ''), 1, 12))::BIT(48)::BIGINT
            FROM websub_deliveries_legacy ORDER BY event_id DESC LIMIT 1), 0),
        coalesce((
            SELECT ('x' || substr(replace(event_id::TEXT, '-', ''), 1, 12))::BIT(48)::BIGINT
            FROM websub_attempts_legacy ORDER BY event_id DESC LIMIT 1), 0))
    INTO last_ms;
    bound := (lpad(to_hex(last_ms + 1), 12, '0') || '00000000000000000000')::UUID::TEXT;
    EXECUTE format(
        'ALTER TABLE websub_events ATTACH PARTITION websub_events_legacy '
        'FOR VALUES FROM (MINVALUE) TO (%L)', bound);
    EXECUTE format(
        'ALTER TABLE websub_deliveries ATTACH PARTITION websub_deliveries_legacy '
        'FOR VALUES FROM (MINVALUE) TO (%L)', bound);
    EXECUTE format(
        'ALTER TABLE websub_attempts ATTACH PARTITION websub_attempts_legacy '
        'FOR VALUES FROM (MINVALUE) TO (%L)', bound);
END
$$;

CREATE TABLE websub_events_default PARTITION OF websub_events DEFAULT;
CREATE TABLE websub_deliveries_default PARTITION OF websub_deliveries DEFAULT
    WITH (fillfactor = 50);
CREATE TABLE websub_attempts_default PARTITION OF websub_attempts DEFAULT;

-- The triggers of 0001 and 0005, on the partitioned tables: statement
-- triggers see the rows of every partition a statement touches.
CREATE TRIGGER websub_deliveries_check_events
    AFTER INSERT ON websub_deliveries
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION websub_deliveries_check_events();

CREATE TRIGGER websub_events_cascade_deliveries
    AFTER DELETE ON websub_events
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION websub_events_cascade_deliveries();

CREATE TRIGGER websub_events_cascade_attempts
    AFTER DELETE ON websub_events
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION websub_events_cascade_attempts();

CREATE TRIGGER websub_events_id_fixed
    BEFORE UPDATE OF id ON websub_events
    FOR EACH ROW EXECUTE FUNCTION websub_refuse_key_update('id');

CREATE TRIGGER websub_deliveries_event_id_fixed
    BEFORE UPDATE OF event_id ON websub_deliveries
    FOR EACH ROW EXECUTE FUNCTION websub_refuse_key_update('event_id');

-- The claims found their rows again by ctid, which is unique within one
-- table only: across partitions two rows can share it. They now join the
-- rows they locked by primary key, each probe pruned to its partition.
-- The replicas of a version before 0011 call the signatures without a
-- claimer; they are replaced too.
CREATE OR REPLACE FUNCTION websub_claim_deliveries(
    claim_at     TIMESTAMPTZ,
    stale_before TIMESTAMPTZ,
    max_rows     BIGINT,
    claimer      UUID
) RETURNS TABLE (event_id UUID, topic TEXT, subscriber TEXT, retry_count INT)
LANGUAGE plpgsql
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE websub_deliveries AS d
    SET processing_since = claim_at, claimed_by = claimer
    FROM (
        SELECT event_id, subscriber FROM websub_deliveries
        WHERE processed_at IS NULL
          AND next_attempt_at <= claim_at
          AND (processing_since IS NULL OR processing_since < stale_before)
        ORDER BY next_attempt_at
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED) AS due, websub_events AS e
    WHERE d.event_id = due.event_id AND d.subscriber = due.subscriber
      AND e.id = d.event_id
    RETURNING d.event_id, e.topic, d.subscriber::TEXT, d.retry_count;
END
$$;

CREATE OR REPLACE FUNCTION websub_claim_deliveries(
    claim_at     TIMESTAMPTZ,
    stale_before TIMESTAMPTZ,
    max_rows     BIGINT
) RETURNS TABLE (event_id UUID, topic TEXT, subscriber TEXT, retry_count INT)
LANGUAGE sql AS $$
    SELECT * FROM websub_claim_deliveries(claim_at, stale_before, max_rows, NULL)
$$;

CREATE OR REPLACE FUNCTION websub_claim_lanes(
    claim_at     TIMESTAMPTZ,
    stale_before TIMESTAMPTZ,
    lanes        TEXT[],
    counts       BIGINT[],
    claimer      UUID
) RETURNS TABLE (event_id UUID, topic TEXT, subscriber TEXT, retry_count INT)
LANGUAGE plpgsql
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
BEGIN
    FOR i IN 1 .. coalesce(array_length(lanes, 1), 0) LOOP
        RETURN QUERY
        UPDATE websub_deliveries AS d
        SET processing_since = claim_at, claimed_by = claimer
        FROM (
            SELECT event_id, subscriber FROM websub_deliveries
            WHERE lane = lanes[i]
              AND processed_at IS NULL
              AND next_attempt_at <= claim_at
              AND (processing_since IS NULL OR processing_since < stale_before)
            ORDER BY lane, next_attempt_at
            LIMIT counts[i]
            FOR UPDATE SKIP LOCKED) AS due, websub_events AS e
        WHERE d.event_id = due.event_id AND d.subscriber = due.subscriber
          AND e.id = d.event_id
        RETURNING d.event_id, e.topic, d.subscriber::TEXT, d.retry_count;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION websub_claim_lanes(
    claim_at     TIMESTAMPTZ,
    stale_before TIMESTAMPTZ,
    lanes        TEXT[],
    counts       BIGINT[]
) RETURNS TABLE (event_id UUID, topic TEXT, subscriber TEXT, retry_count INT)
LANGUAGE sql AS $$
    SELECT * FROM websub_claim_lanes(claim_at, stale_before, lanes, counts, NULL)
$$;
