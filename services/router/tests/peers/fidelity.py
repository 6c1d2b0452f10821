"""Exercises what a router must relay, with the official Python SDK, and
prints what arrived as JSON.

Usage: fidelity.py URL PREFIX FEATURES
  URL       the MCP endpoint (the router)
  PREFIX    the namespace of server-everything's tools there ("everything__")
  FEATURES  comma-separated: progress, sampling, elicitation, url_elicitation, subscribe, collide
"""

import asyncio
import json
import sys

from mcp import Client, types

URL, PREFIX, FEATURES = sys.argv[1], sys.argv[2], set(sys.argv[3].split(","))
URI_PREFIX = PREFIX.replace("__", "+") if PREFIX else ""


async def sampling(context, params):
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="four"), model="test-model", stopReason="endTurn"
    )


modes = []


async def elicitation(context, params):
    modes.append(getattr(params, "mode", None) or "form")
    return types.ElicitResult(action="decline")


def texts(result):
    return [c.text for c in result.content if getattr(c, "type", "") == "text"]


async def progress_run(client, steps, tag):
    seen = []

    async def on_progress(progress, total, message):
        seen.append({"progress": progress, "total": total, "message": message})

    result = await client.call_tool(
        PREFIX + "trigger-long-running-operation", {"duration": 1, "steps": steps}, progress_callback=on_progress
    )
    echo = await client.call_tool(PREFIX + "echo", {"message": tag})
    return {"progress": seen, "text": texts(result), "echo": texts(echo)}


async def main():
    out = {}
    updates = []

    async def on_message(message):
        m = getattr(message, "root", message)
        if getattr(m, "method", None) == "notifications/resources/updated":
            updates.append(str(m.params.uri))

    async with Client(URL, mode="legacy", cache=None, sampling_callback=sampling, elicitation_callback=elicitation,
                      message_handler=on_message) as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        out["tools"] = tools
        if "progress" in FEATURES:
            out["progress"] = await progress_run(client, 3, "solo")
        if "sampling" in FEATURES:
            result = await client.call_tool(PREFIX + "trigger-sampling-request", {"prompt": "2+2?"})
            out["sampling"] = texts(result)
        if "elicitation" in FEATURES:
            result = await client.call_tool(PREFIX + "trigger-elicitation-request", {})
            out["elicitation"] = texts(result)
        if "url_elicitation" in FEATURES:
            result = await client.call_tool(PREFIX + "trigger-url-elicitation", {"url": "https://example.com/consent"})
            out["url_elicitation"] = texts(result)
            out["url_elicitation_modes"] = modes
        if "subscribe" in FEATURES:
            uri = URI_PREFIX + "demo://resource/dynamic/text/1"
            await client.session.subscribe_resource(uri)
            await client.call_tool(PREFIX + "toggle-subscriber-updates", {})
            for _ in range(100):
                if updates:
                    break
                await asyncio.sleep(0.1)
            out["subscribed"] = uri
            out["updates"] = updates[:3]
    if "collide" in FEATURES:
        # Two clients at once; both number their requests from the same ids.
        async def one(tag, steps):
            async with Client(URL, mode="legacy", cache=None) as c:
                return await progress_run(c, steps, tag)

        a, b = await asyncio.gather(one("client-a", 2), one("client-b", 4))
        out["collide"] = {"a": a, "b": b}
    print(json.dumps(out))


asyncio.run(main())
