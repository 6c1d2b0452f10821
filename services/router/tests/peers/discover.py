"""Progressive discovery with the official Python SDK: list the tools, find
one through the search meta-tool, describe it, call it through the call
meta-tool, and print what happened as JSON.

Usage: discover.py URL KEY QUERY ARGUMENTS
  URL        the router's Streamable HTTP endpoint
  KEY        an API key (sent as Authorization: Bearer)
  QUERY      what to search for
  ARGUMENTS  a JSON object: the arguments to call the best match with

Prints {"tools": [names listed], "found": [names, best first],
"described": the best match's definition, "result": the call's result}.
"""

import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    url, key, query, arguments = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"})
    async with Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client:
        listed = await client.list_tools()
        names = [t.name for t in listed.tools]
        search = next(n for n in names if n.endswith("search_tools"))
        describe = next(n for n in names if n.endswith("describe_tool"))
        call = next(n for n in names if n.endswith("call_tool"))
        searched = await client.call_tool(search, {"query": query, "limit": 5})
        found = [t["name"] for t in json.loads(searched.content[0].text)]
        described = await client.call_tool(describe, {"name": found[0]})
        definition = json.loads(described.content[0].text)
        result = await client.call_tool(call, {"name": found[0], "arguments": arguments})
    print(json.dumps({
        "tools": names,
        "found": found,
        "described": definition,
        "result": result.model_dump(mode="json", exclude_none=True, by_alias=True),
    }))


asyncio.run(main())
