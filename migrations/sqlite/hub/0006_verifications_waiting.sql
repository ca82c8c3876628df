-- How many verifications are waiting (due, retrying or in flight), kept by
-- triggers in the same transaction as every change to websub_verifications,
-- so admitting a subscribe request reads one row instead of counting them.

CREATE TABLE websub_verifications_waiting (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    count INTEGER NOT NULL CHECK (count >= 0)
);

INSERT INTO websub_verifications_waiting (singleton, count)
SELECT 1, count(*) FROM websub_verifications WHERE next_attempt_at IS NOT NULL;

CREATE TRIGGER websub_verifications_waiting_insert
AFTER INSERT ON websub_verifications
WHEN NEW.next_attempt_at IS NOT NULL
BEGIN
    UPDATE websub_verifications_waiting SET count = count + 1;
END;

CREATE TRIGGER websub_verifications_waiting_delete
AFTER DELETE ON websub_verifications
WHEN OLD.next_attempt_at IS NOT NULL
BEGIN
    UPDATE websub_verifications_waiting SET count = count - 1;
END;

CREATE TRIGGER websub_verifications_waiting_update
AFTER UPDATE OF next_attempt_at ON websub_verifications
WHEN (OLD.next_attempt_at IS NULL) <> (NEW.next_attempt_at IS NULL)
BEGIN
    UPDATE websub_verifications_waiting
    SET count = count + CASE WHEN NEW.next_attempt_at IS NULL THEN -1 ELSE 1 END;
END;
