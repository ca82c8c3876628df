//! The scenarios of `websub-bench hub` (see the parent module): each
//! subscribes its callbacks through the hub, publishes, follows what nginx
//! received, and makes the row it is judged by.

use super::*;

pub(super) async fn one_host(
    run: &Run<'_>,
    nginx: &Nginx,
    database_url: &str,
) -> Result<Row, Failure> {
    let subscribers = run.args.one_host_subscribers;
    let OneHost {
        topic,
        follower,
        hub,
        subscribed,
    } = one_host_subscribed(run, nginx, database_url, subscribers).await?;

    let wal_before = wal_position(database_url).await;
    let cpu_before = hub.cpu_time();
    let ping_ms = ping(run, &hub, &topic, None).await?;
    let deadline = Instant::now() + Duration::from_secs(run.args.deadline);
    delivered(run, &follower, subscribers, deadline).await;
    let cpu = match cpu_before {
        Some(before) => settled_cpu(&hub, before).await,
        None => None,
    };
    // Settled, the outcomes are written too.
    let wal = match &wal_before {
        Some(position) => wal_written_since(database_url, position).await,
        None => None,
    };
    let peak_rss = hub.peak_rss();
    hub.stop();
    let tally = follower.tally();
    let mut row = fan_out_row(run, Scenario::OneHost, &tally, ping_ms, cpu, peak_rss);
    row.details = join(&[
        format!("subscribed in {:.1} s", subscribed.as_secs_f64()),
        wal.map(|bytes| format!("WAL {:.0} B a delivery", bytes / subscribers.max(1) as f64))
            .unwrap_or_default(),
        shortfall(&tally, subscribers),
    ]);
    Ok(row)
}

/// Where the PostgreSQL server's write-ahead log stands, to tell what a
/// fan-out writes; `None` on SQLite (or if it cannot be read).
async fn wal_position(database_url: &str) -> Option<String> {
    use sqlx::Connection;
    if !database_url.starts_with("postgres") {
        return None;
    }
    let mut connection = sqlx::PgConnection::connect(database_url).await.ok()?;
    sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut connection)
        .await
        .ok()
}

/// The bytes of write-ahead log the server wrote since `position`: the
/// hub's writes, as nothing else runs on the benchmark's server.
async fn wal_written_since(database_url: &str, position: &str) -> Option<f64> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(database_url).await.ok()?;
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
        .bind(position)
        .fetch_one(&mut connection)
        .await
        .ok()
}

pub(super) async fn mixed(
    run: &Run<'_>,
    nginx: &Nginx,
    database_url: &str,
) -> Result<Row, Failure> {
    let args = run.args;
    let expected = args.mixed_big + args.mixed_hosts * args.mixed_per_host;
    let big = nginx.base(Ipv4Addr::LOCALHOST);
    let topic = run.topic(&big);
    // Group 0 is the big host, group h the h-th small one.
    let mut callbacks: Vec<String> = (0..args.mixed_big)
        .map(|index| run.callback(&big, "0", index))
        .collect();
    for host in 0..args.mixed_hosts {
        let base = nginx.base(small_host(host));
        let group = (host + 1).to_string();
        callbacks.extend((0..args.mixed_per_host).map(|index| run.callback(&base, &group, index)));
    }
    // Subscribers come in no particular order: the small hosts'
    // subscriptions are spread among the big host's, the same way in
    // every run.
    callbacks.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
    let follower = Follower::start(&[nginx.access_log()], &run.prefix())?;
    let hub = run.start_websubd(database_url, None).await?;
    let subscribed = subscribe(run, &hub, &follower, &topic, callbacks).await?;

    let cpu_before = hub.cpu_time();
    let ping_ms = ping(run, &hub, &topic, None).await?;
    let deadline = Instant::now() + Duration::from_secs(args.deadline);
    delivered(run, &follower, expected, deadline).await;
    let cpu = match cpu_before {
        Some(before) => settled_cpu(&hub, before).await,
        None => None,
    };
    let peak_rss = hub.peak_rss();
    hub.stop();

    let tally = follower.tally();
    let prefix = run.prefix();
    // Per small host: its first delivery and its last one.
    let mut hosts: std::collections::HashMap<&str, (u64, u64, usize)> =
        std::collections::HashMap::new();
    for (path, received) in &tally.callbacks {
        let group = path
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or("0");
        if group == "0" {
            continue;
        }
        let host = hosts.entry(group).or_insert((u64::MAX, 0, 0));
        host.0 = host.0.min(received.first_ms);
        host.1 = host.1.max(received.first_ms);
        host.2 += 1;
    }
    let small = args.mixed_hosts * args.mixed_per_host;
    let small_delivered: usize = hosts.values().map(|host| host.2).sum();
    let every_first = hosts.values().map(|host| host.0).max();
    let every_last = hosts.values().map(|host| host.1).max();
    let small_hosts = if hosts.len() == args.mixed_hosts && small_delivered == small {
        format!(
            "{} small hosts: each had its first delivery by {:.2} s, all {small} by {:.2} s",
            args.mixed_hosts,
            seconds_between(ping_ms, every_first.unwrap_or_default()).as_secs_f64(),
            seconds_between(ping_ms, every_last.unwrap_or_default()).as_secs_f64(),
        )
    } else {
        format!(
            "small hosts: INCOMPLETE, {small_delivered} of {small} delivered on {} of {} hosts",
            hosts.len(),
            args.mixed_hosts
        )
    };
    let mut row = fan_out_row(run, Scenario::Mixed, &tally, ping_ms, cpu, peak_rss);
    row.details = join(&[
        small_hosts,
        format!("subscribed in {:.1} s", subscribed.as_secs_f64()),
        shortfall(&tally, expected),
    ]);
    Ok(row)
}

pub(super) async fn outage(
    run: &Run<'_>,
    nginx: &Nginx,
    database_url: &str,
) -> Result<Row, Failure> {
    let args = run.args;
    let mut down_host = Nginx::start(&run.dir.join("nginx-down"), &[Ipv4Addr::LOCALHOST]).await?;
    let base = nginx.base(Ipv4Addr::LOCALHOST);
    let topic = run.topic(&base);
    let down_callback = run.callback(&down_host.base(Ipv4Addr::LOCALHOST), "down", 0);
    let down_path = format!("{}down/0", run.prefix());
    let mut callbacks: Vec<String> = (0..args.outage_callbacks - 1)
        .map(|index| run.callback(&base, "0", index))
        .collect();
    callbacks.push(down_callback);
    let follower = Follower::start(&[nginx.access_log(), down_host.access_log()], &run.prefix())?;
    let hub = run.start_websubd(database_url, None).await?;
    subscribe(run, &hub, &follower, &topic, callbacks).await?;

    let pings = args.outage_seconds * u64::from(args.outage_rate);
    let cpu_before = hub.cpu_time();
    let first_ms = now_ms();
    let started = Instant::now();
    let publisher = tokio::spawn({
        let (hub_url, topic, body_bytes) = (hub.url.clone(), topic.clone(), args.body_bytes);
        let period = Duration::from_secs(1) / args.outage_rate;
        async move {
            let client = crate::launch::loopback_client(1).map_err(|error| error.to_string())?;
            let mut ticks = tokio::time::interval(period);
            let mut refused = 0_u64;
            for sequence in 0..pings {
                ticks.tick().await;
                let body = json_body(body_bytes, Some(sequence));
                match fat_ping(&client, &hub_url, &topic, "application/json", body).await {
                    Ok(true) => {}
                    Ok(false) | Err(_) => refused += 1,
                }
            }
            Ok::<u64, String>(refused)
        }
    });
    let progress = Progress::follow(
        &format!("{}: delivered", run.tag),
        usize::try_from(pings).unwrap_or(usize::MAX) * args.outage_callbacks,
        follower.distinct(),
    );
    tokio::time::sleep_until((started + Duration::from_secs(args.outage_at)).into()).await;
    down_host.stop().await?;
    let down_ms = now_ms();
    tokio::time::sleep_until(
        (started + Duration::from_secs(args.outage_at + args.outage_down)).into(),
    )
    .await;
    down_host.resume().await?;
    let up_ms = now_ms();
    let refused = tokio::time::timeout(Duration::from_secs(args.outage_seconds + 60), publisher)
        .await
        .map_err(|_| format!("{}: the pings did not end in time", run.tag))???;
    let published = pings - refused;
    let expected = usize::try_from(published).unwrap_or(usize::MAX) * args.outage_callbacks;
    let deadline = Instant::now() + Duration::from_secs(args.deadline);
    // The clock is read from nginx's log, so waiting does not count.
    delivered(run, &follower, expected, deadline).await;
    drop(progress);
    let cpu = match cpu_before {
        Some(before) => settled_cpu(&hub, before).await,
        None => None,
    };
    let peak_rss = hub.peak_rss();
    hub.stop();
    down_host.stop().await?;

    let tally = follower.tally();
    let everything = usize::try_from(published).unwrap_or(usize::MAX);
    let missing = tally.events() < everything;
    let down = tally.callbacks.get(down_path.as_str());
    let down_got = down.map_or(0, |received| received.events.len());
    let down_duplicates = down.map_or(0, |received| received.duplicates);
    let down_all = match down {
        Some(received) if down_got >= everything => format!(
            "all of them {:.1} s after its return",
            seconds_between(up_ms, received.last_new_ms).as_secs_f64()
        ),
        Some(received) if received.last_new_ms >= up_ms => {
            format!("not all by {} s after the last ping", args.deadline)
        }
        _ => format!(
            "none after its return, by {} s after the last ping",
            args.deadline
        ),
    };
    let others = tally
        .callbacks
        .iter()
        .filter(|(path, received)| {
            path.as_ref() != down_path.as_str() && received.events.len() >= everything
        })
        .count();
    let elapsed = seconds_between(first_ms, tally.last_new_ms);
    let rate = tally.distinct as f64 / elapsed.as_secs_f64().max(1e-3);
    Ok(Row {
        deliveries: Some(tally.distinct),
        elapsed: Some(elapsed),
        rate,
        cpu_per_delivery: per_delivery(cpu, tally.distinct),
        peak_rss,
        details: join(&[
            format!(
                "{published} events published ({refused} refused); the host down for {:.0} s got {down_got} of them, {down_all}, {down_duplicates} twice",
                seconds_between(down_ms, up_ms).as_secs_f64()
            ),
            format!("the other {}: {others} got all", args.outage_callbacks - 1),
            if missing {
                format!("{} events reached nobody", everything - tally.events())
            } else {
                String::new()
            },
            if tally.duplicates > 0 {
                format!("{} duplicates in all", tally.duplicates)
            } else {
                String::new()
            },
        ]),
        ..run.row(Scenario::Outage)
    })
}

pub(super) async fn restart(
    run: &Run<'_>,
    nginx: &Nginx,
    database_url: &str,
) -> Result<Row, Failure> {
    let args = run.args;
    let subscribers = args.restart_subscribers;
    let OneHost {
        topic,
        follower,
        hub,
        ..
    } = one_host_subscribed(run, nginx, database_url, subscribers).await?;

    let kill_at = (subscribers * usize::from(args.restart_kill_at)).div_ceil(100);
    let cpu_before = hub.cpu_time();
    let ping_ms = ping(run, &hub, &topic, None).await?;
    let deadline = Instant::now() + Duration::from_secs(args.deadline);
    if !delivered(run, &follower, kill_at, deadline).await {
        return Err(format!(
            "{}: {} of {kill_at} delivered before the kill, within {} s",
            run.tag,
            follower.tally().distinct,
            args.deadline
        )
        .into());
    }
    let first_cpu = match (cpu_before, hub.cpu_time()) {
        (Some(before), Some(now)) => Some(now.saturating_sub(before)),
        _ => None,
    };
    let first_rss = hub.peak_rss();
    let port = hub.port().ok_or("websubd's URL has no port")?;
    hub.kill();
    let killed_at = follower.tally().distinct;

    let restarted = Instant::now();
    let restart_ms = now_ms();
    let hub = run.start_websubd(database_url, Some(port)).await?;
    let ready = restarted.elapsed();
    let second_before = hub.cpu_time();
    let deadline = restarted + Duration::from_secs(args.deadline);
    let complete = delivered(run, &follower, subscribers, deadline).await;
    let second_cpu = match second_before {
        Some(before) => settled_cpu(&hub, before).await,
        None => None,
    };
    let peak_rss = hub.peak_rss().max(first_rss);
    hub.stop();

    let tally = follower.tally();
    let cpu = first_cpu
        .zip(second_cpu)
        .map(|(first, second)| first + second);
    let mut row = fan_out_row(run, Scenario::Restart, &tally, ping_ms, cpu, peak_rss);
    row.share = None;
    let lost = subscribers.saturating_sub(tally.callbacks.len());
    row.details = join(&[
        format!(
            "killed at {killed_at} delivered ({:.0} %); ready again in {:.1} s",
            100.0 * killed_at as f64 / subscribers as f64,
            ready.as_secs_f64()
        ),
        if complete {
            format!(
                "all delivered {:.1} s after the restart",
                seconds_between(restart_ms, tally.last_new_ms).as_secs_f64()
            )
        } else {
            String::new()
        },
        format!("lost {lost}"),
        format!("{} duplicates", tally.duplicates),
    ]);
    Ok(row)
}

/// A websubd with `subscribers` callbacks on 127.0.0.1's nginx subscribed
/// to one topic, and the follower of that nginx's log.
struct OneHost {
    topic: String,
    follower: Follower,
    hub: Hub,
    subscribed: Duration,
}

async fn one_host_subscribed(
    run: &Run<'_>,
    nginx: &Nginx,
    database_url: &str,
    subscribers: usize,
) -> Result<OneHost, Failure> {
    let base = nginx.base(Ipv4Addr::LOCALHOST);
    let topic = run.topic(&base);
    let callbacks = (0..subscribers)
        .map(|index| run.callback(&base, "0", index))
        .collect();
    let follower = Follower::start(&[nginx.access_log()], &run.prefix())?;
    let hub = run.start_websubd(database_url, None).await?;
    let subscribed = subscribe(run, &hub, &follower, &topic, callbacks).await?;
    Ok(OneHost {
        topic,
        follower,
        hub,
        subscribed,
    })
}

/// Subscribes every callback to `topic` through the hub's `POST /`, a
/// bounded number at once, and waits until nginx has answered every
/// verification and the hub lists them all; returns how long it took.
async fn subscribe(
    run: &Run<'_>,
    hub: &Hub,
    follower: &Follower,
    topic: &str,
    callbacks: Vec<String>,
) -> Result<Duration, Failure> {
    let total = callbacks.len();
    let client = crate::launch::loopback_client(run.args.subscribe_concurrency)?;
    let callbacks = Arc::new(callbacks);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + SUBSCRIBE_LIMIT;
    let progress = Progress::follow(
        &format!("{}: verified", run.tag),
        total,
        follower.verified(),
    );
    let senders: Vec<_> = (0..run.args.subscribe_concurrency.min(total))
        .map(|_| {
            let (client, callbacks, next) = (client.clone(), callbacks.clone(), next.clone());
            let (hub_url, topic, tag) = (hub.url.clone(), topic.to_owned(), run.tag.clone());
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(callback) = callbacks.get(index) else {
                        return Ok::<(), String>(());
                    };
                    let form = format!(
                        "hub.mode=subscribe&hub.topic={}&hub.callback={}&hub.secret=bench-{tag}-{index}",
                        urlencode(&topic),
                        urlencode(callback),
                    );
                    crate::launch::subscribe_until_accepted(
                        &client,
                        &hub_url,
                        form,
                        Duration::from_millis(50),
                        deadline,
                    )
                    .await
                    .map_err(|error| format!("subscribing {callback}: {error}"))?;
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await??;
    }
    while follower.tally().verified() < total {
        if Instant::now() > deadline {
            return Err(format!(
                "{}: nginx answered {} of {total} verifications within {SUBSCRIBE_LIMIT:?}",
                run.tag,
                follower.tally().verified()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(progress);
    // The hub saves a subscription just after its verification answered.
    let client = crate::launch::loopback_client(1)?;
    loop {
        let listed = subscribers_of(&client, &hub.url, topic).await?;
        if listed >= total {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{}: the hub lists {listed} of {total} subscriptions within {SUBSCRIBE_LIMIT:?}",
                run.tag
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{}: {total} subscribed in {:.1} s",
        run.tag,
        elapsed.as_secs_f64()
    );
    Ok(elapsed)
}

/// How many subscriptions the hub's operator API lists for `topic`.
async fn subscribers_of(
    client: &reqwest::Client,
    hub_url: &str,
    topic: &str,
) -> Result<usize, Failure> {
    let response = client
        .get(format!("{hub_url}api/v1/operator/topics"))
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .send()
        .await?;
    if !response.status().is_success() {
        return Err(format!("the operator API answered {}", response.status()).into());
    }
    let topics: serde_json::Value = response.json().await?;
    Ok(topics
        .as_array()
        .into_iter()
        .flatten()
        .find(|summary| summary["topic"] == topic)
        .and_then(|summary| summary["subscribers"].as_u64())
        .unwrap_or(0) as usize)
}

/// Sends one fat ping to `topic`; returns when it was sent, in ms since
/// the epoch, nginx's clock.
async fn ping(
    run: &Run<'_>,
    hub: &Hub,
    topic: &str,
    sequence: Option<u64>,
) -> Result<u64, Failure> {
    let client = crate::launch::loopback_client(1)?;
    let sent = now_ms();
    let body = json_body(run.args.body_bytes, sequence);
    if !fat_ping(&client, &hub.url, topic, "application/json", body).await? {
        return Err(format!("{}: the hub refused the fat ping", run.tag).into());
    }
    Ok(sent)
}

/// Waits until `expected` distinct deliveries arrived, or `deadline`;
/// true when they did.
async fn delivered(run: &Run<'_>, follower: &Follower, expected: usize, deadline: Instant) -> bool {
    let _progress = Progress::follow(
        &format!("{}: delivered", run.tag),
        expected,
        follower.distinct(),
    );
    loop {
        if follower.tally().distinct >= expected {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// websubd's CPU time since `before`, once it is idle: the last outcomes
/// are written a moment after the last delivery arrives.
async fn settled_cpu(hub: &Hub, before: Duration) -> Option<Duration> {
    let mut last = hub.cpu_time()?;
    // Idle: under 2 ms of CPU in 250 ms; or 10 s on.
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = hub.cpu_time()?;
        if now.saturating_sub(last) < Duration::from_millis(2) {
            break;
        }
        last = now;
    }
    Some(hub.cpu_time()?.saturating_sub(before))
}

fn per_delivery(cpu: Option<Duration>, deliveries: usize) -> Option<Duration> {
    Some(cpu? / u32::try_from(deliveries).ok()?.max(1))
}

fn seconds_between(from_ms: u64, to_ms: u64) -> Duration {
    Duration::from_millis(to_ms.saturating_sub(from_ms))
}

/// Fills in the columns every fan-out has, from one ping at `ping_ms` to
/// the last new delivery.
fn fan_out_row(
    run: &Run<'_>,
    scenario: Scenario,
    tally: &Tally,
    ping_ms: u64,
    cpu: Option<Duration>,
    peak_rss: Option<u64>,
) -> Row {
    let elapsed = seconds_between(ping_ms, tally.last_new_ms);
    let rate = tally.distinct as f64 / elapsed.as_secs_f64().max(1e-3);
    Row {
        deliveries: Some(tally.distinct),
        elapsed: Some(elapsed),
        rate,
        share: Some(rate / run.ceiling),
        cpu_per_delivery: per_delivery(cpu, tally.distinct),
        peak_rss,
        ..run.row(scenario)
    }
}

/// What a run did not get: appended to its details.
fn shortfall(tally: &Tally, expected: usize) -> String {
    let mut notes = Vec::new();
    if tally.distinct < expected {
        notes.push(format!(
            "INCOMPLETE: {} of {expected} by the deadline",
            tally.distinct
        ));
    }
    if tally.duplicates > 0 {
        notes.push(format!("{} duplicates", tally.duplicates));
    }
    if tally.refused > 0 {
        notes.push(format!("{} answered non-2xx", tally.refused));
    }
    notes.join("; ")
}

fn join(parts: &[String]) -> String {
    parts
        .iter()
        .filter(|part| !part.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join("; ")
}
