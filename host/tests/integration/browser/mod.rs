//! A real headless Chromium for the dashboard tests, driven over WebDriver: `chromedriver` on a
//! free loopback port, talked to by fantoccini over plain HTTP. The binaries come from
//! `CHROMIUM` and `CHROMEDRIVER`, else from `PATH` (`cargo xtask test` installs Debian's
//! `chromium` and `chromium-driver` when they are missing). A browser that cannot be started
//! fails the test: it is never skipped.
//!
//! Chromium runs with `--headless=new --no-sandbox --disable-gpu` (the tests run as root) and a
//! profile in a temporary directory. The driver and the browser it starts share a process
//! group, killed when the [`Browser`] is dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::common::{program, root, target_dir};
use crate::natsd::free_port;

/// How long a wait for the page may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(30);

/// A headless Chromium and its driver.
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a Chromium session with a `width`×`height` window.
    pub async fn start(width: u32, height: u32) -> Browser {
        let installs = "Debian's chromium and chromium-driver";
        let chromium = program(
            "CHROMIUM",
            &["chromium", "chromium-browser", "google-chrome"],
            installs,
        );
        let chromedriver = program("CHROMEDRIVER", &["chromedriver"], installs);
        let port = free_port();
        let log =
            std::fs::File::create(std::env::temp_dir().join(format!("chromedriver-{port}.log")))
                .unwrap();
        let mut command = Command::new(&chromedriver);
        command
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let driver = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let profile = tempfile::tempdir().unwrap();
        let mut browser = DriverGuard(Some(driver));
        let url = format!("http://127.0.0.1:{port}");
        wait_driver_ready(&url, browser.child()).await;
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        // Leave a dialog open for the test to find, rather than dismissing it.
        caps.insert("unhandledPromptBehavior".into(), json!("ignore"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--hide-scrollbars",
                    format!("--user-data-dir={}", profile.path().display()),
                    format!("--window-size={width},{height}"),
                ],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} through {}: {e}",
                    chromium.display(),
                    chromedriver.display()
                )
            });
        Browser {
            client,
            driver: browser.take(),
            _profile: profile,
        }
    }

    /// Opens `url` and waits for the page.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// The path (and query) of the current page.
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.unwrap();
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// The text of the first element `css` matches, if any.
    pub async fn text(&self, css: &str) -> Option<String> {
        match self.client.find(Locator::Css(css)).await {
            Ok(e) => e.text().await.ok(),
            Err(_) => None,
        }
    }

    /// How many elements `css` matches.
    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .map_or(0, |all| all.len())
    }

    /// Clicks the element `css` matches.
    pub async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
            .click()
            .await
            .unwrap();
    }

    /// Types `text` into the element `css` matches.
    pub async fn type_into(&self, css: &str, text: &str) {
        let e = match self.client.find(Locator::Css(css)).await {
            Ok(e) => e,
            Err(e) => panic!(
                "no {css} at {}: {e}\n{}",
                self.path().await,
                self.excerpt().await
            ),
        };
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    /// Runs `script` in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.client.execute(script, Vec::new()).await.unwrap()
    }

    /// Waits until the text of `css` satisfies `ok`, failing with `what` after [`WAIT`].
    pub async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = self.text(css).await;
            if let Some(text) = &text
                && ok(text)
            {
                return text.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: `{css}` reads {text:?} after {WAIT:?} at {}",
                self.path().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The start of the page's text, for a failure's message.
    async fn excerpt(&self) -> String {
        let text = self.text("body").await.unwrap_or_default();
        text.chars().take(400).collect()
    }

    /// Waits until the current path (with its query) holds `needle`.
    pub async fn wait_path_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let path = self.path().await;
            if path.contains(needle) {
                return path;
            }
            if Instant::now() >= deadline {
                panic!(
                    "still at {path}, waiting for a path with {needle}:\n{}",
                    self.excerpt().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the current path starts with `prefix`.
    pub async fn wait_path(&self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let path = self.path().await;
            if path.starts_with(prefix) {
                return path;
            }
            if Instant::now() >= deadline {
                panic!(
                    "still at {path}, waiting for {prefix}:\n{}",
                    self.excerpt().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Logs in at `base` with `token` and waits to land on `/`.
    pub async fn login(&self, base: &str, token: &str) {
        self.goto(&format!("{base}/login")).await;
        self.type_into("#token", token).await;
        self.click("form[action='/login'] button[type=submit]")
            .await;
        // Every path starts with `/`, so the login page itself would pass a `wait_path("/")`:
        // wait for what only a session's page has, the logout form.
        let deadline = Instant::now() + WAIT;
        while self.count("form[action='/logout']").await != 1 {
            assert!(
                Instant::now() < deadline,
                "not logged in: still at {}:\n{}",
                self.path().await,
                self.excerpt().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(self.path().await, "/", "a login lands on the overview");
    }

    /// Saves a screenshot of the page as `<target>/dashboard-screenshots/NAME.png`, and as
    /// `docs/dashboard/NAME.png` too when `HOMING_DASHBOARD_DOCS` is set.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        let dir = target_dir().join("dashboard-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
        if std::env::var_os("HOMING_DASHBOARD_DOCS").is_some() {
            let docs = root().join("docs").join("dashboard");
            std::fs::create_dir_all(&docs).unwrap();
            std::fs::write(docs.join(format!("{name}.png")), &png).unwrap();
        }
    }

    /// Ends the session (closing Chromium), then the driver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.driver);
    }
}

/// Kills the driver's process group (the driver and the browser it started) and reaps it.
fn kill_group(child: &mut Child) {
    if child.try_wait().ok().flatten().is_none() {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Kills the driver if the browser never came up.
struct DriverGuard(Option<Child>);

impl DriverGuard {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    fn take(&mut self) -> Child {
        self.0.take().unwrap()
    }
}

impl Drop for DriverGuard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            kill_group(child);
        }
    }
}

/// Waits until the driver answers `/status` with `ready`, failing if it exits or takes long.
async fn wait_driver_ready(url: &str, driver: &mut Child) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = driver.try_wait().unwrap() {
            panic!("chromedriver exited at start: {status}");
        }
        if let Ok(r) = client.get(format!("{url}/status")).send().await
            && let Ok(body) = r.json::<Value>().await
            && body["value"]["ready"] == true
        {
            return;
        }
        assert!(Instant::now() < deadline, "chromedriver did not get ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
