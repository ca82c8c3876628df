-- How many verifications are waiting (due, retrying or in flight), kept by
-- a trigger in the same transaction as every change to
-- websub_verifications, so admitting a subscribe request reads one row
-- instead of counting them.

CREATE TABLE websub_verifications_waiting (
    singleton BOOLEAN NOT NULL PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    count BIGINT  NOT NULL CHECK (count >= 0)
);

-- Counted under a lock on the table, so no change slips in between the
-- count and the trigger.
LOCK TABLE websub_verifications IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO websub_verifications_waiting (singleton, count)
SELECT TRUE, count(*) FROM websub_verifications WHERE next_attempt_at IS NOT NULL;

CREATE FUNCTION websub_verifications_waiting_count() RETURNS TRIGGER
LANGUAGE plpgsql
AS $$
DECLARE
    change BIGINT := 0;
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.next_attempt_at IS NOT NULL THEN
        change := change + 1;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') AND OLD.next_attempt_at IS NOT NULL THEN
        change := change - 1;
    END IF;
    IF change <> 0 THEN
        UPDATE websub_verifications_waiting SET count = count + change;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER websub_verifications_waiting_count
AFTER INSERT OR UPDATE OF next_attempt_at OR DELETE ON websub_verifications
FOR EACH ROW EXECUTE FUNCTION websub_verifications_waiting_count();
