//! Shared mode: the task's Secret `<taskrun>-zone-keys` (`render::Plan::zone_keys_secret`),
//! one random 32-byte key per stdio server as 64 hex digits: its zone container mounts its own
//! item (`zone --key-file`), and the shared proxy reads it through the task's Role to prove it
//! to the zone over TCP. Created before the Job, owned by the TaskRun, and never written again:
//! an existing Secret keeps its keys (a running zone reads its key once, at start).

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

use super::Context;
use crate::error::{Error, Result};
use crate::render::Plan;

/// The bytes of a zone's key.
const KEY_BYTES: usize = 32;

/// Creates the task's zone-keys Secret unless it exists (or the task has no zone over TCP).
pub async fn create_if_missing(ctx: &Context, ns: &str, plan: &Plan) -> Result<()> {
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
        // Made by an earlier reconcile: its keys stay (a zone may already run with one).
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A key: 32 random bytes as 64 lowercase hex digits.
fn random_key() -> Result<String> {
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
