//! What the reconciler reads of the world, kept between reconciles as a few facts per object
//! (not the objects): the ground every step stands on. Filled from the watches (`lib.rs`); read
//! through the [`Index`]es in `context::Context`.
//!
//! The children, in the order they may import each other (each uses only those before it):
//! `cached_job` (the Job as read), `job_state` (its phase, as the Job says), `children` (the
//! [`Index`] and its watch, and the facts of the task's Job and ConfigMap), `lease` (what the
//! task's proxy reports on its Lease), `decision` (a ToolApproval), `shared` (a shared task's
//! ConfigMap in the shared proxy's namespace); `observed` (what one reconcile starts from).

pub mod cached_job;
pub mod children;
pub mod decision;
pub mod job_state;
pub mod lease;
pub mod observed;
pub mod shared;

pub use cached_job::CachedJob;
pub use children::{ConfigMapFacts, Index, JobFacts};
pub use decision::DecisionFacts;
pub use job_state::JobState;
pub use lease::LeaseFacts;
pub use observed::Observed;
pub use shared::SharedFacts;
