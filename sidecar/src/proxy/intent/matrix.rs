//! The two-key check of intent mode (the validation matrix of reference design 001): the
//! `call_tool_*` variant called and the declared `intent.operation_type` must agree (key one
//! against key two), and the variant must be at least what the tool's server says the tool is.
//! Pure functions of the call and its route.

use std::fmt;

use orchestrator_crds::proxy::Risk;

use crate::router::{Hints, Route};

/// The three call tools, in order of risk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    Read,
    Write,
    Destructive,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Read, Variant::Write, Variant::Destructive];

    /// The tool's name in `tools/list`.
    pub fn tool(self) -> &'static str {
        match self {
            Variant::Read => "call_tool_read",
            Variant::Write => "call_tool_write",
            Variant::Destructive => "call_tool_destructive",
        }
    }

    /// The `intent.operation_type` it takes.
    pub fn operation(self) -> &'static str {
        self.risk().as_str()
    }

    pub fn risk(self) -> Risk {
        match self {
            Variant::Read => Risk::Read,
            Variant::Write => Risk::Write,
            Variant::Destructive => Risk::Destructive,
        }
    }

    /// The variant a tool of this class is called with (`retrieve_tools`' `call_with`).
    pub fn for_risk(risk: Risk) -> Variant {
        match risk {
            Risk::Read => Variant::Read,
            Risk::Write => Variant::Write,
            Risk::Destructive => Variant::Destructive,
        }
    }

    /// The variant named `name` in `tools/list`, if it is one.
    pub fn of_tool(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.tool() == name)
    }

    /// The variant whose `intent.operation_type` is `operation`, if it is one.
    pub fn of_operation(operation: &str) -> Option<Variant> {
        Variant::ALL
            .into_iter()
            .find(|v| v.operation() == operation)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tool())
    }
}

/// What the tool's server says the tool is, and where it says it: the proxy's one class of the
/// tool (`Server::risk_of`, which `maxRisk`, `requireApproval` and `GET /tools` use too), with
/// its source. A tool its server does not mark read-only is write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Said {
    /// A `risk` entry of the catalog or the TaskRun names the tool's class: it counts as the
    /// server's word, whatever the annotations say.
    Override(Risk),
    /// `destructiveHint: true` (also with `readOnlyHint: true`: the more restrictive wins).
    Destructive,
    /// `readOnlyHint: true`.
    ReadOnly,
    /// `readOnlyHint: false`: the server says the tool changes something.
    NotReadOnly,
    /// No annotation says it only reads (none at all, or `destructiveHint: false` alone): the
    /// proxy classes it write, whatever the agent declares.
    Unannotated,
}

impl Said {
    /// The server's word on a routed tool.
    pub fn of(route: &Route) -> Said {
        Said::from_parts(
            route.server.risk.get(route.tool.as_str()).copied(),
            route.hints,
        )
    }

    pub fn from_parts(risk_override: Option<Risk>, hints: Hints) -> Said {
        if let Some(risk) = risk_override {
            return Said::Override(risk);
        }
        match (hints.read_only, hints.destructive) {
            (_, Some(true)) => Said::Destructive,
            (Some(true), _) => Said::ReadOnly,
            (Some(false), _) => Said::NotReadOnly,
            // `destructiveHint: false` alone says nothing about reading only.
            _ => Said::Unannotated,
        }
    }

    /// The class the server's word gives the tool.
    pub fn risk(self) -> Risk {
        match self {
            Said::Override(risk) => risk,
            Said::Destructive => Risk::Destructive,
            Said::ReadOnly => Risk::Read,
            Said::NotReadOnly | Said::Unannotated => Risk::Write,
        }
    }

    /// Where the word comes from, as the config path or annotation a user can find it at.
    pub fn source(self, server: &str, tool: &str) -> String {
        match self {
            Said::Override(risk) => format!("servers[{server}].risk[{tool:?}] \"{risk}\""),
            Said::Destructive => format!("servers[{server}]: {tool:?} has destructiveHint: true"),
            Said::ReadOnly => format!("servers[{server}]: {tool:?} has readOnlyHint: true"),
            Said::NotReadOnly => format!("servers[{server}]: {tool:?} has readOnlyHint: false"),
            Said::Unannotated => format!(
                "servers[{server}]: {tool:?} has no readOnlyHint: true, so the proxy classes it write"
            ),
        }
    }
}

/// Why the matrix refuses a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmatched {
    /// No `intent.operation_type`.
    Required,
    /// `intent.operation_type` is another variant's.
    Mismatch { declared: Variant },
    /// The server's word puts the tool above the variant called.
    Server { said: Said },
}

/// Key one against key two: the declared operation must be the variant's own.
pub fn check_declared(variant: Variant, declared: Option<Variant>) -> Result<(), Unmatched> {
    match declared {
        None => Err(Unmatched::Required),
        Some(declared) if declared != variant => Err(Unmatched::Mismatch { declared }),
        Some(_) => Ok(()),
    }
}

/// The variant against the server's word: a riskier variant than the tool needs is accepted
/// (overly cautious), a less risky one is refused. A tool its server does not mark read-only is
/// write: it is not called through `call_tool_read`, whatever the agent declares.
pub fn check_server(variant: Variant, said: Said) -> Result<(), Unmatched> {
    if variant.risk() < said.risk() {
        return Err(Unmatched::Server { said });
    }
    Ok(())
}

/// The whole matrix, in the order the proxy applies it (the proxy applies the second half once
/// the tool's route is known, so the tests check the two together here).
#[cfg(test)]
pub fn check(variant: Variant, declared: Option<Variant>, said: Said) -> Result<(), Unmatched> {
    check_declared(variant, declared)?;
    check_server(variant, said)
}

#[cfg(test)]
mod tests {
    use super::*;

    use Variant::{Destructive, Read, Write};

    fn hints(read_only: Option<bool>, destructive: Option<bool>) -> Said {
        Said::from_parts(
            None,
            Hints {
                read_only,
                destructive,
            },
        )
    }

    const NOTHING: Said = Said::Unannotated;
    const READ_ONLY: Said = Said::ReadOnly;
    const DESTRUCTIVE: Said = Said::Destructive;

    #[test]
    fn annotations_and_overrides_are_the_servers_word() {
        assert_eq!(hints(None, None), NOTHING);
        assert_eq!(hints(None, Some(false)), NOTHING);
        assert_eq!(hints(Some(true), None), READ_ONLY);
        assert_eq!(hints(Some(true), Some(false)), READ_ONLY);
        assert_eq!(hints(Some(false), None), Said::NotReadOnly);
        assert_eq!(hints(None, Some(true)), DESTRUCTIVE);
        assert_eq!(
            hints(Some(true), Some(true)),
            DESTRUCTIVE,
            "the more restrictive wins"
        );
        let overridden = Said::from_parts(
            Some(Risk::Read),
            Hints {
                read_only: Some(false),
                destructive: Some(true),
            },
        );
        assert_eq!(overridden, Said::Override(Risk::Read));
    }

    /// The matrix of docs/design/approval-and-intent.md, row by row.
    #[test]
    fn the_validation_matrix_row_by_row() {
        // read | read | readOnly -> forwarded; nothing -> refused: the proxy classes an
        // unannotated tool write (the reference design trusted the agent here)
        assert_eq!(
            check(Read, Some(Read), NOTHING),
            Err(Unmatched::Server { said: NOTHING })
        );
        assert_eq!(check(Read, Some(Read), READ_ONLY), Ok(()));
        // read | write or destructive | any -> intent mismatch
        for said in [NOTHING, READ_ONLY, DESTRUCTIVE] {
            for declared in [Write, Destructive] {
                assert_eq!(
                    check(Read, Some(declared), said),
                    Err(Unmatched::Mismatch { declared })
                );
            }
        }
        // any | missing | any -> intent required
        for variant in Variant::ALL {
            for said in [NOTHING, READ_ONLY, DESTRUCTIVE] {
                assert_eq!(check(variant, None, said), Err(Unmatched::Required));
            }
        }
        // read or write | matching | destructiveHint, or class destructive by override -> refused
        for variant in [Read, Write] {
            assert_eq!(
                check(variant, Some(variant), DESTRUCTIVE),
                Err(Unmatched::Server {
                    said: Said::Destructive
                })
            );
            let by_override = Said::Override(Risk::Destructive);
            assert_eq!(
                check(variant, Some(variant), by_override),
                Err(Unmatched::Server {
                    said: Said::Override(Risk::Destructive)
                })
            );
        }
        // destructive | destructive | readOnly -> forwarded (overly cautious is allowed)
        assert_eq!(check(Destructive, Some(Destructive), READ_ONLY), Ok(()));
        // write or destructive | matching | no annotations -> forwarded (write is the class)
        for variant in [Write, Destructive] {
            assert_eq!(check(variant, Some(variant), NOTHING), Ok(()));
        }
        // The reference's other rows: write on readOnly is allowed; the other mismatches.
        assert_eq!(check(Write, Some(Write), READ_ONLY), Ok(()));
        assert_eq!(
            check(Write, Some(Destructive), NOTHING),
            Err(Unmatched::Mismatch {
                declared: Destructive
            })
        );
        assert_eq!(
            check(Destructive, Some(Read), DESTRUCTIVE),
            Err(Unmatched::Mismatch { declared: Read })
        );
        assert_eq!(check(Destructive, Some(Destructive), DESTRUCTIVE), Ok(()));
    }

    /// Beyond the matrix: a server that says the tool writes (`readOnlyHint: false`, or an
    /// override `write`) is refused through call_tool_read, which a client may auto-approve.
    #[test]
    fn a_tool_the_server_says_writes_is_not_called_as_a_read() {
        let writes = Said::NotReadOnly;
        assert_eq!(
            check(Read, Some(Read), writes),
            Err(Unmatched::Server {
                said: Said::NotReadOnly
            })
        );
        assert_eq!(check(Write, Some(Write), writes), Ok(()));
        let overridden = Said::Override(Risk::Write);
        assert!(check(Read, Some(Read), overridden).is_err());
        assert_eq!(check(Write, Some(Write), overridden), Ok(()));
        // An override down to read lets a destructiveHint tool be called as a read.
        assert_eq!(check(Read, Some(Read), Said::Override(Risk::Read)), Ok(()));
    }

    #[test]
    fn names_and_operations_round_trip() {
        for v in Variant::ALL {
            assert_eq!(Variant::of_tool(v.tool()), Some(v));
            assert_eq!(Variant::of_operation(v.operation()), Some(v));
            assert_eq!(Variant::for_risk(v.risk()), v);
        }
        assert_eq!(Variant::of_tool("call_tool"), None);
        assert_eq!(Variant::of_operation("delete"), None);
        assert_eq!(
            Said::Override(Risk::Destructive).source("fs", "move_file"),
            "servers[fs].risk[\"move_file\"] \"destructive\""
        );
    }
}
