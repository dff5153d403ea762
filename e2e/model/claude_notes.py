"""Claude Code's notes on the MCP tools it offers the model deferred (loaded with its ToolSearch
tool): which became available and which are no longer available, as it writes them into the
conversation. The Messages stand-in (scripted_model.py) reads them for `Recorded.available()`."""

from __future__ import annotations

import re
from typing import Iterable

# Claude Code's notes on the tools it offers (2.1.x): a header sentence, then the tool names (one
# per line, or joined on the header's line). Read from its binary's strings; whichever form a
# version uses, a note that adds names and one that takes them away are told apart here.
TOOLS_ADDED = (
    "The following deferred tools are now available",
    "The following deferred tools are available via",
    "The following tools just became available",
    "The following tools are now available",
    "The following tools are available again",
)
TOOLS_REMOVED = (
    "The following deferred tools are no longer available",
    "The following tools are no longer available",
    "The following tools are not offered right now",
)
# A tool taken away and then offered again: "1 deferred tool is available again in this session
# (announced earlier in this conversation): mcp__a__b. Load via ToolSearch as before."
_AGAIN = r"\d+ deferred tools? (?:is|are) available again"
_NOTE = re.compile("|".join([re.escape(h) for h in TOOLS_ADDED + TOOLS_REMOVED] + [_AGAIN]))
_MCP_NAME = re.compile(r"mcp__[A-Za-z0-9_.-]+")


def _texts(content) -> Iterable[str]:
    """The text of a message's content (a string or blocks, tool results included)."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    yield block["text"]
                if "content" in block:
                    yield from _texts(block["content"])


def _apply_deferred_note(text: str, names: set[str]) -> None:
    """Applies Claude Code's notes on the tools it offers ("now available", "available again",
    "no longer available", ...) to `names`, in the order they appear. A note's names are the MCP
    tool names from its header to the first blank line after it."""
    for m in _NOTE.finditer(text):
        end = text.find("\n\n", m.end())
        section = text[m.end() : end if end >= 0 else len(text)]
        listed = {n.rstrip(".") for n in _MCP_NAME.findall(section)}
        listed = {n for n in listed if not n.endswith("__")}
        listed = {n for n in listed if f"{n}*" not in section}
        if not m.group(0).startswith(TOOLS_REMOVED):
            names |= listed
        else:
            names -= listed
