//! `status.contextHistory`: one entry per `contextVersion` the operator rendered, saying when,
//! which tools it added and removed, and who asked for it. Pure: the operator records the
//! entries, the CLI writes the [`REQUESTED_BY_ANNOTATION`] and shows the history.
//!
//! Who asked is what the writer of the change says in [`REQUESTED_BY_ANNOTATION`] (the CLI
//! writes the identity the API server told it, in the same write as the change), taken only
//! when it names the generation being rendered, so an annotation left by an earlier change is
//! never credited with a later one. Otherwise the field manager that last wrote
//! `spec.toolConfig` (`managedFields`), otherwise "unknown".

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tool_config::EffectiveTools;

/// The annotation naming who asked for the change that made the TaskRun's current generation:
/// JSON, `{"user":"alice","generation":2}` (see [`RequestedBy`]).
pub const REQUESTED_BY_ANNOTATION: &str = "orchestrator.io/requested-by";

/// The most entries `status.contextHistory` keeps (the oldest go first).
pub const MAX_ENTRIES: usize = 20;

/// The most tools an entry lists as added (or removed); past it the list ends with `(N more)`.
pub const MAX_TOOLS: usize = 50;

/// The most characters of an entry's `requestedBy` (what the annotation says is cut there: it is
/// anyone's to write, and each of the [`MAX_ENTRIES`] entries keeps it).
pub const MAX_REQUESTED_BY_CHARS: usize = 256;

/// The field manager under which the operator writes `status.contextHistory` (its other status
/// fields are written under another, so they can be written without the history).
pub const HISTORY_MANAGER: &str = "orchestrator-operator-history";

/// What the operator credits a change to when the spec did not change (the catalog did).
pub const OPERATOR: &str = "orchestrator-operator";

/// One rendered `contextVersion`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextChange {
    /// The version this entry is about.
    pub context_version: i64,
    /// The TaskRun's `metadata.generation` rendered into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// When the operator rendered it.
    pub time: Time,
    /// Who asked for it: a user name, a field manager, `orchestrator-operator` or `unknown`
    /// (see `source`).
    pub requested_by: String,
    /// Where `requestedBy` comes from.
    pub source: Source,
    /// Tools the agent can call from this version on, as `server/tool`; for a server whose
    /// tools the catalog does not list, its patterns (`server/*`, `server/create_*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    /// Tools the agent can no longer call, named the same way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

/// Where an entry's `requestedBy` comes from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Source {
    /// The `orchestrator.io/requested-by` annotation written with the change (what the client
    /// says: anyone who may patch the TaskRun may write it).
    Annotation,
    /// The field manager of the latest write to `spec.toolConfig` (e.g. `kubectl-edit`).
    FieldManager,
    /// The spec did not change: the catalog (or the operator's settings) did.
    Operator,
    /// Nothing says.
    Unknown,
}

/// The value of [`REQUESTED_BY_ANNOTATION`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RequestedBy {
    /// The requesting identity (the CLI: the user name the API server reports for it).
    pub user: String,
    /// The `metadata.generation` the change makes.
    pub generation: i64,
}

impl RequestedBy {
    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// An annotation value; `None` when it is not one.
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }
}

/// Who asked for the change that made generation `rendered`, from the TaskRun's metadata as
/// read now (`meta`). `previous_generation`: the generation of the last recorded entry; the
/// same generation means the spec did not change. When the spec changed again since the render
/// (`meta` has a later generation), its `managedFields` tell the later write, so only an
/// annotation naming `rendered` counts.
pub fn attribute(
    meta: &ObjectMeta,
    rendered: Option<i64>,
    previous_generation: Option<i64>,
) -> (String, Source) {
    if previous_generation.is_some() && previous_generation == rendered {
        return (OPERATOR.to_string(), Source::Operator);
    }
    let annotated = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(REQUESTED_BY_ANNOTATION))
        .and_then(|v| RequestedBy::parse(v))
        .filter(|r| Some(r.generation) == rendered && !r.user.is_empty());
    if let Some(r) = annotated {
        let user = match r.user.char_indices().nth(MAX_REQUESTED_BY_CHARS) {
            Some((cut, _)) => r.user[..cut].to_string(),
            None => r.user,
        };
        return (user, Source::Annotation);
    }
    let writer = (meta.generation == rendered)
        .then(|| last_spec_writer(meta.managed_fields.as_deref().unwrap_or_default()))
        .flatten();
    match writer {
        Some(manager) => (manager, Source::FieldManager),
        None => ("unknown".to_string(), Source::Unknown),
    }
}

/// The manager of the latest `managedFields` entry owning part of `spec.toolConfig` (else of
/// `spec`: a TaskRun created without a `toolConfig` gets the default one). Times have seconds
/// only: on a tie, an entry owning the requested-by annotation loses (the annotation does not
/// name this generation, so that writer's change with it came before), then the later entry
/// wins.
fn last_spec_writer(entries: &[ManagedFieldsEntry]) -> Option<String> {
    let owns = |e: &ManagedFieldsEntry, path: &[&str]| {
        let mut v = e.fields_v1.as_ref().map(|f| &f.0);
        for key in path {
            v = v.and_then(|v| v.get(key));
        }
        v.is_some()
    };
    let annotation = format!("f:{REQUESTED_BY_ANNOTATION}");
    let latest = |path: &[&str]| {
        entries
            .iter()
            .enumerate()
            .filter(|(_, e)| owns(e, path))
            .max_by_key(|(i, e)| {
                let annotated = owns(e, &["f:metadata", "f:annotations", &annotation]);
                (e.time.as_ref().map(|t| t.0), !annotated, *i)
            })
            .and_then(|(_, e)| e.manager.clone())
    };
    latest(&["f:spec", "f:toolConfig"]).or_else(|| latest(&["f:spec"]))
}

/// The tools `after` adds to and removes from `before` (both `status.tools`), as
/// [`ContextChange::added`] and [`ContextChange::removed`] name them; each list is sorted and
/// bounded by [`MAX_TOOLS`].
pub fn diff(before: &[EffectiveTools], after: &[EffectiveTools]) -> (Vec<String>, Vec<String>) {
    let servers: BTreeSet<&str> = before
        .iter()
        .chain(after)
        .map(|t| t.server.as_str())
        .collect();
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    for server in servers {
        let old = before.iter().find(|t| t.server == server);
        let new = after.iter().find(|t| t.server == server);
        let known = [old, new]
            .iter()
            .all(|t| t.is_none_or(|t| t.exposed.is_some()));
        let (plus, minus) = if known {
            let tools = |t: Option<&EffectiveTools>| -> BTreeSet<String> {
                t.and_then(|t| t.exposed.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .collect()
            };
            set_diff(&tools(old), &tools(new))
        } else {
            patterns_diff(old, new)
        };
        added.extend(plus.into_iter().map(|t| format!("{server}/{t}")));
        removed.extend(minus.into_iter().map(|t| format!("{server}/{t}")));
    }
    (bounded(added), bounded(removed))
}

/// For a server whose tools are not known: allow patterns granted or dropped, and deny patterns
/// added (a removal) or lifted (a grant) while the server stays.
fn patterns_diff(
    old: Option<&EffectiveTools>,
    new: Option<&EffectiveTools>,
) -> (Vec<String>, Vec<String>) {
    let allow = |t: Option<&EffectiveTools>| -> BTreeSet<String> {
        match t {
            None => BTreeSet::new(),
            Some(t) if t.allow.is_empty() => BTreeSet::from(["*".to_string()]),
            Some(t) => t.allow.iter().cloned().collect(),
        }
    };
    let (mut plus, mut minus) = set_diff(&allow(old), &allow(new));
    if let (Some(old), Some(new)) = (old, new) {
        let deny = |t: &EffectiveTools| t.deny.iter().cloned().collect::<BTreeSet<_>>();
        let (denied, lifted) = set_diff(&deny(old), &deny(new));
        minus.extend(denied);
        plus.extend(lifted);
    }
    (plus, minus)
}

/// What `new` has that `old` lacks, and the other way round.
fn set_diff(old: &BTreeSet<String>, new: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    (
        new.difference(old).cloned().collect(),
        old.difference(new).cloned().collect(),
    )
}

fn bounded(mut tools: Vec<String>) -> Vec<String> {
    if tools.len() > MAX_TOOLS {
        let more = tools.len() - (MAX_TOOLS - 1);
        tools.truncate(MAX_TOOLS - 1);
        tools.push(format!("({more} more)"));
    }
    tools
}

/// Appends `entry` unless the history already records its version (or a later one), keeping the
/// last [`MAX_ENTRIES`]. Returns whether it was appended.
pub fn append(history: &mut Vec<ContextChange>, entry: ContextChange) -> bool {
    if history
        .last()
        .is_some_and(|last| last.context_version >= entry.context_version)
    {
        return false;
    }
    history.push(entry);
    let over = history.len().saturating_sub(MAX_ENTRIES);
    history.drain(..over);
    true
}

impl ContextChange {
    /// Who, as people read it: `alice`, `kubectl-edit (field manager)`, ...
    pub fn who(&self) -> String {
        match self.source {
            Source::Annotation | Source::Unknown => self.requested_by.clone(),
            Source::FieldManager => format!("{} (field manager)", self.requested_by),
            Source::Operator => format!("{} (catalog change)", self.requested_by),
        }
    }

    /// `+a +b -c`, or `no tool change`.
    pub fn changes(&self) -> String {
        let marked: Vec<String> = self
            .added
            .iter()
            .map(|t| format!("+{t}"))
            .chain(self.removed.iter().map(|t| format!("-{t}")))
            .collect();
        if marked.is_empty() {
            "no tool change".to_string()
        } else {
            marked.join(" ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn tools(
        server: &str,
        allow: &[&str],
        deny: &[&str],
        exposed: Option<&[&str]>,
    ) -> EffectiveTools {
        let strings = |s: &[&str]| s.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        EffectiveTools {
            server: server.into(),
            allow: strings(allow),
            deny: strings(deny),
            exposed: exposed.map(strings),
        }
    }

    fn entry(version: i64) -> ContextChange {
        ContextChange {
            context_version: version,
            generation: Some(version),
            time: Time(Timestamp::UNIX_EPOCH),
            requested_by: "alice".into(),
            source: Source::Annotation,
            added: Vec::new(),
            removed: Vec::new(),
        }
    }

    #[test]
    fn the_history_keeps_the_last_entries_once_each() {
        let mut history = Vec::new();
        for v in 1..=25 {
            assert!(append(&mut history, entry(v)));
        }
        assert_eq!(history.len(), MAX_ENTRIES);
        assert_eq!(history[0].context_version, 6);
        assert_eq!(history[MAX_ENTRIES - 1].context_version, 25);
        // Recorded already (a reconcile repeated after a crash): not again.
        assert!(!append(&mut history, entry(25)));
        assert!(!append(&mut history, entry(24)));
        assert_eq!(history.len(), MAX_ENTRIES);
    }

    #[test]
    fn the_diff_names_tools_or_patterns() {
        let before = [
            tools("filesystem", &[], &[], Some(&["read_file", "write_file"])),
            tools("github", &["get_*"], &["get_secret"], None),
            tools("time", &[], &[], Some(&["get_current_time"])),
        ];
        let after = [
            tools("filesystem", &[], &["write_file"], Some(&["read_file"])),
            tools("github", &["get_*", "create_issue"], &[], None),
            tools("memory", &[], &[], None),
        ];
        let (added, removed) = diff(&before, &after);
        assert_eq!(
            added,
            ["github/create_issue", "github/get_secret", "memory/*"]
        );
        assert_eq!(removed, ["filesystem/write_file", "time/get_current_time"]);
        // The first version: everything is added.
        let (added, removed) = diff(&[], &before[..1]);
        assert_eq!(added, ["filesystem/read_file", "filesystem/write_file"]);
        assert!(removed.is_empty());
        assert_eq!(diff(&before, &before), (Vec::new(), Vec::new()));
    }

    #[test]
    fn a_long_list_is_bounded() {
        let many: Vec<String> = (0..120).map(|i| format!("t{i:03}")).collect();
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        let (added, _) = diff(&[], &[tools("s", &[], &[], Some(&names))]);
        assert_eq!(added.len(), MAX_TOOLS);
        assert_eq!(added[MAX_TOOLS - 1], "(71 more)");
    }

    fn meta(generation: i64, annotation: Option<&str>, managed: serde_json::Value) -> ObjectMeta {
        let mut m: ObjectMeta =
            serde_json::from_value(json!({"managedFields": managed})).expect("metadata");
        m.generation = Some(generation);
        if let Some(a) = annotation {
            m.annotations = Some([(REQUESTED_BY_ANNOTATION.to_string(), a.to_string())].into());
        }
        m
    }

    #[test]
    fn who_asked_is_the_annotation_of_this_generation_else_the_field_manager() {
        let managed = json!([
            {"manager": "orchestrator-cli", "operation": "Update", "time": "2026-01-01T00:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:toolConfig": {"f:mcpServers": {}}}}},
            {"manager": "kubectl-edit", "operation": "Update", "time": "2026-01-01T00:05:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:toolConfig": {"f:policy": {}}}}},
            {"manager": "orchestrator-operator", "operation": "Apply", "time": "2026-01-01T00:06:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}
        ]);
        let alice = RequestedBy {
            user: "alice".into(),
            generation: 2,
        }
        .to_annotation();
        assert_eq!(alice, r#"{"user":"alice","generation":2}"#);
        assert_eq!(
            attribute(&meta(2, Some(&alice), managed.clone()), Some(2), Some(1)),
            ("alice".into(), Source::Annotation)
        );
        // A later change by someone else leaves alice's annotation behind: not hers.
        assert_eq!(
            attribute(&meta(3, Some(&alice), managed.clone()), Some(3), Some(2)),
            ("kubectl-edit".into(), Source::FieldManager)
        );
        // Both in the same second, the CLI's entry listed last: the one without the stale
        // annotation made the change.
        let tied = json!([
            {"manager": "kubectl-edit", "operation": "Update", "time": "2026-01-01T00:05:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:toolConfig": {}}}},
            {"manager": "orchestrator-cli", "operation": "Update", "time": "2026-01-01T00:05:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:toolConfig": {}},
                "f:metadata": {"f:annotations": {"f:orchestrator.io/requested-by": {}}}}}
        ]);
        assert_eq!(
            attribute(&meta(3, Some(&alice), tied), Some(3), Some(2)),
            ("kubectl-edit".into(), Source::FieldManager)
        );
        assert_eq!(
            attribute(&meta(3, Some("not json"), json!([])), Some(3), Some(2)),
            ("unknown".into(), Source::Unknown)
        );
        // The same generation again: the catalog changed, not the spec.
        assert_eq!(
            attribute(&meta(2, Some(&alice), managed.clone()), Some(2), Some(2)),
            (OPERATOR.into(), Source::Operator)
        );
        // Rendered at generation 2, but read at 3 (changed again meanwhile): alice's annotation
        // of 2 still counts; without it, the later write's field manager does not.
        assert_eq!(
            attribute(&meta(3, Some(&alice), managed.clone()), Some(2), Some(1)),
            ("alice".into(), Source::Annotation)
        );
        assert_eq!(
            attribute(&meta(3, None, managed), Some(2), Some(1)),
            ("unknown".into(), Source::Unknown)
        );
        // An annotation is anyone's to write: what the history keeps of it is bounded.
        let long = RequestedBy {
            user: "é".repeat(MAX_REQUESTED_BY_CHARS + 10),
            generation: 2,
        }
        .to_annotation();
        let (user, source) = attribute(&meta(2, Some(&long), json!([])), Some(2), Some(1));
        assert_eq!(source, Source::Annotation);
        assert_eq!(user, "é".repeat(MAX_REQUESTED_BY_CHARS));
        // Created without a toolConfig: whoever wrote the spec.
        let created = json!([{"manager": "kubectl-create", "operation": "Update",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:taskId": {}}}}]);
        assert_eq!(
            attribute(&meta(1, None, created), Some(1), None),
            ("kubectl-create".into(), Source::FieldManager)
        );
    }

    #[test]
    fn an_entry_reads_as_who_and_what() {
        let mut e = entry(2);
        assert_eq!(e.changes(), "no tool change");
        e.added = vec!["github/create_issue".into()];
        e.removed = vec!["time/*".into()];
        assert_eq!(e.changes(), "+github/create_issue -time/*");
        e.source = Source::FieldManager;
        e.requested_by = "kubectl-edit".into();
        assert_eq!(e.who(), "kubectl-edit (field manager)");
    }
}
