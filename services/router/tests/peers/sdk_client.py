#!/usr/bin/env python3
"""Minimal MCP client on the official Python SDK 2.x (mcp==2.3.0).

Usage:
  python sdk_client.py --mode auto|legacy|2026-07-28 \
      (--url URL [--header 'Name: value']... | --command CMD [ARGS...]) \
      --call TOOL --args JSON

Connects (Streamable HTTP for --url, stdio for --command), lists tools, calls one tool and
prints {"tools":[names],"result":<CallToolResult>,"era":..,"protocolVersion":..} on stdout. Any
failure (or a result with isError:true) prints {"error":...} to stderr and exits 1;
bad usage exits 2.

Era selection is `Client(..., mode=...)` (mcp/client/client.py):
  "legacy"      -> initialize handshake (2025 session era)
  "auto"        -> probe server/discover, fall back to initialize (the SDK default)
  "2026-07-28"  -> adopt that version directly: NO probe, no initialize; requests go
                   straight out in the stateless 2026 era (a synthesized DiscoverResult)
"""

from types import SimpleNamespace
import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


FLAGS = {"--mode", "--url", "--header", "--command", "--call", "--args"}


def parse_args(argv: list[str]) -> SimpleNamespace:
    # Hand-rolled (same rules as sdk_client.mjs): --command swallows every word up to the next
    # known flag, so server flags such as --local-timezone pass through untouched.
    ns = SimpleNamespace(mode="auto", url=None, header=[], command=None, call=None, args="{}")
    i = 0
    while i < len(argv):
        a = argv[i]
        if a not in FLAGS or i + 1 >= len(argv):
            usage(f"bad or incomplete argument: {a}")
        if a == "--command":
            j = i + 1
            while j < len(argv) and argv[j] not in FLAGS:
                j += 1
            ns.command, i = argv[i + 1 : j], j
            continue
        if a == "--header":
            ns.header.append(argv[i + 1])
        else:
            setattr(ns, a[2:], argv[i + 1])
        i += 2
    if bool(ns.url) == bool(ns.command):
        usage("exactly one of --url / --command is required")
    if not ns.call:
        usage("--call is required")
    return ns


def usage(msg: str) -> None:
    print(f"{msg}\nusage: sdk_client.py --mode auto|legacy|2026-07-28 "
          "(--url URL [--header 'K: V']... | --command CMD ARGS...) --call TOOL --args JSON", file=sys.stderr)
    sys.exit(2)


async def run(ns: SimpleNamespace) -> int:
    tool_args = json.loads(ns.args)
    headers = {}
    for h in ns.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"bad header: {h!r}")
        headers[name.strip()] = value.strip()

    async def session(server) -> dict:
        async with Client(server, mode=ns.mode) as client:
            tools = await client.list_tools()
            result = await client.call_tool(ns.call, tool_args)
            return {
                "tools": [t.name for t in tools.tools],
                "result": result.model_dump(mode="json", by_alias=True, exclude_none=True),
                "era": "modern" if client.protocol_version in MODERN_PROTOCOL_VERSIONS else "legacy",
                "protocolVersion": client.protocol_version,
            }

    if ns.url:
        # The transport does not close a caller-supplied httpx2 client: own it here.
        timeout = httpx2.Timeout(30.0, read=300.0)  # the SDK's own defaults
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            out = await session(streamable_http_client(ns.url, http_client=http))
    else:
        cmd, *cmd_args = ns.command
        out = await session(StdioServerParameters(command=cmd, args=cmd_args))

    print(json.dumps(out))
    return 1 if out["result"].get("isError") else 0


def main() -> int:
    ns = parse_args(sys.argv[1:])
    try:
        return asyncio.run(run(ns))
    except BaseException as e:  # noqa: BLE001 - report anything (incl. ExceptionGroup) as JSON
        # Unwrap anyio task-group ExceptionGroups to the first real cause.
        while isinstance(e, BaseExceptionGroup) and len(e.exceptions) >= 1:
            e = e.exceptions[0]
        err = {"error": str(e), "type": type(e).__name__}
        if getattr(e, "error", None) is not None and hasattr(e.error, "code"):  # MCPError
            err["code"] = e.error.code
        print(json.dumps(err), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
