//! Tool filtering. The glob semantics (deny wins, an empty allow list allows all, a disabled
//! server allows nothing, verdicts that name their rule) live in `orchestrator_crds::tools`, so
//! the sidecar that enforces them, the operator that reports effective tools and the CLI that
//! computes add-context changes share one implementation.

pub use orchestrator_crds::tools::{
    PatternError, Risk, Rule, RuleDisplay, ToolFilter, Verdict, has_glob_syntax,
};
