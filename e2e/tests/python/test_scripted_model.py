"""The model stand-in reads which MCP tools Claude Code makes available to the model from the
notes Claude Code writes into the conversation. The notes below are copied from requests Claude
Code 2.1.x sent to the stand-in (a tool enabled, disabled, then enabled again through the proxy);
if the stand-in misreads them, the story waits for a tool that was offered long ago."""

from scripted_model import Recorded

GET_ENV = "mcp__orchestrator__everything__get-env"
GET_SUM = "mcp__orchestrator__everything__get-sum"

ADDED = (
    "The following deferred tools are now available via ToolSearch. Their schemas are NOT loaded "
    "\u2014 calling them directly will fail with InputValidationError. Use ToolSearch with query "
    '"select:<name>[,<name>...]" to load tool schemas before calling them:\n' + GET_ENV
)
REMOVED = (
    "The following deferred tools are no longer available. Do not search for them \u2014 "
    "ToolSearch will return no match:\n" + GET_ENV + "\n\nThis is ambient context \u2014 do not "
    "narrate it to the user."
)
AGAIN = (
    "1 deferred tool is available again in this session (announced earlier in this "
    f"conversation): {GET_ENV}. Load via ToolSearch as before."
)


def request(*notes: str) -> Recorded:
    first = "The following deferred tools are now available via ToolSearch:\n" + GET_SUM
    messages = [{"role": "user", "content": "loop"}, {"role": "system", "content": first}]
    for note in notes:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "working"}]})
        messages.append({"role": "system", "content": note})
    return Recorded(seq=1, at=0.0, wall=0.0, path="/v1/messages", headers={}, body={"tools": [{"name": "ToolSearch"}], "messages": messages})


def test_tools_named_in_claude_codes_notes_follow_enable_disable_and_enable_again():
    assert request().mcp_tools() == ["everything__get-sum"]
    assert request(ADDED).mcp_tools() == ["everything__get-env", "everything__get-sum"]
    assert request(ADDED, REMOVED).mcp_tools() == ["everything__get-sum"]
    assert request(ADDED, REMOVED, AGAIN).mcp_tools() == ["everything__get-env", "everything__get-sum"]
    assert request(ADDED, REMOVED, AGAIN, REMOVED).mcp_tools() == ["everything__get-sum"]
    # Tools in `tools` count too; other servers' tools are not this server's.
    assert "ToolSearch" in request().available()
    assert request(ADDED).mcp_tools("other") == []
