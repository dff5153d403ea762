//! Shared mode's pending set on the task's Lease: one JSON array that several replicas write,
//! each entry an `ApprovalRequest` tagged `holder: <replica pod>`. Pure functions over the
//! annotation's text; the reads and the writes (by resourceVersion) are `api::holders`'.
//!
//! - [`merge_own`]: a replica's write changes only its own entries: it puts its pending set in
//!   and takes out the entries it held and no longer holds; the others' stay as they are (except
//!   those past their expiry by [`EXPIRED_KEPT`]: nobody can decide them any more).
//! - [`candidates`]: the entries a call may adopt: the same call (the digest recomputed with the
//!   entry's id matches), not expired, held by another replica (whether it is gone is asked of
//!   the API), or under this replica's name by an earlier process of it (an id it never held).
//! - [`take_over`]: the adoption's write: the entry, still held by the replica it was adopted
//!   from, gets this replica as its holder, or leaves the Lease when its verdict is known.

use orchestrator_crds::approval::ApprovalRequest;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Another replica's entry past its expiry by this much is dropped by any replica's write.
pub const EXPIRED_KEPT: std::time::Duration = std::time::Duration::from_secs(60);

/// One entry of the shared pending set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(flatten)]
    pub request: ApprovalRequest,
    /// The replica (pod name) holding the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

/// The entries of an annotation's value, each as it is (an entry that is not a request is kept
/// untouched by [`merge_own`]). No value, or one that is not an array: none.
pub fn entries(text: Option<&str>) -> Vec<Value> {
    match text.map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Array(items))) => items,
        _ => Vec::new(),
    }
}

fn field<'a>(entry: &'a Value, key: &str) -> Option<&'a str> {
    entry.get(key).and_then(Value::as_str)
}

/// Whether `entry` expired more than [`EXPIRED_KEPT`] before `now`.
fn long_expired(entry: &Value, now: jiff::Timestamp) -> bool {
    field(entry, "expiresAt")
        .and_then(|e| e.parse::<jiff::Timestamp>().ok())
        .and_then(|e| e.checked_add(EXPIRED_KEPT).ok())
        .is_some_and(|e| e < now)
}

/// The annotation's new value when replica `me` holds `own` (its pending set, as published):
/// the entries of others kept (unless long expired), the entries `me` held and no longer holds
/// (`held_here(id)`) gone, `own` in. An entry under `me`'s name with an id this process never
/// held (an earlier process of the same pod) is kept: it may be adopted.
pub fn merge_own(
    current: Option<&str>,
    me: &str,
    own: &[Value],
    held_here: impl Fn(&str) -> bool,
    now: jiff::Timestamp,
) -> String {
    let own_ids: Vec<&str> = own.iter().filter_map(|e| field(e, "id")).collect();
    let mut merged: Vec<Value> = entries(current)
        .into_iter()
        .filter(|e| {
            let id = field(e, "id").unwrap_or_default();
            let mine = field(e, "holder") == Some(me) && held_here(id);
            !mine && !own_ids.contains(&id) && !long_expired(e, now)
        })
        .collect();
    merged.extend(own.iter().cloned());
    Value::Array(merged).to_string()
}

/// The entries a call may adopt, oldest first: `same_call(request)` (its digest recomputed with
/// the entry's id), not expired at `now`, and held by another replica than `me` or by an
/// earlier process of `me` (`held_here(id)` false). Whether another holder is gone is for the
/// caller to find out.
pub fn candidates(
    current: Option<&str>,
    me: &str,
    held_here: impl Fn(&str) -> bool,
    same_call: impl Fn(&ApprovalRequest) -> bool,
    now: jiff::Timestamp,
) -> Vec<Entry> {
    entries(current)
        .into_iter()
        .filter_map(|e| serde_json::from_value::<Entry>(e).ok())
        .filter(|e| match e.holder.as_deref() {
            None => false,
            Some(holder) => holder != me || !held_here(&e.request.id),
        })
        .filter(|e| {
            e.request
                .expires_at
                .parse::<jiff::Timestamp>()
                .is_ok_and(|at| at > now)
        })
        .filter(|e| same_call(&e.request))
        .collect()
}

/// The annotation's value once `me` took over entry `id` from `from` (its holder when it was
/// found): holder `me`, or out of the set when `consume` (its verdict is known: it decides
/// now, once). `None`: the entry is no longer there under `from` (another replica took it, or
/// it was decided).
pub fn take_over(
    current: Option<&str>,
    id: &str,
    from: &str,
    me: &str,
    consume: bool,
) -> Option<String> {
    let mut all = entries(current);
    let at = all
        .iter()
        .position(|e| field(e, "id") == Some(id) && field(e, "holder") == Some(from))?;
    if consume {
        all.remove(at);
    } else if let Some(entry) = all[at].as_object_mut() {
        entry.insert("holder".into(), Value::String(me.to_string()));
    }
    Some(Value::Array(all).to_string())
}

#[cfg(test)]
mod tests;
