//! Embeds the stores' migrations (`../migrations/{sqlite,postgres}/store`)
//! into the crate, rebuilding it when a file there changes.

include!("../migrations/embed.rs");

fn main() {
    embed_migrations("../migrations/sqlite/store", "sqlite_store");
    embed_migrations("../migrations/postgres/store", "postgres_store");
}
