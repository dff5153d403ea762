//! What the task pod's proxy reports on the task's Lease: the calls it holds for approval
//! ([`LeaseFacts`], see `approvals.rs`), and what it serves: it reports the `contextVersion` it serves on the task's
//! Lease (annotation [`SERVED_ANNOTATION`], see `render::identity`), which the operator watches
//! (metadata only) and turns into `status.servedContextVersion` and the condition `ToolsSynced`.
//! Also which pod's proxy may write the Lease ([`BINDING_UID_ANNOTATION`], see `binding.rs`).
//!
//! A request is listed only when it is what our proxy writes ([`well_formed`]): its digest and
//! definition are hashes, its `params` a `tools/call` params object for the tool it names (or
//! empty, when its view is withheld), and, when nothing in it is masked, its digest covers
//! exactly what it shows (recomputed here, [`ShownCall::check`]), so a request cannot show one
//! call and name another. (When something is masked the digest is salted with a value only the
//! proxy knows: nobody can recompute it, nor test a guess of a masked value against it.)

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use orchestrator_crds::approval::{
    ApprovalRequest, BINDING_UID_ANNOTATION, DigestCheck, MASK_NONCE_LEN, MAX_MASKED, MAX_PENDING,
    MAX_REQUEST_BYTES, REQUESTS_ANNOTATION,
};
use orchestrator_crds::gateway::{ModelUsage, USAGE_ANNOTATION};
use orchestrator_crds::policy::is_pin;

use super::children::Index;

/// Annotation on the task's Lease, written by the proxy: the `contextVersion` it serves.
pub const SERVED_ANNOTATION: &str = "orchestrator.io/served-context-version";

/// The version the proxy of task `name` reports it serves, if it has reported.
pub fn reported(leases: &Index<LeaseFacts>, ns: &str, name: &str) -> Option<i64> {
    leases.get(ns, name).and_then(|f| f.served)
}

/// What the operator keeps of a task Lease: the version its proxy serves, the calls it holds
/// for approval, and the pod bound to it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LeaseFacts {
    pub served: Option<i64>,
    /// `None`: the proxy never published any (nothing to withdraw).
    pub requests: Option<Vec<ApprovalRequest>>,
    /// The uid of the pod whose proxy alone may write the Lease (`None`: not bound yet).
    pub bound_uid: Option<String>,
    /// What the proxy's model gateway counted (`status.usage`).
    pub usage: Option<ModelUsage>,
}

/// What the proxy of task `name` reports its model gateway counted, if it has reported.
pub fn usage(leases: &Index<LeaseFacts>, ns: &str, name: &str) -> Option<ModelUsage> {
    leases.get(ns, name).and_then(|f| f.usage.clone())
}

/// The facts of a task Lease; a malformed request list counts as none published (logged).
pub fn lease_facts(lease: &PartialObjectMeta<Lease>) -> Option<LeaseFacts> {
    let annotations = lease.metadata.annotations.as_ref()?;
    let (ns, task) = (
        lease.metadata.namespace.as_deref().unwrap_or_default(),
        lease.name_any(),
    );
    let served = annotations
        .get(SERVED_ANNOTATION)
        .and_then(|v| v.parse().ok());
    let requests = annotations
        .get(REQUESTS_ANNOTATION)
        .and_then(|v| match serde_json::from_str::<Vec<ApprovalRequest>>(v) {
            Ok(mut requests) => {
                let before = requests.len();
                requests.retain(|r| well_formed(r, ns, &task));
                if requests.len() != before {
                    tracing::warn!(lease = %lease.name_any(), dropped = before - requests.len(), "ignoring approval requests with oversized or malformed fields");
                }
                requests.truncate(MAX_PENDING);
                Some(requests)
            }
            Err(e) => {
                tracing::warn!(lease = %lease.name_any(), error = %e, "ignoring a malformed {REQUESTS_ANNOTATION}");
                None
            }
        });
    let bound_uid = annotations
        .get(BINDING_UID_ANNOTATION)
        .filter(|u| !u.is_empty())
        .cloned();
    // Bounded: a report is a handful of numbers; anything long is not our proxy's.
    let usage = annotations
        .get(USAGE_ANNOTATION)
        .filter(|v| v.len() <= 1024)
        .and_then(|v| serde_json::from_str::<ModelUsage>(v).ok())
        .filter(|u| {
            u.cost_usd.as_ref().is_none_or(|c| c.len() <= 32)
                && u.exceeded.as_ref().is_none_or(|e| e.len() <= 32)
                && u.started_at.as_ref().is_none_or(|t| t.len() <= 40)
        });
    (served.is_some() || requests.is_some() || bound_uid.is_some() || usage.is_some()).then_some(
        LeaseFacts {
            served,
            requests,
            bound_uid,
            usage,
        },
    )
}

/// Whether a request is what a proxy writes (`orchestrator_crds::approval`): anything else did
/// not come from our proxy, and would only bloat the status or mislead the approver.
fn well_formed(r: &ApprovalRequest, namespace: &str, task: &str) -> bool {
    let short = |s: &str, max: usize| !s.is_empty() && s.len() <= max;
    let fields = short(&r.id, 64)
        && r.id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && short(&r.server, 128)
        && short(&r.tool, 128)
        && short(&r.requested_at, 64)
        && short(&r.expires_at, 64)
        && is_pin(&r.digest)
        && is_pin(&r.definition)
        && r.params.len() <= MAX_REQUEST_BYTES
        && r.mask_nonce.len() == MASK_NONCE_LEN
        && r.mask_nonce
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && r.masked.len() <= MAX_MASKED
        && r.masked
            .iter()
            .all(|m| short(&m.secret, 253) && short(&m.key, 253));
    if !fields {
        return false;
    }
    if r.withheld.is_some() {
        // Held, its params not shown: nothing to check them against.
        return r.params.is_empty();
    }
    // The params of a `tools/call` of the tool it names.
    let Ok(params) = serde_json::from_str::<serde_json::Value>(&r.params) else {
        return false;
    };
    if params.get("name").and_then(|n| n.as_str()) != Some(r.tool.as_str()) {
        return false;
    }
    // Nothing masked: the params shown are the params sent, so the digest must be theirs.
    matches!(
        r.shown(namespace, task).check(),
        DigestCheck::Covers | DigestCheck::Salted
    )
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// The fixed vector of `orchestrator_crds::approval` (the sidecar's tests assert it too).
    const VECTOR: &str = "sha256:e1afe37203b00ff1c6bc666d39c20ba74fdf32752e80297c55f90aad034133a3";

    /// Task `held`'s Lease in `team-a`, listing `requests`.
    fn lease(requests: Value) -> PartialObjectMeta<Lease> {
        serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "held", "namespace": "team-a",
                         "annotations": {REQUESTS_ANNOTATION: requests.to_string()}}}))
        .unwrap_or_else(|e| panic!("a Lease: {e}"))
    }

    /// The request of the fixed vector, as the proxy publishes it.
    pub(crate) fn vector_request() -> Value {
        let params = json!({"name": "echo", "arguments": {"message": "B: rm -rf /", "n": 12345678901234i64}});
        json!({"id": "0a1b2c3d", "server": "everything", "tool": "echo", "digest": VECTOR,
            "definition": format!("sha256:{}", "1".repeat(64)), "contextVersion": 3,
            "params": params.to_string(), "paramsBytes": params.to_string().len(),
            "maskNonce": "a1b2c3", "requestedAt": "2026-01-01T00:00:00Z",
            "expiresAt": "2026-01-01T00:05:00Z"})
    }

    fn listed(requests: Value) -> Vec<String> {
        lease_facts(&lease(requests))
            .unwrap_or_default()
            .requests
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.id)
            .collect()
    }

    #[test]
    fn oversized_or_malformed_requests_are_dropped() {
        let ok = vector_request();
        let mut huge = ok.clone();
        huge["tool"] = json!("x".repeat(10_000));
        let mut bad_id = ok.clone();
        bad_id["id"] = json!("../../etc");
        let mut too_long = ok.clone();
        too_long["params"] = json!(
            json!({"name": "echo", "arguments": {"message": "x".repeat(MAX_REQUEST_BYTES)}})
                .to_string()
        );
        too_long["masked"] = json!([{"secret": "s", "key": "k", "count": 1}]);
        let mut not_a_pin = ok.clone();
        not_a_pin["definition"] = json!("sha256:1111");
        let mut bad_nonce = ok.clone();
        bad_nonce["maskNonce"] = json!("A1B2C3");
        let mut other_tool = ok.clone();
        other_tool["tool"] = json!("get-sum");
        let mut not_an_object = ok.clone();
        not_an_object["params"] = json!("[\"echo\"]");
        assert_eq!(
            listed(json!([
                ok,
                huge,
                bad_id,
                too_long,
                not_a_pin,
                bad_nonce,
                other_tool,
                not_an_object
            ])),
            ["0a1b2c3d"]
        );
    }

    #[test]
    fn a_request_whose_unmasked_params_do_not_hash_to_its_digest_is_dropped() {
        // The fixed vector: what the proxy digests is what the operator recomputes.
        assert_eq!(listed(json!([vector_request()])), ["0a1b2c3d"]);
        // Shows another call under the digest of the first (the view was swapped).
        let mut swapped = vector_request();
        swapped["params"] = json!(
            json!({"name": "echo", "arguments": {"message": "A: hello", "n": 12345678901234i64}})
                .to_string()
        );
        // The same call on another task's Lease, or at another context version.
        let elsewhere = lease(json!([vector_request()]));
        let mut elsewhere_meta = elsewhere.clone();
        elsewhere_meta.metadata.name = Some("other".into());
        let mut other_version = vector_request();
        other_version["contextVersion"] = json!(4);
        assert_eq!(
            listed(json!([swapped, other_version])),
            Vec::<String>::new()
        );
        assert_eq!(
            lease_facts(&elsewhere_meta)
                .unwrap_or_default()
                .requests
                .unwrap_or_default(),
            []
        );
        // With something masked the digest cannot be recomputed here (the proxy checks it).
        let mut masked = vector_request();
        masked["params"] = json!(json!({"name": "echo", "arguments": {"message": "B: <secret:deploy/passphrase:a1b2c3>"}}).to_string());
        masked["masked"] = json!([{"secret": "deploy", "key": "passphrase", "count": 1}]);
        assert_eq!(listed(json!([masked])), ["0a1b2c3d"]);
    }

    #[test]
    fn a_request_whose_view_is_withheld_is_listed_only_without_params() {
        let mut withheld = vector_request();
        withheld["withheld"] = json!("tooLarge");
        withheld["params"] = json!("");
        withheld["masked"] = json!([{"secret": "deploy", "key": "passphrase", "count": 900}]);
        let mut showing = withheld.clone();
        showing["id"] = json!("0a1b2c3e");
        showing["params"] = vector_request()["params"].clone();
        let facts = lease_facts(&lease(json!([withheld, showing]))).unwrap_or_default();
        let listed = facts.requests.unwrap_or_default();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            listed[0].withheld,
            Some(orchestrator_crds::approval::ViewWithheld::TooLarge)
        );
    }

    #[test]
    fn the_binding_is_read_from_its_annotation() {
        let mut meta = lease(json!([]));
        if let Some(a) = meta.metadata.annotations.as_mut() {
            a.insert(BINDING_UID_ANNOTATION.into(), "pod-uid-1".into());
        }
        let facts = lease_facts(&meta).unwrap_or_default();
        assert_eq!(facts.bound_uid.as_deref(), Some("pod-uid-1"));
        assert_eq!(
            lease_facts(&lease(json!([]))).unwrap_or_default().bound_uid,
            None
        );
    }
}
