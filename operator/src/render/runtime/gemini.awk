# The `-o json` result of Gemini CLI, one object: `response` is the answer, the tokens of every
# model it used add up (`input` is the uncached prompt; thoughts are output), turns are the
# requests of the main role, and `error` (or exit code 53, its turn limit) makes the run an error.
{ all = all $0 "\n" }
END {
  if (!parse(all) || !(("response" in V) || ("session_id" in V) || (("error", "message") in V))) noresult("Gemini CLI")
  for (k in V) {
    m = split(k, K, SUBSEP)
    if (K[1] != "stats" || K[2] != "models") continue
    if (m == 5 && K[4] == "tokens") {
      if (K[5] == "input") input += whole(V[k])
      else if (K[5] == "cached") cached += whole(V[k])
      else if (K[5] == "candidates" || K[5] == "thoughts") output += whole(V[k])
    } else if (m == 6 && K[4] == "roles" && K[5] == "main" && K[6] == "totalRequests") turns += whole(V[k])
  }
  failed = (("error", "message") in V) || (("error", "type") in V)
  answer = isstr(V["response"]) ? V["response"] : ""
  if (answer == "" && isstr(V["error" SUBSEP "message"])) answer = V["error" SUBSEP "message"]
  if (answer != "") say(answer)
  add("subtype", code == 53 ? "\"error_max_turns\"" : failed || code != 0 ? "\"error_during_execution\"" : "\"success\"")
  add("isError", failed || code != 0 ? "true" : "false")
  add("turns", number(turns))
  add("inputTokens", number(input))
  add("outputTokens", number(output))
  add("cacheReadInputTokens", number(cached))
  if (isstr(V["session_id"])) add("sessionId", clip(V["session_id"], 256))
  finish(answer)
}
