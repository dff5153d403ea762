//! The steps of a reconcile of an unfinished (or changed) TaskRun, which `run_steps` (`mod.rs`)
//! takes in turn.
//!
//! The children, in the order they may import each other (each uses only those before it):
//! `observe` (the TaskRun, its recorded status and its Job), `status_write` (the status),
//! `config` (the ConfigMap: prepared, checked, applied), `refuse` (which placement, render, or
//! say why not: also a name taken, a config too large, a missing input), `history`
//! (`status.contextHistory`), `job` (the pod's identity and the Job; its TTL).

pub mod config;
pub mod history;
pub mod job;
pub mod observe;
pub mod refuse;
pub mod status_write;
