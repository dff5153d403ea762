use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use orchestrator_crds::approval::Decision;
use serde_json::{Value, json};

use super::*;
use crate::{
    approval::{HoldCall, Outcome, lease::entries},
    metrics::Metrics,
};

const DEFINITION: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// A Lease in memory; `interleave` are writes of another replica, each made between one of
/// this replica's reads and its write (so that write conflicts).
#[derive(Default)]
struct Fake {
    state: Mutex<(Option<String>, u64)>,
    interleave: Mutex<Vec<String>>,
    writes: Mutex<usize>,
    conflicts: Mutex<usize>,
}

impl Store for Arc<Fake> {
    fn read(&self) -> BoxFuture<'_, anyhow::Result<(Option<String>, String)>> {
        Box::pin(async move {
            let state = self.state.lock().expect("lock").clone();
            if let Some(other) = self.interleave.lock().expect("lock").pop() {
                *self.state.lock().expect("lock") = (Some(other), state.1 + 1);
            }
            Ok((state.0, state.1.to_string()))
        })
    }

    fn write<'a>(
        &'a self,
        version: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move {
            let mut state = self.state.lock().expect("lock");
            if state.1.to_string() != version {
                *self.conflicts.lock().expect("lock") += 1;
                return Ok(false);
            }
            *state = (Some(value.to_string()), state.1 + 1);
            *self.writes.lock().expect("lock") += 1;
            Ok(true)
        })
    }
}

struct Gone(HashSet<String>);

impl Replicas for Gone {
    fn gone<'a>(&'a self, replica: &'a str) -> BoxFuture<'a, bool> {
        Box::pin(async move { self.0.contains(replica) })
    }
}

fn approvals(me: &str, holders: Arc<Holders>) -> Approvals {
    let approvals = Approvals::new(Arc::new(Metrics::new()));
    drop(approvals.reporter("team-a", "task-1"));
    approvals.share(me.to_string(), holders);
    approvals
}

fn holders(me: &str, lease: &Arc<Fake>, gone: &[&str]) -> Arc<Holders> {
    Arc::new(Holders {
        store: Box::new(lease.clone()),
        replicas: Box::new(Gone(gone.iter().map(|g| g.to_string()).collect())),
        me: me.to_string(),
        writes: Default::default(),
    })
}

fn call(params: &Value) -> HoldCall<'_> {
    HoldCall {
        server: "gh",
        tool: "create_issue",
        definition: DEFINITION,
        context_version: 3,
        params,
    }
}

fn holders_of(lease: &Arc<Fake>) -> Vec<(String, String)> {
    let text = lease.state.lock().expect("lock").0.clone();
    entries(text.as_deref())
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap_or_default().to_string(),
                e["holder"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_write_that_conflicts_is_made_again_on_what_the_other_replica_wrote() {
    let lease = Arc::new(Fake::default());
    let (h1, h2) = (holders("r1", &lease, &[]), holders("r2", &lease, &[]));
    let (r1, r2) = (approvals("r1", h1.clone()), approvals("r2", h2.clone()));
    let p1 = json!({"name": "create_issue", "arguments": {"title": "one"}});
    let p2 = json!({"name": "create_issue", "arguments": {"title": "two"}});
    let a = r1.hold(call(&p1), WAIT).expect("held");
    let b = r2.hold(call(&p2), WAIT).expect("held");
    // r1 writes between r2's read and r2's write: r2's write conflicts, and is made again.
    let r1_text = r1.current().1;
    let r1_value = crate::approval::lease::merge_own(
        None,
        "r1",
        &entries(Some(&r1_text)),
        |_| true,
        jiff::Timestamp::now(),
    );
    lease.interleave.lock().expect("lock").push(r1_value);
    h2.publish(&r2, &r2.current().1).await.expect("published");
    assert_eq!(*lease.conflicts.lock().expect("lock"), 1);
    assert_eq!(
        holders_of(&lease),
        [
            (a.id().to_string(), "r1".into()),
            (b.id().to_string(), "r2".into())
        ]
    );
    // r2's call ends: only its entry goes.
    drop(b);
    h2.publish(&r2, &r2.current().1).await.expect("published");
    assert_eq!(holders_of(&lease), [(a.id().to_string(), "r1".into())]);
    // Conflicts without end: an error, not a loop.
    for _ in 0..MAX_CONFLICTS {
        lease.interleave.lock().expect("lock").push("[]".into());
    }
    let b = r2.hold(call(&p2), WAIT).expect("held");
    assert!(h2.publish(&r2, &r2.current().1).await.is_err());
    drop(b);
}

#[tokio::test]
async fn a_call_adopts_the_same_call_of_a_replica_that_is_gone_and_no_other() {
    let lease = Arc::new(Fake::default());
    let h1 = holders("r1", &lease, &[]);
    let r1 = approvals("r1", h1.clone());
    let params = json!({"name": "create_issue", "arguments": {"title": "one"}});
    let held = r1.hold(call(&params), WAIT).expect("held");
    h1.publish(&r1, &r1.current().1).await.expect("published");
    let id = held.id().to_string();

    // r1 lives: r2 does not adopt, it holds the call anew.
    let alive = holders("r2", &lease, &[]);
    let r2 = approvals("r2", alive.clone());
    assert!(r2.adopt(call(&params)).await.is_none());

    // r1 is gone: r2 adopts the same call, with its id; the Lease names r2 now.
    std::mem::forget(held); // r1 was killed: nothing of it withdraws its request.
    let h2 = holders("r2", &lease, &["r1"]);
    let r2 = approvals("r2", h2.clone());
    let other = json!({"name": "create_issue", "arguments": {"title": "two"}});
    assert!(
        r2.adopt(call(&other)).await.is_none(),
        "other arguments adopt nothing"
    );
    let adopted = match r2.adopt(call(&params)).await {
        Some(Adopted::Held(held)) => held,
        _ => panic!("not adopted"),
    };
    assert_eq!(adopted.id(), id);
    assert_eq!(holders_of(&lease), [(id.clone(), "r2".into())]);
    // r3 (r1 gone too) finds it held by r2, alive: not adopted twice.
    let h3 = holders("r3", &lease, &["r1"]);
    let r3 = approvals("r3", h3);
    assert!(r3.adopt(call(&params)).await.is_none());
    drop(adopted);
    h2.publish(&r2, &r2.current().1).await.expect("published");
    assert_eq!(holders_of(&lease), []);
}

#[tokio::test]
async fn a_verdict_known_when_adopting_decides_at_once_and_takes_the_request_off_the_lease() {
    let lease = Arc::new(Fake::default());
    let h1 = holders("r1", &lease, &[]);
    let r1 = approvals("r1", h1.clone());
    let params = json!({"name": "create_issue", "arguments": {"title": "one"}});
    let held = r1.hold(call(&params), WAIT).expect("held");
    h1.publish(&r1, &r1.current().1).await.expect("published");
    let request = held.request.clone();
    std::mem::forget(held);
    let h2 = holders("r2", &lease, &["r1"]);
    let r2 = approvals("r2", h2.clone());
    let verdict = json!([{"id": request.id, "decision": "approve", "decidedBy": "alice", "digest": request.digest}]);
    r2.verdicts("test", verdict.to_string().as_bytes());
    match r2.adopt(call(&params)).await {
        Some(Adopted::Decided {
            request: adopted,
            outcome: Outcome::Verdict(v),
        }) => {
            assert_eq!(adopted, request);
            assert_eq!(
                (v.decision, v.decided_by.as_str()),
                (Decision::Approve, "alice")
            );
        }
        _ => panic!("not decided at once"),
    }
    assert_eq!(
        holders_of(&lease),
        [],
        "consumed: nobody can adopt it again"
    );
    let h3 = holders("r3", &lease, &["r1", "r2"]);
    let r3 = approvals("r3", h3);
    r3.verdicts("test", verdict.to_string().as_bytes());
    assert!(
        r3.adopt(call(&params)).await.is_none(),
        "an approved id is used once"
    );
}

#[tokio::test]
async fn a_call_sent_again_with_its_clients_own_meta_adopts_and_takes_the_first_senders_meta() {
    // Claude Code sends a call again with a new `_meta` (its tool use id): the same call.
    let lease = Arc::new(Fake::default());
    let h1 = holders("r1", &lease, &[]);
    let r1 = approvals("r1", h1.clone());
    let first = json!({"name": "create_issue", "arguments": {"title": "one"},
                       "_meta": {"claudecode/toolUseId": "toolu_1"}});
    let held = r1.hold(call(&first), WAIT).expect("held");
    h1.publish(&r1, &r1.current().1).await.expect("published");
    let id = held.id().to_string();
    std::mem::forget(held); // r1 was killed.

    let h2 = holders("r2", &lease, &["r1"]);
    let r2 = approvals("r2", h2.clone());
    // Other arguments under the first sender's `_meta` are another call.
    let other = json!({"name": "create_issue", "arguments": {"title": "two"},
                       "_meta": {"claudecode/toolUseId": "toolu_1"}});
    assert!(r2.adopt(call(&other)).await.is_none());
    let again = json!({"name": "create_issue", "arguments": {"title": "one"},
                       "_meta": {"claudecode/toolUseId": "toolu_2"}});
    let adopted = match r2.adopt(call(&again)).await {
        Some(Adopted::Held(held)) => held,
        _ => panic!("the call sent again was not adopted"),
    };
    assert_eq!(adopted.id(), id);
    // What goes, if approved, is the call as first sent (what a person saw).
    assert_eq!(
        crate::approval::shown_meta(&adopted.request),
        Some(Some(json!({"claudecode/toolUseId": "toolu_1"})))
    );
}
