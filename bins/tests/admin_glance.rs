//! The admin page read at a glance, in a real browser (headless Chromium)
//! against the real `websubd`: deliveries made through the hub, some
//! delivered and some failing against a callback answering 500, show on
//! the overview's charts with their counts (read from the charts' text and
//! labels, not their pixels), the failing callback heads the failing
//! endpoints and its page shows its state and history; the overview
//! reloads itself when asked; the verifications page lists a failed and a
//! waiting verification; lists go to a second page past a page of rows and
//! narrow to a search; and bad paging or search input is a 400.
//!
//! `WEBSUB_ADMIN_GLANCE_SCREENSHOTS=docs` makes the first test write the
//! charts (`admin-charts.png`) and one endpoint's page
//! (`admin-endpoint.png`) in that directory, relative to the workspace
//! root: how the README's screenshots are made.

use std::time::Duration;

use fantoccini::Locator;
use reqwest::header;
use websub_tests::{Answer, INTERNAL_KEY, TestSubscriber};

use crate::admin::{
    TOPIC, client, log_in, log_in_browser, start_hub, subscribe, three_events_one_broken,
};
use crate::common;
use common::browser::Browser;
use common::{cookie_set_by, scratch_dir};

/// Writes the window's screenshot as `name` in the directory
/// `WEBSUB_ADMIN_GLANCE_SCREENSHOTS` names, when it is set.
async fn screenshot(browser: &Browser, name: &str) {
    if let Some(dir) = std::env::var_os("WEBSUB_ADMIN_GLANCE_SCREENSHOTS") {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(dir)
            .join(name);
        std::fs::write(&path, browser.screenshot().await)
            .unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
    }
}

/// An attribute of the element `css` selects.
async fn attribute(browser: &Browser, css: &str, name: &str) -> String {
    browser
        .find(css)
        .await
        .attr(name)
        .await
        .unwrap_or_else(|error| panic!("{name} of {css}: {error}"))
        .unwrap_or_else(|| panic!("{css} has no {name}"))
}

/// How many elements `css` selects.
async fn count(browser: &Browser, css: &str) -> usize {
    browser
        .client
        .find_all(Locator::Css(css))
        .await
        .unwrap_or_else(|error| panic!("find {css}: {error}"))
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_charts_deliveries_failures_and_endpoints_in_the_browser() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = scratch_dir("admin-glance");
    let subscriber = TestSubscriber::start().await;
    let (hub, broken, steady) =
        three_events_one_broken(&dir, &subscriber, Answer::status(500)).await;
    // One retry each: two failed attempts per event.
    assert_eq!(subscriber.attempts("broken"), 6);

    log_in_browser(&browser, &hub).await;
    browser.goto(&format!("{}admin#charts", hub.url)).await;
    for chart in ["#hour-deliveries", "#day-deliveries"] {
        let summary = browser.text(&format!("{chart} .summary")).await;
        assert!(
            summary.contains("delivered 3, failed 6"),
            "{chart}: {summary}"
        );
        let label = attribute(&browser, &format!("{chart} svg"), "aria-label").await;
        assert!(label.contains("delivered 3, failed 6"), "{chart}: {label}");
        assert_eq!(
            count(&browser, &format!("{chart} svg polyline.series")).await,
            2,
            "{chart}: a line each for deliveries and failures"
        );
    }
    assert!(
        browser
            .text("#day-deliveries figcaption")
            .await
            .contains("per 15 minutes"),
        "the day's chart says its bucket"
    );
    for chart in ["#hour-latency", "#day-latency"] {
        let summary = browser.text(&format!("{chart} .summary")).await;
        assert!(
            summary.contains("p50 ") && summary.contains("p99 ") && summary.contains(" ms"),
            "{chart}: {summary}"
        );
        assert_eq!(
            count(&browser, &format!("{chart} text.empty")).await,
            0,
            "{chart} has attempts to draw"
        );
        assert!(
            count(&browser, &format!("{chart} svg .series")).await >= 2,
            "{chart}: the median and the 99th percentile are drawn"
        );
    }
    assert!(
        browser
            .text("#charts .note")
            .await
            .contains("Outbox webhooks")
    );
    let busiest = browser.text("#busiest tbody").await;
    assert!(busiest.contains(&steady), "{busiest}");
    assert!(
        !busiest.contains(&broken),
        "nothing delivered to it: {busiest}"
    );
    assert_eq!(browser.text("#busiest td.count").await, "3");
    assert!(browser.text("#failing td.name").await.contains(&broken));
    assert_eq!(browser.text("#failing td.count").await, "6");
    assert_eq!(
        attribute(&browser, "#failing svg", "aria-label").await,
        format!("{broken}: 6")
    );
    screenshot(&browser, "admin-charts.png").await;

    // The failing callback's own page: its state now and its history.
    browser.click("#failing td.name a").await;
    assert_eq!(browser.path().await, "/admin/endpoints");
    assert!(browser.text("#endpoint-state h2").await.contains(&broken));
    let now = browser.text("#state-now").await;
    assert!(now == "failing" || now == "disabled", "{now}");
    assert!(browser.text("#endpoint-state").await.contains("500"));
    let changes = browser.text("#endpoint-changes").await;
    assert!(changes.contains(&broken), "{changes}");
    assert!(changes.contains("failing"), "{changes}");
    screenshot(&browser, "admin-endpoint.png").await;

    // A light live view: the overview reloads itself when asked to.
    browser.goto(&format!("{}admin", hub.url)).await;
    assert_eq!(
        count(&browser, "meta[http-equiv=refresh]").await,
        0,
        "off by default"
    );
    browser.click("#refresh a").await;
    browser.wait_for_query("refresh=10").await;
    assert_eq!(
        attribute(&browser, "meta[http-equiv=refresh]", "content").await,
        "10"
    );
    assert!(
        browser
            .text("#refresh")
            .await
            .contains("Reloading every 10 s")
    );
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifications_and_paged_searched_lists_in_the_browser() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = scratch_dir("admin-pages");
    let subscriber = TestSubscriber::start().await;
    let names: Vec<String> = (0..150).map(|i| format!("number-{i}")).collect();
    let callbacks: Vec<String> = names.iter().map(|name| subscriber.callback(name)).collect();
    subscribe(&dir, &callbacks).await;
    subscriber.answer_verification("refuser", Answer::status(404));
    subscriber.answer_verification("busy", Answer::status(503));
    let hub = start_hub(&dir, &["--internal-api-key", INTERNAL_KEY]).await;
    let other_topic = "https://publisher.example/other";
    let refuser = subscriber.callback("refuser");
    let busy = subscriber.callback("busy");
    assert_eq!(hub.subscribe(other_topic, &refuser).await, 202);
    assert_eq!(hub.subscribe(other_topic, &busy).await, 202);
    assert_eq!(hub.fat_ping(TOPIC, "{\"paged\":true}").await, 202);
    assert!(
        subscriber
            .wait_until(Duration::from_secs(30), |subscriber| {
                subscriber.deliveries().len() >= 150 && subscriber.verifications().len() >= 2
            })
            .await,
        "the event reached every subscriber and both verifications were tried"
    );

    log_in_browser(&browser, &hub).await;
    // The refused verification failed for good; the other waits for its
    // retry.
    browser
        .goto(&format!("{}admin/verifications", hub.url))
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let failed = browser.text("#verifications").await;
        if failed.contains(&refuser) && failed.contains("failed") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{failed}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        browser.client.refresh().await.expect("reload");
    }
    browser
        .click("a[href='/admin/verifications?state=failed']")
        .await;
    let failed = browser.text("#verifications").await;
    assert!(
        failed.contains(&refuser) && failed.contains("404"),
        "{failed}"
    );
    assert!(!failed.contains(&busy), "{failed}");
    browser
        .click("a[href='/admin/verifications?state=waiting']")
        .await;
    let waiting = browser.text("#verifications tr.verification").await;
    assert!(
        waiting.contains(&busy) && waiting.contains("waiting"),
        "{waiting}"
    );
    // Searched by callback.
    browser
        .goto(&format!("{}admin/verifications", hub.url))
        .await;
    browser.type_into("#search", "/cb/refuser").await;
    browser
        .click("form[action='/admin/verifications'] button")
        .await;
    browser.wait_for_query("search=").await;
    assert_eq!(count(&browser, "#verifications tr.verification").await, 1);
    browser.click("nav a[href='/admin/fetches']").await;
    assert!(browser.source().await.contains("No fetch matches."));
    browser.click("nav a[href='/admin/feeds']").await;
    assert_eq!(browser.path().await, "/admin/feeds");
    assert_eq!(browser.text("#feeds p").await, "No outbox feeds.");

    // 150 subscriptions: a page of 100, then the other 50.
    browser.click("nav a[href='/admin/subscriptions']").await;
    assert_eq!(count(&browser, "tr.subscription").await, 100);
    assert_eq!(count(&browser, "nav.pages a.previous").await, 0);
    browser.click("nav.pages a.next").await;
    browser.wait_for_query("page=2").await;
    assert_eq!(count(&browser, "tr.subscription").await, 50);
    assert_eq!(browser.text("nav.pages .page").await, "Page 2");
    assert_eq!(count(&browser, "nav.pages a.next").await, 0);
    browser.click("nav.pages a.previous").await;
    browser.wait_for_query("page=1").await;
    assert_eq!(count(&browser, "tr.subscription").await, 100);

    // A search by callback narrows the list, to one page.
    browser.type_into("#callback", "/cb/number-7").await;
    browser
        .click("form[action='/admin/subscriptions'] button")
        .await;
    browser.wait_for_query("callback=").await;
    let matching = names
        .iter()
        .filter(|name| name.starts_with("number-7"))
        .count();
    assert_eq!(count(&browser, "tr.subscription").await, matching);
    assert_eq!(count(&browser, "nav.pages").await, 0, "one page");

    // The event's 150 delivery records: two pages, and one subscriber's.
    browser
        .goto(&format!("{}admin/deliveries?state=delivered", hub.url))
        .await;
    assert_eq!(browser.reload_until("#count", "100").await, "100");
    browser.click("nav.pages a.next").await;
    browser.wait_for_query("page=2").await;
    assert_eq!(browser.text("#count").await, "50");
    browser.type_into("#subscriber", &callbacks[42]).await;
    browser
        .click("form[action='/admin/deliveries'] button")
        .await;
    browser.wait_for_query("subscriber=").await;
    assert_eq!(browser.text("#count").await, "1");
    assert!(browser.text("#records").await.contains(&callbacks[42]));
    browser.close().await;

    // Bad paging and search input: a 400 that says why.
    let cookie = cookie_set_by(&log_in(&hub, INTERNAL_KEY).await);
    let long = "x".repeat(600);
    for (page, reason) in [
        ("admin/subscriptions?page=two", "page must be a number"),
        ("admin/deliveries?page=0", "page must be a number"),
        ("admin/failed?page=101", "page must be a number"),
        ("admin/topics?page=-1", "page must be a number"),
        ("admin/endpoints?page=1.5", "page must be a number"),
        ("admin/denials?page=x", "page must be a number"),
        ("admin/verifications?page=", ""),
        (
            "admin/fetches?state=stuck",
            "state must be waiting or failed",
        ),
        ("admin/deliveries?event_id=nope", "is not a UUID"),
        (
            "admin?refresh=1",
            "refresh must be a number of seconds from 5 to 300",
        ),
        ("admin?refresh=ten", "refresh must be a number of seconds"),
    ] {
        let answer = client()
            .get(format!("{}{page}", hub.url))
            .header(header::COOKIE, &cookie)
            .send()
            .await
            .expect("GET a page");
        if reason.is_empty() {
            assert_eq!(answer.status(), 200, "{page}: a blank page is the first");
            continue;
        }
        assert_eq!(answer.status(), 400, "{page}");
        let text = answer.text().await.expect("a reason");
        assert!(text.contains(reason), "{page}: {text}");
    }
    for page in [
        format!("admin/subscriptions?callback={long}"),
        format!("admin/verifications?search={long}"),
        format!("admin/topics?topic={long}"),
    ] {
        let answer = client()
            .get(format!("{}{page}", hub.url))
            .header(header::COOKIE, &cookie)
            .send()
            .await
            .expect("GET a page");
        assert_eq!(answer.status(), 400, "an over-long search");
        let text = answer.text().await.expect("a reason");
        assert!(text.contains("is longer than 512 bytes"), "{text}");
    }
}
