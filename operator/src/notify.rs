//! The approval webhook (docs/design/operating.md, section 6): once per approval id the operator
//! first lists as pending, a POST to `--approval-webhook-url` in the format of
//! `--approval-webhook-format` (bodies in [`body`]).
//!
//! Off the reconcile path: [`Notifier::notify`] only puts the notice on a bounded queue (full:
//! it is dropped and counted) and one task delivers them in order, each with a 5 s timeout and
//! up to 3 tries with backoff on connect errors, timeouts, 5xx and 429. Each try is counted in
//! `approval_notifications_total{format,outcome}` (`ok`, `http_<status>`, `timeout`, `error`;
//! `dropped` for a notice the full queue refused). A bounded set of the ids already notified
//! makes a storm of reconciles (a cache that lags behind the status write) send once: at least
//! once per operator process, since a restart forgets it.
//!
//! The URL is a secret (a Slack webhook's path is its key): never logged, nor is a client error
//! that would print it; logs name the host only. Redirects are not followed.

pub mod body;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use reqwest::Url;
use reqwest::header::CONTENT_TYPE;
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::settings::WebhookFormat;

/// A call that started waiting for approval: what a notification says of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub namespace: String,
    pub task_run: String,
    pub task_id: i64,
    pub approval_id: String,
    pub server: String,
    pub tool: String,
    pub digest: String,
    /// RFC 3339, from the proxy.
    pub requested_at: String,
    /// RFC 3339, from the proxy.
    pub expires_at: String,
}

/// How deliveries go; [`Options::default`] is what the operator uses.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// For one try, the whole request.
    pub timeout: Duration,
    /// Tries per notice (the first included).
    pub tries: u32,
    /// The wait before the second try; doubled before each next one.
    pub backoff: Duration,
    /// Notices waiting for delivery; more are dropped.
    pub queue: usize,
    /// Approval ids remembered as notified (the oldest forgotten first).
    pub remembered: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            tries: 3,
            backoff: Duration::from_secs(1),
            queue: 256,
            remembered: 4096,
        }
    }
}

/// The handle reconciles use: cheap to clone, never blocks.
#[derive(Clone)]
pub struct Notifier {
    queue: mpsc::Sender<Notice>,
    seen: Arc<Mutex<Seen>>,
    metrics: Arc<Metrics>,
    format: WebhookFormat,
}

impl std::fmt::Debug for Notifier {
    // Never the URL.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// Checks `url` and starts the delivery task (on the current Tokio runtime).
    pub fn start(url: &str, format: WebhookFormat, metrics: Arc<Metrics>) -> Result<Self, String> {
        Self::with_options(url, format, metrics, Options::default())
    }

    /// As [`Notifier::start`], with `options`.
    pub fn with_options(
        url: &str,
        format: WebhookFormat,
        metrics: Arc<Metrics>,
        options: Options,
    ) -> Result<Self, String> {
        let url = parse_url(url)?;
        let client = reqwest::Client::builder()
            .timeout(options.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("approval webhook client: {}", e.without_url()))?;
        let (queue, received) = mpsc::channel(options.queue.max(1));
        let delivery = Delivery {
            client,
            url,
            format,
            metrics: metrics.clone(),
            options,
        };
        tokio::spawn(delivery.run(received));
        Ok(Self {
            queue,
            seen: Arc::new(Mutex::new(Seen::new(options.remembered))),
            metrics,
            format,
        })
    }

    /// Queues one notification for `notice`, unless its approval was notified already. Returns
    /// whether it was queued. Never waits: a full queue drops it (counted `dropped`).
    pub fn notify(&self, notice: Notice) -> bool {
        let key = (
            notice.namespace.clone(),
            notice.task_run.clone(),
            notice.approval_id.clone(),
        );
        if !self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .first(key)
        {
            return false;
        }
        match self.queue.try_send(notice) {
            Ok(()) => true,
            Err(e) => {
                let notice = match e {
                    mpsc::error::TrySendError::Full(n) | mpsc::error::TrySendError::Closed(n) => n,
                };
                tracing::warn!(
                    taskrun = %format!("{}/{}", notice.namespace, notice.task_run),
                    approval = %notice.approval_id,
                    "approval webhook queue full: notification dropped"
                );
                self.metrics
                    .approval_notification(format_label(self.format), "dropped");
                false
            }
        }
    }
}

/// Whether `url` can be the webhook's (absolute http(s) with a host); the error names the flag
/// and the fix, never the URL.
pub fn check_url(url: &str) -> Result<(), String> {
    parse_url(url).map(drop)
}

/// The webhook URL, checked: absolute http(s) with a host. The message never repeats it.
fn parse_url(url: &str) -> Result<Url, String> {
    let fix = "give an absolute http(s) URL, e.g. https://hooks.slack.com/services/...";
    let parsed = Url::parse(url.trim())
        .map_err(|e| format!("--approval-webhook-url (ORCH_APPROVAL_WEBHOOK_URL): {e}; {fix}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!(
            "--approval-webhook-url (ORCH_APPROVAL_WEBHOOK_URL): scheme {:?} or no host; {fix}",
            parsed.scheme()
        ));
    }
    Ok(parsed)
}

/// The `format` label of the metric.
pub fn format_label(format: WebhookFormat) -> &'static str {
    match format {
        WebhookFormat::Slack => "slack",
        WebhookFormat::Cloudevents => "cloudevents",
    }
}

/// The approvals notified, bounded: the oldest are forgotten first.
struct Seen {
    set: HashSet<(String, String, String)>,
    order: VecDeque<(String, String, String)>,
    max: usize,
}

impl Seen {
    fn new(max: usize) -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
            max: max.max(1),
        }
    }

    /// Whether `key` is new (and remembers it).
    fn first(&mut self, key: (String, String, String)) -> bool {
        if self.set.contains(&key) {
            return false;
        }
        if self.order.len() >= self.max
            && let Some(oldest) = self.order.pop_front()
        {
            self.set.remove(&oldest);
        }
        self.order.push_back(key.clone());
        self.set.insert(key);
        true
    }
}

/// The delivery task's state.
struct Delivery {
    client: reqwest::Client,
    url: Url,
    format: WebhookFormat,
    metrics: Arc<Metrics>,
    options: Options,
}

impl Delivery {
    /// Delivers the notices in order until every [`Notifier`] is gone.
    async fn run(self, mut received: mpsc::Receiver<Notice>) {
        tracing::info!(
            host = self.url.host_str().unwrap_or_default(),
            format = format_label(self.format),
            "approval webhook on"
        );
        while let Some(notice) = received.recv().await {
            self.deliver(&notice).await;
        }
    }

    /// Up to `tries` POSTs of one notice; each try counted.
    async fn deliver(&self, notice: &Notice) {
        let (body, content_type) = match self.format {
            WebhookFormat::Slack => (body::slack(notice), "application/json"),
            WebhookFormat::Cloudevents => (
                body::cloudevent(notice, Timestamp::now()),
                body::CLOUDEVENTS_CONTENT_TYPE,
            ),
        };
        let bytes = body.to_string().into_bytes();
        let format = format_label(self.format);
        let mut wait = self.options.backoff;
        for attempt in 1..=self.options.tries.max(1) {
            let sent = self
                .client
                .post(self.url.clone())
                .header(CONTENT_TYPE, content_type)
                .body(bytes.clone())
                .send()
                .await;
            let (outcome, again) = classify(&sent);
            self.metrics.approval_notification(format, &outcome);
            let host = self.url.host_str().unwrap_or_default();
            let approval = notice.approval_id.as_str();
            if outcome == "ok" {
                tracing::info!(host, approval, attempt, "approval webhook delivered");
                return;
            }
            let error = sent.err().map(describe).unwrap_or_default();
            if !again || attempt >= self.options.tries {
                tracing::warn!(host, approval, attempt, %outcome, %error, "approval webhook not delivered");
                return;
            }
            tracing::info!(host, approval, attempt, %outcome, %error, "approval webhook failed; trying again");
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
        }
    }
}

/// A try's outcome label, and whether another try may help (connect errors, timeouts, 5xx, 429).
fn classify(sent: &Result<reqwest::Response, reqwest::Error>) -> (String, bool) {
    match sent {
        Ok(r) if r.status().is_success() => ("ok".into(), false),
        Ok(r) => {
            let s = r.status();
            (
                format!("http_{}", s.as_u16()),
                s.is_server_error() || s.as_u16() == 429,
            )
        }
        Err(e) if e.is_timeout() => ("timeout".into(), true),
        Err(_) => ("error".into(), true),
    }
}

/// A client error with its causes, without the URL reqwest would print (its path is a secret).
pub fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
