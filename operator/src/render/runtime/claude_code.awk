# The `--output-format json` result of Claude Code, one object: its fields as they are.
{ all = all $0 "\n" }
END {
  if (!parse(all) || !(("subtype" in V) || ("result" in V) || ("is_error" in V))) noresult("Claude Code")
  if (isstr(V["result"])) say(V["result"])
  if (isstr(V["subtype"])) add("subtype", clip(V["subtype"], 256))
  if (V["is_error"] == "true" || V["is_error"] == "false") add("isError", V["is_error"])
  add("turns", whole(V["num_turns"]))
  add("inputTokens", whole(V["usage" SUBSEP "input_tokens"]))
  add("outputTokens", whole(V["usage" SUBSEP "output_tokens"]))
  add("cacheReadInputTokens", whole(V["usage" SUBSEP "cache_read_input_tokens"]))
  add("cacheCreationInputTokens", whole(V["usage" SUBSEP "cache_creation_input_tokens"]))
  if (V["total_cost_usd"] ~ /^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/) add("costUsd", V["total_cost_usd"])
  add("durationMs", whole(V["duration_ms"]))
  if (isstr(V["session_id"])) add("sessionId", clip(V["session_id"], 256))
  finish(V["result"])
}
