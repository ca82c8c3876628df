-- The waiting count changes once per statement rather than once per row:
-- every row of a group of admissions, claims or outcomes updated the one
-- counter row on its own, and each update of that row walks the versions
-- the previous ones left behind. Transition tables hold a statement's rows;
-- a trigger that has them serves one event, hence three.
DROP TRIGGER websub_verifications_waiting_count ON websub_verifications;
DROP FUNCTION websub_verifications_waiting_count();

CREATE FUNCTION websub_verifications_waiting_change() RETURNS TRIGGER
LANGUAGE plpgsql
AS $$
DECLARE
    change BIGINT := 0;
BEGIN
    -- PL/pgSQL plans a statement when it first runs it, so the branch of an
    -- event without a given transition table never names it.
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        change := change + (SELECT count(*) FROM written WHERE next_attempt_at IS NOT NULL);
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        change := change - (SELECT count(*) FROM replaced WHERE next_attempt_at IS NOT NULL);
    END IF;
    IF change <> 0 THEN
        UPDATE websub_verifications_waiting SET count = count + change;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER websub_verifications_waiting_inserted
AFTER INSERT ON websub_verifications
REFERENCING NEW TABLE AS written
FOR EACH STATEMENT EXECUTE FUNCTION websub_verifications_waiting_change();

CREATE TRIGGER websub_verifications_waiting_updated
AFTER UPDATE ON websub_verifications
REFERENCING OLD TABLE AS replaced NEW TABLE AS written
FOR EACH STATEMENT EXECUTE FUNCTION websub_verifications_waiting_change();

CREATE TRIGGER websub_verifications_waiting_deleted
AFTER DELETE ON websub_verifications
REFERENCING OLD TABLE AS replaced
FOR EACH STATEMENT EXECUTE FUNCTION websub_verifications_waiting_change();
