//! Placeholder: defined by the issue that owns it.
