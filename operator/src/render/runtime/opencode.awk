# The `--format json` events of OpenCode, one object a line: the last text part is the answer, each
# step_finish is a turn whose tokens and cost add up, and an error event makes the run an error.
# (Its events carry the time they were written, not when their step ran: no duration.)
{
  if (!parse($0)) next
  t = V["type"]
  if (sid == "" && isstr(V["sessionID"])) sid = V["sessionID"]
  if (t == "\"text\"" && isstr(V["part" SUBSEP "text"])) answer = V["part" SUBSEP "text"]
  else if (t == "\"step_finish\"") {
    turns++
    input += whole(V["part" SUBSEP "tokens" SUBSEP "input"])
    output += whole(V["part" SUBSEP "tokens" SUBSEP "output"]) + whole(V["part" SUBSEP "tokens" SUBSEP "reasoning"])
    read += whole(V["part" SUBSEP "tokens" SUBSEP "cache" SUBSEP "read"])
    written += whole(V["part" SUBSEP "tokens" SUBSEP "cache" SUBSEP "write"])
    c = V["part" SUBSEP "cost"]
    if (c ~ /^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/) { cost += c; priced = 1 }
  } else if (t == "\"error\"") {
    failed = 1
    if (isstr(V["error" SUBSEP "data" SUBSEP "message"])) problem = V["error" SUBSEP "data" SUBSEP "message"]
    else if (isstr(V["error" SUBSEP "name"])) problem = V["error" SUBSEP "name"]
  }
}
END {
  if (!turns && !failed) noresult("OpenCode")
  if (answer == "") answer = problem
  if (answer != "") say(answer)
  add("subtype", failed || code != 0 ? "\"error_during_execution\"" : "\"success\"")
  add("isError", failed || code != 0 ? "true" : "false")
  add("turns", number(turns))
  add("inputTokens", number(input))
  add("outputTokens", number(output))
  add("cacheReadInputTokens", number(read))
  add("cacheCreationInputTokens", number(written))
  if (priced) { c = sprintf("%.9f", cost); sub(/0+$/, "", c); sub(/\.$/, "", c); add("costUsd", c) }
  if (sid != "") add("sessionId", clip(sid, 256))
  finish(answer)
}
