//! Newtypes for the three kinds of names the proxy juggles, so an upstream tool name can never be
//! passed where an exposed one is expected (or the other way round).

use std::{borrow::Borrow, fmt, sync::Arc};

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(name: impl Into<Arc<str>>) -> Self {
                Self(name.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}

name_type!(
    /// The name of an upstream server as configured (`servers[].name`).
    ServerName
);
name_type!(
    /// A tool name as the upstream server knows it.
    ToolName
);
name_type!(
    /// A tool name as the proxy's clients see it (`<server>__<tool>`, or the tool name as is).
    ExposedToolName
);

/// The most of a client-given name (tool, prompt, URI, client name) that goes into a log line,
/// an audit record, an error message or a span.
pub const MAX_NAME_IN_LOGS: usize = 128;

/// `name`, cut to [`MAX_NAME_IN_LOGS`] bytes (at a character boundary) with a note of how much
/// was left out: a client cannot make a log line or an audit record as long as it likes.
pub fn clip(name: &str) -> std::borrow::Cow<'_, str> {
    clip_to(name, MAX_NAME_IN_LOGS)
}

/// `text`, cut to `max` bytes (at a character boundary) with a note of how much was left out.
pub fn clip_to(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…(+{} bytes)", &text[..end], text.len() - end).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_clipped_at_a_character_boundary() {
        assert_eq!(clip("gh__create_issue"), "gh__create_issue");
        let long = "é".repeat(100);
        let clipped = clip(&long);
        assert!(clipped.starts_with(&"é".repeat(64)));
        assert!(clipped.ends_with("…(+72 bytes)"), "{clipped}");
    }
}
