-- 0001's check that a delivery record's event exists, probing the events'
-- primary key once per event named. Written as `id IN (SELECT … FROM
-- inserted)`, the plan PL/pgSQL settles on after a few runs knows nothing
-- of the transition table's size and hashed it against a scan of every
-- event: under a steady publish rate each expansion read the whole log,
-- and deliveries fell seconds behind as it grew. An array of the ids
-- leaves the planner one way to go, the index.
CREATE OR REPLACE FUNCTION websub_deliveries_check_events() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
DECLARE
    wanted UUID[];
    found  BIGINT;
BEGIN
    SELECT array_agg(DISTINCT event_id) INTO wanted FROM inserted;
    SELECT count(*) INTO found FROM (
        SELECT 1 FROM websub_events
        WHERE id = ANY (wanted)
        FOR KEY SHARE
    ) AS locked;
    IF found <> coalesce(cardinality(wanted), 0) THEN
        RAISE EXCEPTION 'websub_deliveries.event_id names a missing websub_events row'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END
$$;
