//! Per-call policy beyond the tool patterns and `maxRisk` (which the router applies): tool
//! definition hashes and their changes ([`definitions`]), rate limits ([`limits`]), argument
//! validation against a tool's input schema ([`arguments`], within a [`budget`]), and
//! [`refusal::Refusal`], what every step of the call path refuses with.

pub mod arguments;
pub mod budget;
pub mod definitions;
pub mod limits;
pub mod refusal;
