"""The official Python SDK over the legacy HTTP+SSE transport: list tools,
call some (with progress), print JSON.

Usage: legacy_client.py SSE_URL CALLS
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.sse import sse_client


async def main():
    calls = json.loads(sys.argv[2]) if len(sys.argv) > 2 else []
    async with Client(sse_client(sys.argv[1]), mode="legacy", cache=None) as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        results, progress = [], []

        async def on_progress(p, total, message):
            progress.append(p)

        for name, arguments in calls:
            result = await client.call_tool(name, arguments, progress_callback=on_progress)
            results.append(result.model_dump(mode="json", exclude_none=True, by_alias=True))
    print(json.dumps({"tools": tools, "results": results, "progress": progress}))


asyncio.run(main())
