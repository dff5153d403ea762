//! How a task ends, besides running to its outcome: a cancel, and what follows a recorded
//! outcome (the Job's TTL, the TaskRun's retention, the leftovers of a shared task).
//!
//! The children, in the order they may import each other (each uses only those before it):
//! `retention` (a finished TaskRun deleted: after its retention, over a namespace's maximum, a
//! shared ConfigMap with no TaskRun), `cancel` (a cancelled task: its Job deleted, its outcome
//! recorded), `finished` (a task whose outcome is recorded).

pub mod cancel;
pub mod finished;
pub mod retention;
