//! What the task has used and what requests in flight may still use: a request is admitted only
//! when its worst case fits under every limit beside what is used and reserved, and its
//! reservation is settled to what its response says it used.

use std::sync::{Arc, Mutex};

use crate::{
    config::{Limits, PriceNanos},
    sync::lock,
};

/// Token counts of one response (or of the task so far).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tokens {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

impl Tokens {
    /// Every input token, cached ones included (what `budget.inputTokens` counts).
    pub fn input_total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_creation_input_tokens)
            .saturating_add(self.cache_read_input_tokens)
    }

    fn add(&mut self, other: &Tokens) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_creation_input_tokens = self
            .cache_creation_input_tokens
            .saturating_add(other.cache_creation_input_tokens);
        self.cache_read_input_tokens = self
            .cache_read_input_tokens
            .saturating_add(other.cache_read_input_tokens);
    }
}

/// What `tokens` cost at `price`, in nano-dollars.
pub fn cost(tokens: &Tokens, price: PriceNanos) -> u64 {
    let sum = u128::from(tokens.input_tokens) * u128::from(price.input)
        + u128::from(tokens.cache_creation_input_tokens) * u128::from(price.cache_write)
        + u128::from(tokens.cache_read_input_tokens) * u128::from(price.cache_read)
        + u128::from(tokens.output_tokens) * u128::from(price.output);
    u64::try_from(sum.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// What a request asks to use at most: its input tokens, the output it asks for, what its
/// input costs at most and the output's price (nano-dollars per million tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ask {
    pub input: u64,
    pub output: u64,
    pub input_cost: u64,
    pub output_price: u64,
}

/// What one request may use at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amount {
    pub input: u64,
    pub output: u64,
    pub cost_nanos: u64,
}

/// The task's usage so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub tokens: Tokens,
    pub cost_nanos: u64,
    /// Model requests forwarded (refused ones are not).
    pub requests: u64,
    /// Requests refused by the budget.
    pub refused: u64,
    /// The limit the last request was refused on, until one is admitted again.
    pub exceeded: Option<&'static str>,
    /// When the task's gateway started counting (its first proxy's start): the wall time
    /// counts from it.
    pub started: jiff::Timestamp,
}

impl Default for Usage {
    fn default() -> Self {
        Self {
            tokens: Tokens::default(),
            cost_nanos: 0,
            requests: 0,
            refused: 0,
            exceeded: None,
            started: jiff::Timestamp::now(),
        }
    }
}

impl Usage {
    /// As the Lease annotation and `status.usage` carry it.
    pub fn to_wire(&self) -> orchestrator_crds::gateway::ModelUsage {
        orchestrator_crds::gateway::ModelUsage {
            input_tokens: self.tokens.input_tokens,
            output_tokens: self.tokens.output_tokens,
            cache_creation_input_tokens: self.tokens.cache_creation_input_tokens,
            cache_read_input_tokens: self.tokens.cache_read_input_tokens,
            cost_usd: (self.cost_nanos > 0)
                .then(|| orchestrator_crds::gateway::format_usd_nanos(self.cost_nanos)),
            requests: self.requests,
            refused: self.refused,
            exceeded: self.exceeded.map(str::to_string),
            started_at: Some(self.started.to_string()),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    used: Usage,
    reserved: Amount,
    reserved_requests: u64,
}

#[derive(Debug, Default)]
pub struct Ledger {
    state: Mutex<State>,
}

/// Which limit a request would pass, and by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// `inputTokens`, `outputTokens`, `costUsd`, `requests` or `wallTimeSeconds`: the field of
    /// `budget`.
    pub limit: &'static str,
    pub used: u64,
    pub reserved: u64,
    pub wanted: u64,
    pub allowed: u64,
}

/// A request's admission: settle it with what it used (dropped unsettled, it is charged its
/// worst case: a response whose usage was never seen may have used all of it).
#[derive(Debug)]
pub struct Reservation {
    ledger: Arc<Ledger>,
    amount: Amount,
    settled: bool,
}

impl Ledger {
    pub fn usage(&self) -> Usage {
        lock(&self.state).used
    }

    /// Takes up what an earlier proxy of the task counted (its report on the task's Lease), so
    /// a restarted proxy does not start the budget again; each count only grows.
    pub fn restore(&self, wire: &orchestrator_crds::gateway::ModelUsage) {
        let mut state = lock(&self.state);
        let used = &mut state.used;
        let t = &mut used.tokens;
        t.input_tokens = t.input_tokens.max(wire.input_tokens);
        t.output_tokens = t.output_tokens.max(wire.output_tokens);
        t.cache_creation_input_tokens = t
            .cache_creation_input_tokens
            .max(wire.cache_creation_input_tokens);
        t.cache_read_input_tokens = t.cache_read_input_tokens.max(wire.cache_read_input_tokens);
        let cost = wire
            .cost_usd
            .as_deref()
            .and_then(orchestrator_crds::gateway::parse_usd_nanos)
            .unwrap_or(0);
        used.cost_nanos = used.cost_nanos.max(cost);
        used.requests = used.requests.max(wire.requests);
        used.refused = used.refused.max(wire.refused);
        if let Some(earlier) = wire
            .started_at
            .as_deref()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        {
            used.started = used.started.min(earlier);
        }
    }

    /// Seconds since the gateway started counting, at `now`.
    pub fn elapsed_seconds(&self, now: jiff::Timestamp) -> u64 {
        let started = lock(&self.state).used.started;
        u64::try_from(now.as_second().saturating_sub(started.as_second())).unwrap_or(0)
    }

    /// Admits a request under `limits`, reserving its worst case: `ask.input` input tokens and
    /// the output it asks for, clamped to the output (and cost) left, which the caller then
    /// asks the endpoint for instead ([`Reservation::output`]). Refused when nothing is left
    /// of a limit.
    pub fn admit(self: &Arc<Self>, limits: &Limits, ask: Ask) -> Result<Reservation, Exceeded> {
        self.admit_at(limits, ask, jiff::Timestamp::now())
    }

    /// [`Ledger::admit`] at `now` (the wall time's clock).
    pub fn admit_at(
        self: &Arc<Self>,
        limits: &Limits,
        ask: Ask,
        now: jiff::Timestamp,
    ) -> Result<Reservation, Exceeded> {
        let elapsed = self.elapsed_seconds(now);
        let mut state = lock(&self.state);
        let exceeded = |state: &mut State, limit, used, reserved, wanted, allowed| {
            state.used.refused += 1;
            state.used.exceeded = Some(limit);
            Err(Exceeded {
                limit,
                used,
                reserved,
                wanted,
                allowed,
            })
        };
        let (used, reserved) = (state.used, state.reserved);
        if let Some(allowed) = limits.wall_time_seconds
            && elapsed >= allowed
        {
            return exceeded(&mut state, "wallTimeSeconds", elapsed, 0, 0, allowed);
        }
        if let Some(allowed) = limits.requests
            && used.requests + state.reserved_requests >= allowed
        {
            let reserved = state.reserved_requests;
            return exceeded(&mut state, "requests", used.requests, reserved, 1, allowed);
        }
        let input_used = used.tokens.input_total();
        if let Some(allowed) = limits.input_tokens
            && input_used + reserved.input + ask.input > allowed
        {
            return exceeded(
                &mut state,
                "inputTokens",
                input_used,
                reserved.input,
                ask.input,
                allowed,
            );
        }
        let mut output = ask.output;
        if let Some(allowed) = limits.output_tokens {
            let room = allowed.saturating_sub(used.tokens.output_tokens + reserved.output);
            if room == 0 {
                let (u, r) = (used.tokens.output_tokens, reserved.output);
                return exceeded(&mut state, "outputTokens", u, r, ask.output.max(1), allowed);
            }
            output = output.min(room);
        }
        let cost_of = |output: u64| {
            let out = u128::from(output) * u128::from(ask.output_price);
            ask.input_cost
                .saturating_add(u64::try_from(out.div_ceil(1_000_000)).unwrap_or(u64::MAX))
        };
        if let Some(allowed) = limits.cost_nanos {
            let room = allowed.saturating_sub(used.cost_nanos + reserved.cost_nanos);
            // The output that fits what is left, when the input's cost does.
            let fits = match room.checked_sub(ask.input_cost) {
                Some(_) if ask.output_price == 0 => output,
                Some(left) => {
                    let most = u128::from(left) * 1_000_000 / u128::from(ask.output_price);
                    output.min(u64::try_from(most).unwrap_or(u64::MAX))
                }
                None => 0,
            };
            if fits == 0 && (ask.output > 0 || room < ask.input_cost) {
                let (u, r) = (used.cost_nanos, reserved.cost_nanos);
                return exceeded(&mut state, "costUsd", u, r, cost_of(output), allowed);
            }
            output = fits;
        }
        let amount = Amount {
            input: ask.input,
            output,
            cost_nanos: cost_of(output),
        };
        state.reserved.input += amount.input;
        state.reserved.output += amount.output;
        state.reserved.cost_nanos += amount.cost_nanos;
        state.reserved_requests += 1;
        state.used.exceeded = None;
        Ok(Reservation {
            ledger: self.clone(),
            amount,
            settled: false,
        })
    }

    fn release(&self, reserved: &Amount, used: Option<(&Tokens, u64)>) {
        let mut state = lock(&self.state);
        state.reserved.input -= reserved.input;
        state.reserved.output -= reserved.output;
        state.reserved.cost_nanos -= reserved.cost_nanos;
        state.reserved_requests -= 1;
        state.used.requests += 1;
        match used {
            Some((tokens, cost)) => {
                state.used.tokens.add(tokens);
                state.used.cost_nanos = state.used.cost_nanos.saturating_add(cost);
            }
            None => {
                state.used.tokens.input_tokens += reserved.input;
                state.used.tokens.output_tokens += reserved.output;
                state.used.cost_nanos = state.used.cost_nanos.saturating_add(reserved.cost_nanos);
            }
        }
    }
}

impl Reservation {
    /// The output tokens reserved: what the request may ask the endpoint for.
    pub fn output(&self) -> u64 {
        self.amount.output
    }

    /// Settles to what the response said it used and what that cost.
    pub fn settle(mut self, tokens: &Tokens, cost_nanos: u64) {
        self.settled = true;
        self.ledger
            .release(&self.amount, Some((tokens, cost_nanos)));
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            self.ledger.release(&self.amount, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amount(input: u64, output: u64) -> Ask {
        Ask {
            input,
            output,
            ..Ask::default()
        }
    }

    #[test]
    fn parallel_requests_share_what_is_left_and_never_pass_a_limit() {
        let ledger = Arc::new(Ledger::default());
        let limits = Limits {
            output_tokens: Some(1000),
            ..Limits::default()
        };
        let admitted: Vec<_> = (0..10)
            .filter_map(|_| ledger.admit(&limits, amount(10, 300)).ok())
            .collect();
        let granted: Vec<u64> = admitted.iter().map(Reservation::output).collect();
        assert_eq!(granted, [300, 300, 300, 100], "the 4th gets what is left");
        let refused = ledger.admit(&limits, amount(10, 300)).expect_err("full");
        assert_eq!(
            (refused.limit, refused.reserved, refused.allowed),
            ("outputTokens", 1000, 1000)
        );
        // Each used less than it reserved: room for more.
        for r in admitted {
            r.settle(
                &Tokens {
                    input_tokens: 10,
                    output_tokens: 50,
                    ..Tokens::default()
                },
                0,
            );
        }
        let usage = ledger.usage();
        assert_eq!((usage.tokens.output_tokens, usage.requests), (200, 4));
        assert_eq!(usage.refused, 7);
        assert_eq!(
            ledger.admit(&limits, amount(10, 300)).map(|r| r.output()),
            Ok(300)
        );
    }

    #[test]
    fn a_cost_limit_clamps_the_output_to_what_it_can_pay() {
        let ledger = Arc::new(Ledger::default());
        // $1 left; the input costs at most $0.40, output $10 per million tokens.
        let limits = Limits {
            cost_nanos: Some(1_000_000_000),
            ..Limits::default()
        };
        let ask = Ask {
            input: 1000,
            output: 128_000,
            input_cost: 400_000_000,
            output_price: 10_000_000_000,
        };
        let first = ledger.admit(&limits, ask).expect("admitted");
        assert_eq!(first.output(), 60_000, "$0.60 buys 60k output tokens");
        assert_eq!(
            ledger.admit(&limits, ask).expect_err("spent").limit,
            "costUsd"
        );
    }

    #[test]
    fn an_unsettled_reservation_is_charged_its_worst_case() {
        let ledger = Arc::new(Ledger::default());
        let limits = Limits {
            requests: Some(2),
            ..Limits::default()
        };
        drop(ledger.admit(&limits, amount(100, 200)).expect("first"));
        let usage = ledger.usage();
        assert_eq!(
            (
                usage.tokens.input_tokens,
                usage.tokens.output_tokens,
                usage.requests
            ),
            (100, 200, 1)
        );
        let second = ledger.admit(&limits, amount(1, 1)).expect("second");
        assert_eq!(
            ledger
                .admit(&limits, amount(1, 1))
                .expect_err("third")
                .limit,
            "requests",
            "a reserved request counts"
        );
        second.settle(&Tokens::default(), 0);
        assert!(ledger.admit(&limits, amount(1, 1)).is_err());
        // A raised limit lets the task go on.
        let raised = Limits {
            requests: Some(3),
            ..limits
        };
        assert!(ledger.admit(&raised, amount(1, 1)).is_ok());
    }

    #[test]
    fn a_refusal_is_reported_until_a_request_is_admitted_and_a_restart_keeps_the_counts() {
        let ledger = Arc::new(Ledger::default());
        let limits = Limits {
            requests: Some(1),
            ..Limits::default()
        };
        ledger
            .admit(&limits, amount(1, 1))
            .expect("first")
            .settle(&Tokens::default(), 0);
        assert!(ledger.admit(&limits, amount(1, 1)).is_err());
        let wire = ledger.usage().to_wire();
        assert_eq!(
            (wire.exceeded.as_deref(), wire.refused, wire.requests),
            (Some("requests"), 1, 1)
        );
        // A proxy restarted in the same pod takes the report up: the budget is not new.
        let restarted = Arc::new(Ledger::default());
        restarted.restore(&wire);
        assert!(restarted.admit(&limits, amount(1, 1)).is_err());
        let raised = Limits {
            requests: Some(5),
            ..limits
        };
        assert!(restarted.admit(&raised, amount(1, 1)).is_ok());
        assert_eq!(restarted.usage().exceeded, None);
    }

    #[test]
    fn wall_time_counts_from_the_first_start_and_a_raise_lets_the_task_go_on() {
        let ledger = Arc::new(Ledger::default());
        let start = ledger.usage().started;
        let limits = Limits {
            wall_time_seconds: Some(60),
            ..Limits::default()
        };
        let at = |s: i64| start + jiff::SignedDuration::from_secs(s);
        ledger
            .admit_at(&limits, amount(1, 1), at(59))
            .expect("within the minute")
            .settle(&Tokens::default(), 0);
        let over = ledger
            .admit_at(&limits, amount(1, 1), at(61))
            .expect_err("past the minute");
        assert_eq!(
            (over.limit, over.used, over.allowed),
            ("wallTimeSeconds", 61, 60)
        );
        assert_eq!(ledger.usage().exceeded, Some("wallTimeSeconds"));
        // A proxy restarted later keeps the first start: its minute is not a new one.
        let wire = ledger.usage().to_wire();
        let restarted = Arc::new(Ledger::default());
        restarted.restore(&wire);
        assert_eq!(restarted.usage().started, start);
        assert!(restarted.admit_at(&limits, amount(1, 1), at(61)).is_err());
        let raised = Limits {
            wall_time_seconds: Some(120),
            ..limits
        };
        assert!(restarted.admit_at(&raised, amount(1, 1), at(61)).is_ok());
        // A later start in a report does not move the clock forward.
        let mut later = wire.clone();
        later.started_at = Some(at(30).to_string());
        restarted.restore(&later);
        assert_eq!(restarted.usage().started, start);
    }
}
