# JSON for the result reducers (POSIX awk, run under LC_ALL=C so strings are bytes; the agent
# images have mawk and no Node.js or Python). parse(text) reads one JSON object and keeps its
# leaves in V[path], a path being the keys and indices joined by SUBSEP, six levels deep at most
# (deeper values are checked, not kept); a string keeps its quotes and escapes. It returns 0 for
# anything that is not one whole JSON object.
function ws() { while (p <= n && index(" \t\r\n", substr(s, p, 1))) p++ }
function str(   q, c) {
  q = p; p++
  while (p <= n) {
    c = substr(s, p, 1)
    if (c == "\\") p += 2
    else if (c == "\"") { p++; return substr(s, q, p - q) }
    else p++
  }
  bad = 1; return ""
}
function value(path, d,   c, t, k, i, end) {
  if (d > 64) { bad = 1; return }
  ws(); c = substr(s, p, 1)
  if (c == "\"") { t = str(); if (d > 0 && d <= 6) V[path] = t; return }
  if (c == "{" || c == "[") {
    end = c == "{" ? "}" : "]"
    p++; ws(); i = 0
    if (substr(s, p, 1) == end) { p++; return }
    while (!bad) {
      if (c == "{") {
        ws(); if (substr(s, p, 1) != "\"") { bad = 1; return }
        k = str(); k = substr(k, 2, length(k) - 2)
        ws(); if (substr(s, p, 1) != ":") { bad = 1; return }
        p++
      } else k = i++
      value(d == 0 ? k : (path SUBSEP k), d + 1)
      ws(); t = substr(s, p, 1); p++
      if (t == end) return
      if (t != ",") { bad = 1; return }
    }
    return
  }
  t = ""
  while (p <= n && index(" \t\r\n,}]", substr(s, p, 1)) == 0) { t = t substr(s, p, 1); p++ }
  if (t == "") bad = 1; else if (d > 0 && d <= 6) V[path] = t
}
function parse(text) {
  split("", V); s = text; n = length(s); p = 1; bad = 0; ws()
  if (substr(s, p, 1) == "{") { value("", 0); ws(); if (p <= n) bad = 1 } else bad = 1
  return !bad
}
# The length of a JSON string in the termination message, one escape or UTF-8 sequence at a time.
function unit(raw, i,   c) {
  c = substr(raw, i, 1)
  if (c == "\\") return substr(raw, i + 1, 1) == "u" ? 6 : 2
  if (c < "\300") return 1
  if (c < "\340") return 2
  if (c < "\360") return 3
  return 4
}
# The raw JSON string cut to `max` bytes, never inside an escape or a UTF-8 sequence (sets cut).
function clip(raw, max,   i, u) {
  if (length(raw) <= max) return raw
  i = 2
  while (i < length(raw)) { u = unit(raw, i); if (i + u > max) break; i += u }
  cut = 1
  return substr(raw, 1, i - 1) "\""
}
function hex(h,   i, v) {
  v = 0
  for (i = 1; i <= length(h); i++) v = v * 16 + index("0123456789abcdef", tolower(substr(h, i, 1))) - 1
  return v
}
function utf8(cp) {
  if (cp < 128) return sprintf("%c", cp)
  if (cp < 2048) return sprintf("%c%c", 192 + int(cp / 64), 128 + cp % 64)
  if (cp < 65536) return sprintf("%c%c%c", 224 + int(cp / 4096), 128 + int(cp / 64) % 64, 128 + cp % 64)
  return sprintf("%c%c%c%c", 240 + int(cp / 262144), 128 + int(cp / 4096) % 64, 128 + int(cp / 64) % 64, 128 + cp % 64)
}
# Prints a raw JSON string decoded, and a newline (the final text, on stdout).
function say(raw,   parts, m, j, x, e, cp, lo) {
  m = split(substr(raw, 2, length(raw) - 2), parts, "\\")
  printf "%s", parts[1]
  for (j = 2; j <= m; j++) {
    x = parts[j]
    if (x == "") { printf "\\"; if (++j <= m) printf "%s", parts[j]; continue }
    e = substr(x, 1, 1); x = substr(x, 2)
    if (e == "n") e = "\n"; else if (e == "t") e = "\t"; else if (e == "r") e = "\r"
    else if (e == "b") e = "\b"; else if (e == "f") e = "\f"
    else if (e == "u") {
      cp = hex(substr(x, 1, 4)); x = substr(x, 5)
      if (cp >= 55296 && cp < 56320 && x == "" && j < m && parts[j + 1] ~ /^u[dD][c-fC-F]/) {
        lo = hex(substr(parts[j + 1], 2, 4))
        cp = 65536 + (cp - 55296) * 1024 + (lo - 56320)
        x = substr(parts[++j], 6)
      }
      if (cp >= 55296 && cp < 57344) cp = 65533
      e = utf8(cp)
    }
    printf "%s%s", e, x
  }
  printf "\n"
}
# The report: add(key, json) appends a field when it has a value; whole(v) is v when it is a
# count; isstr(v) says whether v is a JSON string; number(x) writes a sum as an integer.
function add(key, v) { if (v != "") o = o (o == "" ? "" : ",") "\"" key "\":" v }
function whole(v) { return v ~ /^[0-9]+$/ ? v : "" }
function isstr(v) { return substr(v, 1, 1) == "\"" }
function number(x) { return sprintf("%.0f", x) }
# Ends the report with the final text (clipped to what fits) and writes it.
function finish(raw) {
  if (isstr(raw)) { cut = 0; add("text", clip(raw, 4000 - length(o) - 40)); if (cut) add("textTruncated", "true") }
  printf "%s", "{" o "}" > tl
}
# No result: the runtime failed before it printed one. The report says so, and awk exits 3: the
# script then logs the output of the runtime as it was.
function noresult(who) {
  if (note != "") o = "{\"subtype\":\"error_no_result\",\"isError\":true,\"text\":\"" note "\"}"
  else o = "{\"subtype\":\"error_no_result\",\"isError\":true,\"text\":\"" who " exited with code " code " without a JSON result (its output is in the log)\"}"
  printf "%s", o > tl
  exit 3
}
