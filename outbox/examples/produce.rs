//! A service that only produces: it records a domain change and the event
//! that tells of it in one transaction of its own database, so the event
//! exists exactly when the change does. websub-hub's dispatcher, reading
//! the same tables, delivers it; this program depends on `websub-outbox`
//! alone, not on the hub.
//!
//! ```sh
//! cargo run -p websub-outbox --example produce -- postgres://postgres@127.0.0.1:55432/postgres
//! ```

use websub_outbox::{Event, Outbox, OutboxTables};

struct UserAuthenticated {
    user_id: String,
}

impl Event for UserAuthenticated {
    fn name(&self) -> &str {
        "auth-api.user.authenticated"
    }
    fn resource_type(&self) -> &str {
        "user"
    }
    fn resource_id(&self) -> String {
        self.user_id.clone()
    }
    fn event_type(&self) -> &str {
        "authenticated"
    }
    fn payload(&self) -> Result<serde_json::Value, serde_json::Error> {
        Ok(serde_json::json!({ "user_id": self.user_id }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = std::env::args().nth(1) else {
        return Err("usage: produce POSTGRES_URL".into());
    };
    let pool = sqlx::PgPool::connect(&url).await?;
    let tables = OutboxTables::in_schema("example")?;
    // The two tables, as the messaging contract fixes them; a service
    // would have them in its own migrations.
    sqlx::raw_sql(sqlx::AssertSqlSafe(websub_outbox::ddl(&tables)))
        .execute(&pool)
        .await?;

    let outbox = Outbox::new(tables);
    let mut tx = pool.begin().await?;
    // ... the domain change, in `tx` ...
    let event = UserAuthenticated {
        user_id: "42".to_owned(),
    };
    let id = outbox
        .message(&event)
        .for_app("example")
        .notify()
        .send(&mut tx)
        .await?;
    tx.commit().await?;
    println!("event {id} written with the change, in one commit");
    Ok(())
}
