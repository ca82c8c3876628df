//! Embeds the event log's migrations (`../migrations/{sqlite,postgres}/hub`)
//! into the crate, rebuilding it when a file there changes.

include!("../migrations/embed.rs");

fn main() {
    embed_migrations("../migrations/sqlite/hub", "sqlite_hub");
    embed_migrations("../migrations/postgres/hub", "postgres_hub");
}
