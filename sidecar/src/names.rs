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
