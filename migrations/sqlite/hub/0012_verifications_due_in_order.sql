-- claim_intents() takes due intents by due time, then request time. With
-- both in the index a claim reads its rows in that order and stops at its
-- limit, where it used to sort every due row (up to the admission bound)
-- at each claim.
DROP INDEX websub_verifications_due;

CREATE INDEX websub_verifications_due
    ON websub_verifications (next_attempt_at, requested_at)
    WHERE next_attempt_at IS NOT NULL;
