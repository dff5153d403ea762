//! Per-call policy beyond the tool patterns and `maxRisk` (which the router applies): tool
//! definition hashes and their changes ([`definitions`]), rate limits ([`limits`]) and argument
//! validation against a tool's input schema ([`arguments`]).

pub mod arguments;
pub mod budget;
pub mod definitions;
pub mod limits;
