//! A service that delivers its own outbox, without the hub: the events it
//! wrote in its domain transactions (see `websub-outbox`'s `produce`
//! example) go to an in-process handler and, signed and retried, to a
//! webhook of another service, until Ctrl-C. This program depends on
//! `websub-dispatcher` alone; it compiles neither the hub, its web server
//! nor its stores.
//!
//! ```sh
//! WEBHOOK_SECRET=… cargo run -p websub-dispatcher --example dispatch -- \
//!     postgres://postgres@127.0.0.1:55432/postgres http://127.0.0.1:9000/hooks
//! ```

use std::collections::HashMap;

use tokio_util::sync::CancellationToken;
use websub_dispatcher::{
    Dispatcher, DispatcherConfig, Envelope, HandlerError, OutboxTables, WebhookSubscriber,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(database), Some(webhook)) = (args.next(), args.next()) else {
        return Err("usage: dispatch POSTGRES_URL WEBHOOK_URL".into());
    };
    let webhook = url::Url::parse(&webhook).map_err(|error| format!("{webhook:?}: {error}"))?;
    let pool = sqlx::PgPool::connect(&database).await?;
    let tables = OutboxTables::in_schema("example")?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(websub_dispatcher::ddl(&tables)))
        .execute(&pool)
        .await?;

    let config = DispatcherConfig {
        tables,
        // What this service's own handlers' rows are recorded under.
        subscriber_name: Some("example".to_owned()),
        // Every webhook body signed with HMAC-SHA256 under this secret.
        signing_secret: std::env::var("WEBHOOK_SECRET").ok(),
        // Webhooks of services inside the same private network; without
        // this, only public addresses are contacted.
        network: websub_dispatcher::NetPolicy {
            allow_private_network: true,
        },
        ..DispatcherConfig::default()
    };
    let dispatcher = Dispatcher::new(pool, config)?;
    dispatcher.register_handler(
        "auth-api.user.authenticated",
        async |envelope: Envelope| -> Result<(), HandlerError> {
            println!(
                "{} {}: {}",
                envelope.event_name, envelope.resource_id, envelope.data
            );
            Ok(())
        },
    )?;
    dispatcher.register_webhooks(
        "auth-api.user.authenticated",
        // Keyed by the name its rows are recorded under; `None`: every
        // app's events.
        HashMap::from([("audit".to_owned(), WebhookSubscriber::new(None, webhook))]),
    )?;

    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    println!("delivering until Ctrl-C");
    dispatcher.run(shutdown).await;
    Ok(())
}
