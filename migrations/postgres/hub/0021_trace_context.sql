-- The trace an event's expansion and attempts continue: its intake span's
-- W3C `traceparent`, then a line with its `tracestate` when it has one.
-- NULL while tracing is off, and for what was recorded before.
ALTER TABLE websub_events ADD COLUMN trace_context TEXT NULL;

-- The same, of the latest ping for a topic: its fetch continues that trace.
ALTER TABLE websub_fetches ADD COLUMN trace_context TEXT NULL;
