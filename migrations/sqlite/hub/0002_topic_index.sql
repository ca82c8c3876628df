-- health(): a subscription's delivery health looks at its topic's most recent
-- events; this index finds them without walking every other topic's.
CREATE INDEX websub_events_topic_created_at
    ON websub_events (topic, created_at);
