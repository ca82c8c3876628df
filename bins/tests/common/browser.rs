//! A real browser for tests: headless Chromium driven through chromedriver
//! (WebDriver) on a free loopback port, with fantoccini as the client.
//! Without Chromium or chromedriver a test fails when `CI` is set and is
//! skipped otherwise, saying why.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

use super::free_port;

/// Where Debian's `chromium` and `chromium-driver` put them; `CHROMIUM`
/// and `CHROMEDRIVER` name others.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// How long a page has to show what a test waits for.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// A chromedriver process and a browser session on it; both end when
/// dropped (after [`Browser::close`] for a clean session end).
pub(crate) struct Browser {
    driver: Child,
    pub(crate) client: Client,
}

fn program(variable: &str, default: &str) -> PathBuf {
    std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

impl Browser {
    /// Starts chromedriver and a headless Chromium; `None` (after saying
    /// why) when they are not installed and `CI` is unset.
    pub(crate) async fn start() -> Option<Self> {
        let chromium = program("CHROMIUM", CHROMIUM);
        let chromedriver = program("CHROMEDRIVER", CHROMEDRIVER);
        for (what, path) in [("Chromium", &chromium), ("chromedriver", &chromedriver)] {
            if !Path::new(path).exists() {
                let reason = format!(
                    "{what} is not at {} (install Debian's chromium and chromium-driver)",
                    path.display()
                );
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI is set, and {reason}; .ci/run installs them"
                );
                eprintln!("skipping the browser test: {reason}");
                return None;
            }
        }
        let port = free_port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("start {}: {error}", chromedriver.display()));
        let url = format!("http://127.0.0.1:{port}");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            serde_json::json!({
                "binary": chromium,
                // Root runs no sandbox; a fixed window gives screenshots one
                // size.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1100"],
            }),
        );
        let deadline = Instant::now() + PATIENCE;
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                // chromedriver takes a moment to listen.
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => panic!("no browser session from chromedriver at {url}: {error}"),
            }
        };
        Some(Self { driver, client })
    }

    /// Opens `url`.
    pub(crate) async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|error| panic!("open {url}: {error}"));
    }

    /// The element `css` selects, waiting for it to appear.
    pub(crate) async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|error| panic!("no {css} on the page: {error}"))
    }

    /// The text of the element `css` selects.
    pub(crate) async fn text(&self, css: &str) -> String {
        self.find(css)
            .await
            .text()
            .await
            .unwrap_or_else(|error| panic!("the text of {css}: {error}"))
    }

    /// Clicks the element `css` selects, and waits (at most a couple of
    /// seconds) for the page it belongs to to go, so that what is read next
    /// is the page the click led to: every click here follows a link or
    /// sends a form.
    pub(crate) async fn click(&self, css: &str) {
        let element = self.find(css).await;
        element
            .clone()
            .click()
            .await
            .unwrap_or_else(|error| panic!("click {css}: {error}"));
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && element.tag_name().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Types `text` into the field `css` selects.
    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        let field = self.find(css).await;
        field
            .clear()
            .await
            .unwrap_or_else(|error| panic!("clear {css}: {error}"));
        field
            .send_keys(text)
            .await
            .unwrap_or_else(|error| panic!("type into {css}: {error}"));
    }

    /// The path of the page shown.
    pub(crate) async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("the current URL")
            .path()
            .to_owned()
    }

    /// Waits, at most [`PATIENCE`], until the page shown has a query
    /// containing `text` (a form sent by GET has landed).
    pub(crate) async fn wait_for_query(&self, text: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let url = self.client.current_url().await.expect("the current URL");
            if url.query().is_some_and(|query| query.contains(text)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{url} has no {text} in its query"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's whole source.
    pub(crate) async fn source(&self) -> String {
        self.client.source().await.expect("the page source")
    }

    /// Reloads the page until the text of `css` is `expected`, at most
    /// [`PATIENCE`]; returns the last text seen.
    pub(crate) async fn reload_until(&self, css: &str, expected: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let text = self.text(css).await;
            if text == expected || Instant::now() >= deadline {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.client.refresh().await.expect("reload the page");
        }
    }

    /// A PNG of the window.
    pub(crate) async fn screenshot(&self) -> Vec<u8> {
        self.client.screenshot().await.expect("a screenshot")
    }

    /// Ends the browser session, then chromedriver.
    pub(crate) async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
