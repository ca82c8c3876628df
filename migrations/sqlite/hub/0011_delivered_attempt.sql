-- A delivery's successful attempt is kept in its record, written by the
-- update that closes it, rather than as a row of websub_attempts: a
-- delivery that succeeds costs one row write, not two. Failed attempts keep
-- their rows, so a delivery's history is its attempts' rows and, once
-- delivered, its record's attempt (websub_hub::events::EventLog::attempts).
-- NULL for records closed otherwise, and for those delivered before this
-- migration, whose successful attempt is a row of websub_attempts.
ALTER TABLE websub_deliveries ADD COLUMN delivered_attempt_at INTEGER NULL;
ALTER TABLE websub_deliveries ADD COLUMN delivered_duration_us INTEGER NULL;
ALTER TABLE websub_deliveries ADD COLUMN delivered_status INTEGER NULL;
ALTER TABLE websub_deliveries ADD COLUMN delivered_response BLOB NULL;
