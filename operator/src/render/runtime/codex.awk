# The `--json` events of Codex, one object a line: the last agent message is the answer, the usage
# of each completed turn adds up (input_tokens counts the cached ones too), and a failed turn or
# an error event makes the run an error.
{
  if (!parse($0)) next
  t = V["type"]
  if (t == "\"thread.started\"" && isstr(V["thread_id"])) sid = V["thread_id"]
  else if (t == "\"item.completed\"" && V["item" SUBSEP "type"] == "\"agent_message\"" && isstr(V["item" SUBSEP "text"])) answer = V["item" SUBSEP "text"]
  else if (t == "\"turn.completed\"") {
    turns++; done = 1
    input += whole(V["usage" SUBSEP "input_tokens"]); cached += whole(V["usage" SUBSEP "cached_input_tokens"])
    written += whole(V["usage" SUBSEP "cache_write_input_tokens"]); output += whole(V["usage" SUBSEP "output_tokens"])
  } else if (t == "\"turn.failed\"") {
    turns++; failed = 1
    if (isstr(V["error" SUBSEP "message"])) problem = V["error" SUBSEP "message"]
  } else if (t == "\"error\"") {
    failed = 1
    if (isstr(V["message"])) problem = V["message"]
  }
}
END {
  if (!done && !failed) noresult("Codex")
  if (answer == "") answer = problem
  if (answer != "") say(answer)
  add("subtype", failed || code != 0 ? "\"error_during_execution\"" : "\"success\"")
  add("isError", failed || code != 0 ? "true" : "false")
  add("turns", turns)
  add("inputTokens", number(input > cached ? input - cached : 0))
  add("outputTokens", number(output))
  add("cacheReadInputTokens", number(cached))
  add("cacheCreationInputTokens", number(written))
  if (sid != "") add("sessionId", clip(sid, 256))
  finish(answer)
}
