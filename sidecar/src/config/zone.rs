//! What a zoned server (its process runs in its own container) may say: reached over a unix
//! socket (`stdio.socket`: an absolute path that fits a socket address, with `stdio.zoneUid`, the
//! uid the proxy holds the zone to) or over TCP in shared mode (`stdio.zonePort` with
//! `stdio.zoneKey`), not both, and none of what belongs to that container.

use orchestrator_crds::proxy::StdioSpec;

use super::{Code, Problem};

/// The longest path a unix socket address holds (`sun_path`, without its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// A zoned server (`socket`, or `zonePort` with `zoneKey`): one way to reach its zone, and none
/// of what belongs to the zone's container.
pub(super) fn check_socket(stdio: &StdioSpec, at: &str, problems: &mut Vec<Problem>) {
    match (&stdio.socket, stdio.zone_uid) {
        (Some(_), None) => problems.push(Problem::new(
            Code::SocketConflict,
            format!("{at}.zoneUid"),
            "`socket` needs `zoneUid`, the uid the server's zone runs as: the proxy starts the \
             server only in a zone of that uid (its socket's owner, and the peer on it)"
                .to_string(),
        )),
        (None, Some(_)) => problems.push(Problem::new(
            Code::SocketConflict,
            format!("{at}.zoneUid"),
            "`zoneUid` without `socket`: it is the uid of the zone behind `socket`; name the \
             socket, or remove `zoneUid`"
                .to_string(),
        )),
        _ => {}
    }
    let by = match (&stdio.socket, stdio.zone_port) {
        (None, None) => {
            if stdio.zone_key.is_some() {
                problems.push(Problem::new(
                    Code::SocketConflict,
                    format!("{at}.zoneKey"),
                    "`zoneKey` without `zonePort`: name the port the server's zone listens on, \
                     or remove `zoneKey`"
                        .to_string(),
                ));
            }
            return;
        }
        (Some(_), Some(_)) => {
            problems.push(Problem::new(
                Code::SocketConflict,
                format!("{at}.zonePort"),
                "`zonePort` cannot be combined with `socket`: a zone is reached either over its \
                 unix socket (sidecar mode) or over TCP (shared mode); remove one"
                    .to_string(),
            ));
            "socket"
        }
        (None, Some(port)) => {
            if port == 0 {
                problems.push(Problem::new(
                    Code::BadPath,
                    format!("{at}.zonePort"),
                    "0 is not a port; name the port the zone listens on (`zone --listen`)"
                        .to_string(),
                ));
            }
            if stdio.zone_key.is_none() {
                problems.push(Problem::new(
                    Code::SocketConflict,
                    format!("{at}.zoneKey"),
                    "`zonePort` needs `zoneKey` (the task's Secret key holding the zone's key): \
                     the proxy must prove the key to the zone"
                        .to_string(),
                ));
            }
            "zonePort"
        }
        (Some(socket), None) => {
            check_path(socket, at, problems);
            "socket"
        }
    };
    let local = [
        ("env", !stdio.env.is_empty(), "its environment"),
        (
            "passEnv",
            !stdio.pass_env.is_empty(),
            "its environment and Secrets",
        ),
        ("cwd", stdio.cwd.is_some(), "its working directory"),
    ];
    for (field, set, what) in local {
        if set {
            problems.push(Problem::new(
                Code::SocketConflict,
                format!("{at}.{field}"),
                format!(
                    "`{field}` cannot be combined with `{by}`: the server runs in its own \
                     container, which gives it {what}; set it on that container, or remove \
                     `{by}` to run the server as the proxy's child"
                ),
            ));
        }
    }
}

/// A zone's socket path: absolute, and short enough for a socket address.
fn check_path(socket: &str, at: &str, problems: &mut Vec<Problem>) {
    if !socket.starts_with('/') {
        problems.push(Problem::new(
            Code::BadPath,
            format!("{at}.socket"),
            format!(
                "{socket:?} is not an absolute path; name the socket on the volume the proxy shares \
                 with the server's container, e.g. /run/orchestrator/zones/<server>/mcp.sock"
            ),
        ));
    } else if socket.len() > MAX_SOCKET_PATH {
        problems.push(Problem::new(
            Code::BadPath,
            format!("{at}.socket"),
            format!(
                "{} bytes long; a unix socket path holds at most {MAX_SOCKET_PATH}: use a shorter \
                 directory",
                socket.len()
            ),
        ));
    }
}
