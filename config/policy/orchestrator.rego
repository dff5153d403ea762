# An example policy for the proxy's external decision point (docs/proxy-config.md, "Decision
# point"): Open Policy Agent serves it, the proxy POSTs each call as `input` to
#   http://<opa>:8181/v1/data/orchestrator/decision
# and forwards the call only when `decision.allow` is true; `decision.reason` is what the agent
# and the audit read when it is not.
#
# input: {"tool": {"name", "server", "class", "annotations"}, "server", "args",
#         "task": {"name", "namespace", "uid", "createdBy", "labels", "contextVersion"},
#         "time": RFC 3339}
package orchestrator

import rego.v1

# git push only to branches named agent/*.
deny contains msg if {
	input.tool.name == "git_push"
	not startswith(object.get(input.args, "branch", ""), "agent/")
	msg := sprintf("git push to %q: only branches named agent/* may be pushed", [object.get(input.args, "branch", "")])
}

# The filesystem server writes only under /workspace/src.
deny contains msg if {
	input.server == "filesystem"
	input.tool.class != "read"
	not startswith(object.get(input.args, "path", ""), "/workspace/src/")
	msg := sprintf("filesystem writes only under /workspace/src, not %q", [object.get(input.args, "path", "")])
}

# Issue comments under 2,000 characters.
deny contains msg if {
	contains(input.tool.name, "comment")
	count(object.get(input.args, "body", "")) >= 2000
	msg := "comments must be under 2,000 characters"
}

# GitHub writes only in the task's own repository (its label orchestrator.io/repository).
deny contains msg if {
	input.server == "github"
	input.tool.class != "read"
	own := object.get(input.task.labels, "orchestrator.io/repository", "")
	sprintf("%s/%s", [object.get(input.args, "owner", ""), object.get(input.args, "repo", "")]) != own
	msg := sprintf("github writes only in the task's repository %q", [own])
}

# No writes after 18:00 in the task's office hours' zone, for tasks labelled with one
# (orchestrator.io/office-hours: Europe/Berlin). With the proxy's own requireApproval, or a CEL
# condition of effect requireApproval, a person could approve them instead.
deny contains msg if {
	input.tool.class != "read"
	zone := input.task.labels["orchestrator.io/office-hours"]
	[hour, _, _] := time.clock([time.parse_rfc3339_ns(input.time), zone])
	hour >= 18
	msg := sprintf("no writes after 18:00 (%s)", [zone])
}

decision := {"allow": count(deny) == 0, "reason": concat("; ", sort(deny))}
