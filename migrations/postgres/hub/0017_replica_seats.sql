-- Where a replica runs: its host's name and the address it listens on.
-- Two live processes cannot listen on one address of one host, so a
-- replica that takes a seat another still holds in this table is that
-- one's successor, restarted after a crash: it hands back its
-- predecessor's claims at once (websub_hub::storage::replicas), where a
-- stranger's wait until its heartbeat is a few seconds old.
ALTER TABLE websub_replicas ADD COLUMN seat TEXT NULL;
