//! Shared mode: the task's Secret `<taskrun>-zone-keys` (`render::Plan::zone_keys_secret`),
//! one random 32-byte key per stdio server as 64 hex digits: its zone container mounts its own
//! item (`zone --key-file`), and the shared proxy reads it through the task's Role to prove it
//! to the zone over TCP. Created before the Job, owned by the TaskRun, and never written again:
//! an existing Secret of this TaskRun keeps its keys (a running zone reads its key once, at
//! start).
//!
//! A Secret of that name that is not the TaskRun's (no controller owner reference with its uid)
//! is never used: whoever made it knows its keys, and with a zone's key starts that zone's
//! server, with its Secrets, from anywhere that reaches the pod. The TaskRun is blocked instead
//! (`NameTaken`, [`not_ours`], checked with the pod's identity before the Job is created), and
//! a Secret that appears between that check and the create stops the create
//! ([`create_if_missing`]): no Job is created.

use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use orchestrator_crds::taskrun::TaskRun;

use crate::error::{Error, Result};
use crate::reconcile::context::Context;
use crate::reconcile::taken;
use crate::render::{Plan, Problem, zone::zone_keys_secret_name};

/// The bytes of a zone's key.
const KEY_BYTES: usize = 32;

/// Creates the task's zone-keys Secret unless it exists (or the task has no zone over TCP).
pub async fn create_if_missing(ctx: &Context, ns: &str, tr: &TaskRun, plan: &Plan) -> Result<()> {
    let mut failed = None;
    let secret = plan.zone_keys_secret(|| {
        random_key().unwrap_or_else(|e| {
            failed = Some(e);
            String::new()
        })
    });
    let Some(secret) = secret else {
        return Ok(());
    };
    if let Some(e) = failed {
        return Err(e);
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        // Made by an earlier reconcile: its keys stay (a zone may already run with one). Made by
        // anyone else since `not_ours` looked: not used, and no Job (the next reconcile blocks).
        Err(kube::Error::Api(e)) if e.code == 409 => match not_ours(&ctx.client, ns, tr).await? {
            None => Ok(()),
            Some(problem) => Err(Error::Taken(problem.message)),
        },
        Err(e) => Err(e.into()),
    }
}

/// Whether the task needs a zone-keys Secret (shared mode with a stdio server).
pub fn wanted(plan: &Plan) -> bool {
    plan.zone_keys_secret(String::new).is_some()
}

/// Why the TaskRun's zone-keys Secret, when it exists, is not the TaskRun's to use: a Secret of
/// that name without a controller owner reference carrying the TaskRun's uid. Reads its
/// metadata only (never a value of someone else's Secret).
pub async fn not_ours(client: &Client, ns: &str, tr: &TaskRun) -> Result<Option<Problem>> {
    let name = zone_keys_secret_name(&tr.name_any());
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let Some(found) = api.get_metadata_opt(&name).await? else {
        return Ok(None);
    };
    let mut metadata = found.metadata;
    metadata.namespace.get_or_insert_with(|| ns.to_string());
    Ok(taken::judge("Secret", &metadata, tr).map(|problem| Problem {
        message: format!(
            "{}. The task's zone keys must be ones the operator drew: with a zone's key, whoever \
             knows it starts that server, with its Secrets",
            problem.message
        ),
        ..problem
    }))
}

/// A key (a zone's, the auditors' token): 32 random bytes as 64 lowercase hex digits.
pub(super) fn random_key() -> Result<String> {
    let mut bytes = [0u8; KEY_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_64_hex_digits_and_never_the_same_twice() {
        let (a, b) = (random_key().expect("a key"), random_key().expect("a key"));
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
