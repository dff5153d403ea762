//! Rate limits: a token bucket (GCRA, `governor`) per server and per named tool, kept across
//! config reloads as long as the limit stays the same. A call must fit its tool's bucket, then
//! its server's.

use std::{collections::HashMap, num::NonZeroU32, sync::Mutex, time::Duration};

use governor::{
    DefaultDirectRateLimiter, Quota, RateLimiter,
    clock::{Clock, DefaultClock},
};
use orchestrator_crds::proxy::RateLimit;

use crate::{
    config::{Config, Server},
    names::ServerName,
    sync::lock,
};

/// A call a limit refused.
#[derive(Clone, Debug, PartialEq)]
pub struct Limited {
    /// The limit's place in the config, e.g. `servers[fs].rateLimit.tools["write_file"]`.
    pub path: String,
    pub limit: RateLimit,
    /// When the next call can fit.
    pub retry_after: Duration,
}

type Key = (ServerName, Option<String>);

struct Bucket {
    limit: RateLimit,
    limiter: DefaultDirectRateLimiter,
}

/// The buckets of every limit in force.
#[derive(Default)]
pub struct Limiters {
    buckets: Mutex<HashMap<Key, Bucket>>,
    clock: DefaultClock,
}

impl Limiters {
    /// Takes a token for a call of `tool` on `server`, or says which limit refused it.
    pub fn check(&self, server: &Server, tool: &str) -> Result<(), Limited> {
        let limits = &server.rate_limit;
        if limits.tools.is_empty() && limits.per_minute.is_none() {
            return Ok(());
        }
        let mut buckets = lock(&self.buckets);
        if let Some(limit) = limits.tools.get(tool) {
            let key = (server.name.clone(), Some(tool.to_string()));
            let path = || format!("servers[{}].rateLimit.tools[{tool:?}]", server.name);
            self.take(&mut buckets, key, *limit, path)?;
        }
        if let Some(limit) = limits.server() {
            let key = (server.name.clone(), None);
            let path = || format!("servers[{}].rateLimit", server.name);
            self.take(&mut buckets, key, limit, path)?;
        }
        Ok(())
    }

    fn take(
        &self,
        buckets: &mut HashMap<Key, Bucket>,
        key: Key,
        limit: RateLimit,
        path: impl FnOnce() -> String,
    ) -> Result<(), Limited> {
        let bucket = buckets
            .entry(key)
            .and_modify(|b| {
                if b.limit != limit {
                    *b = Bucket::new(limit);
                }
            })
            .or_insert_with(|| Bucket::new(limit));
        bucket.limiter.check().map_err(|not_until| Limited {
            path: path(),
            limit,
            retry_after: not_until.wait_time_from(self.clock.now()),
        })
    }

    /// Forgets the buckets of limits `config` no longer has.
    pub fn retain(&self, config: &Config) {
        lock(&self.buckets).retain(|(server, tool), bucket| {
            config.server(server.as_str()).is_some_and(|s| {
                let limit = match tool {
                    Some(tool) => s.rate_limit.tools.get(tool).copied(),
                    None => s.rate_limit.server(),
                };
                limit == Some(bucket.limit)
            })
        });
    }
}

impl Bucket {
    fn new(limit: RateLimit) -> Self {
        // Load-time validation refuses zeros; were one to slip through, allow one.
        let per_minute = NonZeroU32::new(limit.per_minute).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(limit.burst()).unwrap_or(NonZeroU32::MIN);
        Self {
            limit,
            limiter: RateLimiter::direct(Quota::per_minute(per_minute).allow_burst(burst)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::valid as config;

    #[test]
    fn a_call_must_fit_its_tools_bucket_and_its_servers() {
        let c = config(
            r#"
task: {name: t}
servers:
  - name: fs
    stdio: {command: x}
    rateLimit: {perMinute: 1, burst: 3, tools: {write: {perMinute: 1, burst: 1}}}
"#,
        );
        let fs = &c.servers[0];
        let limiters = Limiters::default();
        assert_eq!(limiters.check(fs, "write"), Ok(()));
        let refused = limiters
            .check(fs, "write")
            .expect_err("the tool's burst is 1");
        assert_eq!(refused.path, "servers[fs].rateLimit.tools[\"write\"]");
        assert!(
            refused.retry_after > Duration::from_secs(50)
                && refused.retry_after <= Duration::from_secs(60),
            "{:?}",
            refused.retry_after
        );
        assert_eq!(limiters.check(fs, "read"), Ok(()));
        // The server's burst of 3 is spent: write (1) + read (1) + this one.
        assert_eq!(limiters.check(fs, "read"), Ok(()));
        let refused = limiters
            .check(fs, "read")
            .expect_err("the server's burst is 3");
        assert_eq!(refused.path, "servers[fs].rateLimit");

        // The same limits after a reload keep their state; a changed one starts afresh.
        let same = config(
            r#"
task: {name: t}
servers:
  - name: fs
    stdio: {command: x}
    rateLimit: {perMinute: 1, burst: 3, tools: {write: {perMinute: 1, burst: 2}}}
"#,
        );
        limiters.retain(&same);
        let fs = &same.servers[0];
        assert_eq!(
            limiters.check(fs, "read").map_err(|l| l.path),
            Err("servers[fs].rateLimit".to_string())
        );
        assert_eq!(
            lock(&limiters.buckets).len(),
            1,
            "the tool's old bucket is gone"
        );
    }
}
