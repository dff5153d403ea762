//! What a zoned server (`stdio.socket`: its process runs in its own container) may say: an
//! absolute socket path that fits a socket address, and none of what belongs to that container.

use orchestrator_crds::proxy::StdioSpec;

use super::{Code, Problem};

/// The longest path a unix socket address holds (`sun_path`, without its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// A zoned server (`socket`): an absolute path that fits a socket address, and none of what
/// belongs to the zone's container.
pub(super) fn check_socket(stdio: &StdioSpec, at: &str, problems: &mut Vec<Problem>) {
    let Some(socket) = &stdio.socket else { return };
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
                    "`{field}` cannot be combined with `socket`: the server runs in its own \
                     container, which gives it {what}; set it on that container, or remove \
                     `socket` to run the server as the proxy's child"
                ),
            ));
        }
    }
}
