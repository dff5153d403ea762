//! Masking by value: what a person is shown of a held call, with the values of the task's
//! Secrets replaced by `<secret:SECRET/KEY:NONCE>`.
//!
//! The values come from a [`MaskSource`], read at each hold so a rotated Secret is masked with
//! its new value. A sidecar's is `--mask-secrets-dir` (`MCP_PROXY_MASK_SECRETS_DIR`,
//! [`MaskSource::Dir`]): one file per Secret key, at `<secret>/<key>` (the operator's projected
//! volume, items path `<secret>/<key>`; the kubelet's `..data` entries are skipped),
//! [`Masker::load`]. A shared proxy's reads the task's Secrets through the API
//! ([`MaskSource::Values`], `tenant::secrets`), the keys the operator lists in the task's
//! ConfigMap. Either way at most [`MAX_FILES`] values, each of at most [`MAX_FILE_BYTES`].
//! Values are never logged: errors name files and Secrets, not contents.
//!
//! [`Masker::mask`] walks the params: every string value and object key, where each value of
//! [`MIN_BYTES`] or more is replaced wherever it occurs (also with its trailing `\n` stripped,
//! and in the JSON-escaped and `\uXXXX` forms `audit::redact` looks for), and every number
//! whose text is a value (it becomes the placeholder string). The rest is left byte for byte.
//! Two keys of one object that read the same once masked make the view
//! [`Masked::ambiguous`] (the caller withholds it: whether anything was masked must never
//! decide whether a call is held).
//!
//! What is not recognised is shown in clear: base64 or URL-encoded forms, a value split across
//! strings, values under [`MIN_BYTES`].

use std::{
    collections::{HashMap, HashSet},
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
};

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use futures::future::BoxFuture;
use orchestrator_crds::approval::{MAX_MASKED, MAX_REQUEST_BYTES, MaskedSecret};
use serde_json::Value;

use crate::audit::redact::forms;

/// The most files read from the directory; with more, no call can be held (see
/// [`Masker::load`]).
pub const MAX_FILES: usize = 256;
/// The longest value read; a longer file is not used: a call carrying such a value could not
/// be shown anyway (it would take more than a request's [`MAX_REQUEST_BYTES`]).
pub const MAX_FILE_BYTES: usize = 64 * 1024;
/// Shorter values are not masked (they would blank common words and numbers).
pub const MIN_BYTES: usize = 4;
/// The longest Secret or key name (Kubernetes' own limit).
const MAX_NAME_BYTES: usize = 253;

/// Where the Secret values to mask come from.
#[derive(Clone)]
pub enum MaskSource {
    /// `--mask-secrets-dir`: files `<secret>/<key>`.
    Dir(PathBuf),
    /// Read by someone else (shared mode: the task's Secrets through the API).
    Values(Arc<dyn SecretValues>),
}

/// Values of Secret keys: `(secret, key, value)` each.
pub type Values = Vec<(String, String, String)>;

/// The values of a task's Secret keys, read when a call is held.
pub trait SecretValues: Send + Sync {
    /// Every `(secret, key, value)` to mask; `Err` says why they cannot be read (naming the
    /// Secret, never a value).
    fn read(&self) -> BoxFuture<'_, Result<Values, String>>;
}

impl MaskSource {
    /// The values as they are now.
    pub async fn load(&self) -> Result<Masker, String> {
        match self {
            MaskSource::Dir(dir) => Masker::load(dir),
            MaskSource::Values(values) => Masker::of(values.read().await?),
        }
    }
}

/// A random value a masked request's digest covers ([`CallDigest::salted`]): kept in the
/// process, never published nor logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Salt(pub(super) String);

impl Salt {
    /// 32 random bytes as hex; `None` when the system has no randomness to give.
    pub(super) fn new() -> Option<Self> {
        let mut bytes = [0u8; 32];
        aws_lc_rs::rand::fill(&mut bytes).ok()?;
        Some(Salt(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }
}

impl std::fmt::Debug for Salt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Salt(..)")
    }
}

/// The Secret values to mask, as read from the directory.
#[derive(Default)]
pub struct Masker {
    /// Sorted by secret, then key.
    values: Vec<SecretValue>,
}

struct SecretValue {
    secret: String,
    key: String,
    value: String,
}

/// A params value as shown, and what was masked in it.
#[derive(Debug)]
pub struct Masked {
    /// Compact JSON: `serde_json::to_string` of the params, byte for byte, except the masked
    /// spans (a masked number becomes the placeholder string).
    pub text: String,
    /// Each Secret key masked, with how often (sorted; at most [`MAX_MASKED`] listed).
    pub masked: Vec<MaskedSecret>,
    /// Two keys of one object read the same in `text` (they differ only in how a masked value
    /// is written): the view cannot tell them apart.
    pub ambiguous: bool,
}

impl Masker {
    /// Reads every `<secret>/<key>` file under `dir`. A failure is read once more (the kubelet
    /// may be swapping its `..data` link right then). `Err` says why, naming `dir`: a directory
    /// that cannot be read, more than [`MAX_FILES`] files, a file that cannot be read.
    pub fn load(dir: &Path) -> Result<Masker, String> {
        read(dir).or_else(|_| read(dir))
    }

    /// The values `(secret, key, value)` read elsewhere (shared mode), bounded as files are: at
    /// most [`MAX_FILES`]; a value longer than [`MAX_FILE_BYTES`], or a name no Secret or key
    /// may have, is not used.
    pub fn of(values: Values) -> Result<Masker, String> {
        if values.len() > MAX_FILES {
            return Err(format!(
                "the task names more than {MAX_FILES} Secret keys, the most the proxy reads to mask Secret values: reference fewer Secret keys in the task"
            ));
        }
        let mut values: Vec<SecretValue> = values
            .into_iter()
            .filter(|(secret, key, value)| {
                is_name(secret) && is_name(key) && value.len() <= MAX_FILE_BYTES
            })
            .map(|(secret, key, value)| SecretValue { secret, key, value })
            .collect();
        values.sort_by(|a, b| (&a.secret, &a.key).cmp(&(&b.secret, &b.key)));
        values.dedup_by(|a, b| (&a.secret, &a.key) == (&b.secret, &b.key));
        Ok(Masker { values })
    }

    /// `params` as compact JSON with every value replaced by `<secret:SECRET/KEY:NONCE>`
    /// ([`Masked::ambiguous`] when two keys of one object read the same once masked). `Err`
    /// only when the values cannot be searched for.
    pub fn mask(&self, params: &Value, nonce: &str) -> Result<Masked, String> {
        let longest = longest_text(params).min(MAX_REQUEST_BYTES);
        // A form longer than every string cannot be in one; one longer than a request could
        // not be shown anyway (the call is refused as too large), so it need not be looked for.
        let mut patterns: Vec<String> = Vec::new();
        let mut owners: Vec<usize> = Vec::new();
        let mut numbers: HashMap<&str, usize> = HashMap::new();
        for (owner, sv) in self.values.iter().enumerate() {
            let stripped = sv.value.strip_suffix('\n');
            for value in std::iter::once(sv.value.as_str()).chain(stripped) {
                if value.len() < MIN_BYTES || value.len() > longest {
                    continue;
                }
                numbers.entry(value).or_insert(owner);
                for form in forms(value) {
                    if form.len() <= longest && !patterns.contains(&form) {
                        patterns.push(form);
                        owners.push(owner);
                    }
                }
            }
        }
        let mut walk = Walk {
            finder: None,
            owners,
            numbers,
            placeholders: self
                .values
                .iter()
                .map(|sv| format!("<secret:{}/{}:{nonce}>", sv.secret, sv.key))
                .collect(),
            counts: vec![0; self.values.len()],
            ambiguous: false,
        };
        if !patterns.is_empty() {
            // A contiguous NFA: memory linear in the patterns, the search linear in the text.
            // The longest value wins where values overlap.
            let finder = AhoCorasick::builder()
                .kind(Some(AhoCorasickKind::ContiguousNFA))
                .match_kind(MatchKind::LeftmostLongest)
                .build(&patterns)
                .map_err(|e| format!("the Secret values to mask cannot be searched for ({e})"))?;
            walk.finder = Some(finder);
        }
        let mut text = String::new();
        walk.value(params, &mut text)?;
        let masked = self
            .values
            .iter()
            .zip(&walk.counts)
            .filter(|(_, count)| **count > 0)
            .take(MAX_MASKED)
            .map(|(sv, count)| MaskedSecret {
                secret: sv.secret.clone(),
                key: sv.key.clone(),
                count: *count,
            })
            .collect();
        Ok(Masked {
            text,
            masked,
            ambiguous: walk.ambiguous,
        })
    }
}

/// One masking pass over a params value.
struct Walk<'a> {
    finder: Option<AhoCorasick>,
    /// The value each pattern is a form of.
    owners: Vec<usize>,
    /// A number whose text is one of these is masked whole.
    numbers: HashMap<&'a str, usize>,
    placeholders: Vec<String>,
    counts: Vec<u32>,
    /// Two keys of one object read the same once masked.
    ambiguous: bool,
}

impl Walk<'_> {
    /// Writes `value` as `serde_json::to_string` does (same key order, same escapes), masked.
    fn value(&mut self, value: &Value, out: &mut String) -> Result<(), String> {
        match value {
            Value::String(s) => {
                let masked = self.text(s);
                out.push_str(&json(&masked)?);
            }
            Value::Number(n) => {
                let text = json(n)?;
                match self.numbers.get(text.as_str()) {
                    Some(&owner) => {
                        self.counts[owner] += 1;
                        out.push_str(&json(&self.placeholders[owner])?);
                    }
                    None => out.push_str(&text),
                }
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.value(item, out)?;
                }
                out.push(']');
            }
            Value::Object(map) => {
                let mut keys = HashSet::new();
                out.push('{');
                for (i, (key, item)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let key = self.text(key);
                    out.push_str(&json(&key)?);
                    if !keys.insert(key) {
                        self.ambiguous = true;
                    }
                    out.push(':');
                    self.value(item, out)?;
                }
                out.push('}');
            }
            Value::Null | Value::Bool(_) => out.push_str(&json(value)?),
        }
        Ok(())
    }

    fn text(&mut self, text: &str) -> String {
        let Some(finder) = &self.finder else {
            return text.to_string();
        };
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for m in finder.find_iter(text) {
            let owner = self.owners[m.pattern().as_usize()];
            self.counts[owner] += 1;
            out.push_str(&text[last..m.start()]);
            out.push_str(&self.placeholders[owner]);
            last = m.end();
        }
        out.push_str(&text[last..]);
        out
    }
}

/// `serde_json`'s compact text of one scalar.
fn json(value: &(impl serde::Serialize + ?Sized)) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("its params cannot be written as JSON ({e})"))
}

/// The longest string, key or number text in `value`, in bytes.
fn longest_text(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Number(n) => n.to_string().len(),
        Value::Array(items) => items.iter().map(longest_text).max().unwrap_or(0),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| k.len().max(longest_text(v)))
            .max()
            .unwrap_or(0),
        Value::Null | Value::Bool(_) => 0,
    }
}

fn read(dir: &Path) -> Result<Masker, String> {
    let mut values = Vec::new();
    let mut files = 0;
    for secret in names(dir)? {
        let secret_dir = dir.join(&secret);
        // Through the kubelet's links: a directory per Secret.
        if !std::fs::metadata(&secret_dir).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        for key in names(&secret_dir)? {
            let path = secret_dir.join(&key);
            if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                continue;
            }
            files += 1;
            if files > MAX_FILES {
                return Err(format!(
                    "{} holds more than {MAX_FILES} files, the most the proxy reads to mask Secret values: reference fewer Secret keys in the task",
                    dir.display()
                ));
            }
            if let Some(value) = read_value(&path)? {
                values.push(SecretValue {
                    secret: secret.clone(),
                    key,
                    value,
                });
            }
        }
    }
    Ok(Masker { values })
}

/// The names in `dir`, sorted: those a Secret or key may have (the kubelet's `..data` and
/// timestamped entries are not).
fn names(dir: &Path) -> Result<Vec<String>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "cannot read {} (the Secret values to mask): {e}",
            dir.display()
        )
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if is_name(&name) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Whether `name` may be a Secret's or a key's (the kubelet's `..data` and timestamped entries
/// may not).
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && !name.starts_with("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

/// A file's value: `None` when it cannot be a JSON text's (not UTF-8) or is longer than
/// [`MAX_FILE_BYTES`].
fn read_value(path: &PathBuf) -> Result<Option<String>, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Ok(None);
    }
    Ok(String::from_utf8(bytes).ok())
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    pub(crate) const PASSPHRASE: &str = "open sesame 4711";

    /// A directory laid out as the kubelet writes a projected volume: `..data/<secret>/<key>`,
    /// and `<secret>` linked to `..data/<secret>`.
    pub(crate) fn mask_dir(files: &[(&str, &str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let data = dir.path().join("..2026_11_27_05_00_00.123");
        for (secret, key, value) in files {
            std::fs::create_dir_all(data.join(secret)).expect("a secret directory");
            std::fs::write(data.join(secret).join(key), value).expect("a key file");
            let link = dir.path().join(secret);
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(format!("..data/{secret}"), link).expect("a link");
            }
        }
        std::os::unix::fs::symlink(data.file_name().expect("a name"), dir.path().join("..data"))
            .expect("the ..data link");
        dir
    }

    fn masked(masker: &Masker, params: &Value) -> (String, Vec<MaskedSecret>) {
        let m = masker.mask(params, "abc123").expect("masked");
        (m.text, m.masked)
    }

    #[test]
    fn every_occurrence_is_replaced_in_place_and_nothing_else() {
        let dir = mask_dir(&[
            ("deploy", "passphrase", PASSPHRASE),
            ("deploy", "short", "abc"),
        ]);
        let masker = Masker::load(dir.path()).expect("loaded");
        assert_eq!(masker.values.len(), 2);
        let long = format!("{PASSPHRASE}{}", " and more".repeat(340));
        assert!(long.len() >= 3000);
        // Not a secret of the task, though shaped like a credential: shown as is.
        let token = "ghp_0123456789abcdefghijklmnopqrstuvwxyz";
        let params = json!({
            "name": "deploy",
            "arguments": {
                "message": long,
                "nested": [1, ["x", {"deep": format!("say {PASSPHRASE}!")}]],
                "config": format!("{{\"pass\":\"{PASSPHRASE}\"}}"),
                PASSPHRASE: "as a key",
                "token": token,
                "abc": "abc"
            }
        });
        let plain = serde_json::to_string(&params).expect("JSON");
        let (shown, legend) = masked(&masker, &params);
        let placeholder = "<secret:deploy/passphrase:abc123>";
        // Byte for byte, except the masked spans.
        assert_eq!(shown, plain.replace(PASSPHRASE, placeholder));
        assert_eq!(shown.matches(placeholder).count(), 4);
        assert!(!shown.contains(PASSPHRASE));
        assert!(shown.contains(token) && shown.contains(r#""abc":"abc""#));
        assert!(shown.len() > 3000, "the long string is shown whole");
        assert_eq!(
            legend,
            vec![MaskedSecret {
                secret: "deploy".into(),
                key: "passphrase".into(),
                count: 4
            }]
        );
        // Nothing to mask: the same text.
        let other = json!({"name": "echo", "arguments": {"message": "hello"}});
        let (shown, legend) = masked(&masker, &other);
        assert_eq!(shown, serde_json::to_string(&other).expect("JSON"));
        assert!(legend.is_empty());
    }

    #[test]
    fn escaped_forms_numbers_and_a_trailing_newline_are_masked_too() {
        let dir = mask_dir(&[
            ("db", "password", "pä\"ss wörd\n"),
            ("db", "pin", "12345678"),
        ]);
        let masker = Masker::load(dir.path()).expect("loaded");
        let params = json!({
            "name": "q",
            "arguments": {
                "raw": "pä\"ss wörd",
                "json": r#"{"p": "pä\"ss wörd"}"#,
                "python": r#"{"p": "p\u00e4\"ss w\u00f6rd"}"#,
                "pin": 12345678,
                "pins": [12345678.5, 123456789, "12345678"]
            }
        });
        let (shown, legend) = masked(&masker, &params);
        let value: Value = serde_json::from_str(&shown).expect("still JSON");
        let pw = "<secret:db/password:abc123>";
        let pin = "<secret:db/pin:abc123>";
        assert_eq!(
            value["arguments"],
            json!({
                "raw": pw,
                "json": format!("{{\"p\": \"{pw}\"}}"),
                "python": format!("{{\"p\": \"{pw}\"}}"),
                "pin": pin,
                "pins": [12345678.5, 123456789, pin]
            })
        );
        let counts: Vec<_> = legend.iter().map(|m| (m.key.as_str(), m.count)).collect();
        assert_eq!(counts, [("password", 3), ("pin", 2)]);
    }

    #[test]
    fn keys_that_would_read_the_same_once_masked_make_the_view_ambiguous() {
        let dir = mask_dir(&[("s", "k", "x\"yz")]);
        let masker = Masker::load(dir.path()).expect("loaded");
        let params = json!({"arguments": {"a x\"yz": 1, "a x\\\"yz": 2}});
        assert!(masker.mask(&params, "abc123").expect("masked").ambiguous);
        let other = json!({"arguments": {"a x\"yz": 1, "b": 2}});
        assert!(!masker.mask(&other, "abc123").expect("masked").ambiguous);
    }

    #[test]
    fn values_read_elsewhere_are_bounded_as_files_are() {
        let value = |s: &str, k: &str, v: &str| (s.to_string(), k.to_string(), v.to_string());
        let masker = Masker::of(vec![
            value("deploy", "passphrase", PASSPHRASE),
            value("deploy", "passphrase", PASSPHRASE),
            value("..data", "k", "hidden value"),
            value("big", "k", &"x".repeat(MAX_FILE_BYTES + 1)),
        ])
        .expect("values");
        assert_eq!(masker.values.len(), 1);
        let m = masker
            .mask(&json!({"arguments": {"m": PASSPHRASE}}), "abc123")
            .expect("masked");
        assert_eq!(
            m.text,
            r#"{"arguments":{"m":"<secret:deploy/passphrase:abc123>"}}"#
        );
        let many = (0..=MAX_FILES)
            .map(|i| value("s", &format!("k{i}"), "s3cr3t-v4lue"))
            .collect();
        let refused = Masker::of(many).err().unwrap_or_default();
        assert!(refused.contains("more than 256"), "{refused}");
        assert!(!refused.contains("s3cr3t"), "{refused}");
    }

    #[test]
    fn the_directory_is_bounded_and_its_failures_name_it() {
        let missing = Masker::load(Path::new("/nonexistent/mask")).err();
        assert!(
            missing
                .as_deref()
                .is_some_and(|e| e.contains("/nonexistent/mask")),
            "{missing:?}"
        );
        // A value too long to be shown is not read; one that is not text cannot be in JSON.
        let big = "x".repeat(MAX_FILE_BYTES + 1);
        let dir = mask_dir(&[("a", "big", &big), ("a", "ok", "okay")]);
        std::fs::write(dir.path().join("a").join("bin"), [0xff, 0xfe, 0xfd, 0xfc]).expect("a file");
        assert_eq!(Masker::load(dir.path()).expect("loaded").values.len(), 1);
        let many: Vec<(String, String)> = (0..=MAX_FILES)
            .map(|i| (format!("s{}", i / 100), format!("k{i}")))
            .collect();
        let files: Vec<(&str, &str, &str)> = many
            .iter()
            .map(|(s, k)| (s.as_str(), k.as_str(), "s3cr3t-v4lue"))
            .collect();
        let dir = mask_dir(&files);
        let refused = Masker::load(dir.path()).err().unwrap_or_default();
        assert!(refused.contains("more than 256 files"), "{refused}");
        assert!(!refused.contains("s3cr3t"), "{refused}");
    }
}
