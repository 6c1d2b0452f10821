"""An MCP server, built with the official Python SDK's MCPServer, that speaks
both protocol eras on one Streamable HTTP endpoint: 2025 clients get a
session (initialize, Mcp-Session-Id, server-to-client requests mid-call);
2026-07-28 clients are served statelessly per request (elicitation and
sampling come back as input_required results the client answers by retrying).

Usage: dual_era_server.py PORT
  Serves http://127.0.0.1:PORT/mcp. PORT 0 binds a port of its own choosing;
  uvicorn's "Uvicorn running on http://127.0.0.1:N" line on stderr names it
  (peers::dual_era_http waits for that line).

Tools:   add(a, b)          -> "5" for a=2, b=3
         slow_count(n)      -> n progress notifications, then "counted n"
         ask_name()         -> elicits {"name": str}, then "hello <name>"
         summarize(text)    -> samples the client's LLM, then the model's text
Prompt:  greet(name)        -> one user message "Say hello to <name>."
Resource: dual://info       -> text "dual-era test server"
"""

import sys
from typing import Annotated

import mcp_types as types
from pydantic import BaseModel, Field

from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve, Sample

server = MCPServer("dual-era", version="1.0.0", instructions="A test server for both MCP eras.")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
async def slow_count(n: int, ctx: Context) -> str:
    """Report n progress steps, then say so."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i} of {n}")
    return f"counted {n}"


class NameForm(BaseModel):
    name: str = Field(description="Your name")


def ask_for_name() -> Elicit[NameForm]:
    # A resolver: the SDK turns this into an elicitation/create request on a
    # 2025 session, or an input_required round for a 2026-07-28 client.
    return Elicit("What is your name?", NameForm)


@server.tool()
def ask_name(form: Annotated[NameForm, Resolve(ask_for_name)]) -> str:
    """Ask the user for their name and greet them."""
    return f"hello {form.name}"


def sample_summary(text: str) -> Sample:
    return Sample(
        [types.SamplingMessage(role="user", content=types.TextContent(type="text", text=f"Summarize: {text}"))],
        max_tokens=50,
    )


@server.tool()
def summarize(text: str, sampled: Annotated[types.CreateMessageResult, Resolve(sample_summary)]) -> str:
    """Summarize text with the client's LLM."""
    content = sampled.content
    if isinstance(content, list):
        content = content[0]
    return content.text if isinstance(content, types.TextContent) else str(content)


@server.prompt()
def greet(name: str) -> str:
    """Greet someone."""
    return f"Say hello to {name}."


@server.resource("dual://info", mime_type="text/plain")
def info() -> str:
    """What this server is."""
    return "dual-era test server"


def main() -> None:
    port = int(sys.argv[1])
    server.run("streamable-http", host="127.0.0.1", port=port, streamable_http_path="/mcp")


if __name__ == "__main__":
    main()
