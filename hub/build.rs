//! Rebuilds the hub when a migration changes: `sqlx::migrate!` embeds the
//! migration files at compile time, and cargo would not otherwise know that
//! a new or edited file under `migrations/` changes the crate.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
