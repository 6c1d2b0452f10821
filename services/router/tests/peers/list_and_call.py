"""List tools and call some, with the official Python SDK, and print JSON.

Usage: list_and_call.py TARGET CALLS
  TARGET  an http(s) URL of a Streamable HTTP endpoint, a JSON object
          {"url": ..., "key": ..., "ca": ..., "client_cert": ...,
          "client_key": ...} for one that wants an API key (sent as
          Authorization: Bearer), whose certificate is checked against a CA
          bundle (PEM file), or that takes a client certificate (PEM files),
          or {"command": ..., "args": [...]} for a stdio server
  CALLS   a JSON array of [tool name, arguments] pairs

Prints {"tools": [names], "results": [call results as JSON]} on stdout.
"""

import asyncio
import json
import ssl
import sys

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def target(spec: str):
    if spec.startswith("http://") or spec.startswith("https://"):
        return spec
    params = json.loads(spec)
    if "url" in params:
        headers = {"Authorization": f"Bearer {params['key']}"} if "key" in params else {}
        verify = ssl.create_default_context(cafile=params["ca"]) if "ca" in params else True
        if "client_cert" in params:
            verify.load_cert_chain(params["client_cert"], params["client_key"])
        http = httpx2.AsyncClient(headers=headers, verify=verify)
        return streamable_http_client(params["url"], http_client=http)
    return StdioServerParameters(command=params["command"], args=params.get("args", []))


async def main() -> None:
    calls = json.loads(sys.argv[2]) if len(sys.argv) > 2 else []
    async with Client(target(sys.argv[1]), mode="legacy", cache=None) as client:
        tools = await client.list_tools()
        results = []
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            results.append(result.model_dump(mode="json", exclude_none=True, by_alias=True))
    print(json.dumps({"tools": [t.name for t in tools.tools], "results": results}))


asyncio.run(main())
