//! Bridges a 2026-07-28 client and an initialize-era upstream. Such an upstream asks the client
//! things during a call with server-to-client requests (sampling, elicitation, roots), which a
//! 2026-07-28 session cannot receive. The proxy parks the upstream call, hands the question to the
//! client as an `input_required` result, and when the client retries with the answer, delivers it
//! to the waiting upstream and carries on with the same call.

// Sampling and roots are deprecated by SEP-2577 but still asked by initialize-era servers.
#![allow(deprecated)]

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use rmcp::model::{
    ClientResult, CreateMessageResult, ElicitResult, InputRequest, InputRequests,
    InputRequiredResult, InputResponses, ListRootsResult, ServerRequest, ServerResult,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::{error::Error, sync::lock, upstream::routes::Ask};

/// `requestState` values minted by the proxy start with this; anything else belongs to the
/// upstream and is passed through.
pub const STATE_PREFIX: &str = "orchestrator-proxy/";
/// The key of the single input request in each round.
const INPUT_KEY: &str = "proxy-input";

/// The upstream side of a bridged call: its final result, and its questions.
pub struct Pending {
    pub done: oneshot::Receiver<Result<ServerResult, Error>>,
    pub asks: mpsc::UnboundedReceiver<Ask>,
}

#[derive(Clone, Copy)]
enum Kind {
    Sampling,
    Elicitation,
    Roots,
}

struct Parked {
    pending: Pending,
    answer: oneshot::Sender<Result<ClientResult, Error>>,
    kind: Kind,
    since: Instant,
}

/// What a bridged call turned into for this client request.
pub enum Step {
    Done(Box<Result<ServerResult, Error>>),
    Asked(InputRequiredResult),
}

#[derive(Default)]
pub struct Bridge {
    parked: Mutex<HashMap<String, Parked>>,
    next: AtomicU64,
}

impl Bridge {
    /// Waits until the upstream call finishes or asks the client something; a question parks the
    /// call and comes back as an `input_required` result.
    pub async fn wait(&self, mut pending: Pending, ct: &CancellationToken, keep: Duration) -> Step {
        loop {
            tokio::select! {
                done = &mut pending.done => {
                    return Step::Done(Box::new(done.unwrap_or_else(|_| Err(Error::Other("the upstream call ended without a result".into())))));
                }
                Some(ask) = pending.asks.recv() => {
                    let (kind, input) = match ask.request {
                        ServerRequest::CreateMessageRequest(r) => (Kind::Sampling, InputRequest::CreateMessage(r)),
                        ServerRequest::ElicitRequest(r) => (Kind::Elicitation, InputRequest::Elicitation(r)),
                        ServerRequest::ListRootsRequest(r) => (Kind::Roots, InputRequest::ListRoots(r)),
                        _ => {
                            let _ = ask.answer.send(Err(Error::NotRelayable(
                                "this request cannot be relayed to a 2026-07-28 client".into(),
                            )));
                            continue;
                        }
                    };
                    let token = format!("{STATE_PREFIX}{}-{}", std::process::id(), self.next.fetch_add(1, Ordering::Relaxed));
                    let mut parked = lock(&self.parked);
                    // Calls whose client never came back are dropped (their upstream sees an error).
                    parked.retain(|_, p| p.since.elapsed() < keep);
                    parked.insert(token.clone(), Parked { pending, answer: ask.answer, kind, since: Instant::now() });
                    return Step::Asked(InputRequiredResult::new(
                        Some(InputRequests::from([(INPUT_KEY.to_string(), input)])),
                        Some(token),
                    ));
                }
                () = ct.cancelled() => return Step::Done(Box::new(Err(Error::Cancelled("the client")))),
            }
        }
    }

    /// Delivers the client's answer to the parked call named by `state`; returns the call to wait
    /// on again. `None` when `state` is not one of ours (or expired).
    pub fn resume(&self, state: &str, responses: Option<&InputResponses>) -> Option<Pending> {
        let parked = lock(&self.parked).remove(state)?;
        let answer = match responses.and_then(|r| r.get(INPUT_KEY)) {
            None => Err(Error::InvalidParams(
                "the client did not answer the server's request".into(),
            )),
            Some(value) => parse_answer(parked.kind, value.clone()),
        };
        let _ = parked.answer.send(answer);
        Some(parked.pending)
    }
}

fn parse_answer(kind: Kind, value: serde_json::Value) -> Result<ClientResult, Error> {
    let bad = |e: serde_json::Error| {
        Error::InvalidParams(format!("the client's answer does not parse: {e}"))
    };
    Ok(match kind {
        Kind::Sampling => ClientResult::CreateMessageResult(Box::new(
            serde_json::from_value::<CreateMessageResult>(value).map_err(bad)?,
        )),
        Kind::Elicitation => {
            ClientResult::ElicitResult(serde_json::from_value::<ElicitResult>(value).map_err(bad)?)
        }
        Kind::Roots => ClientResult::ListRootsResult(
            serde_json::from_value::<ListRootsResult>(value).map_err(bad)?,
        ),
    })
}
