"""One client session, with the official Python SDK (session era), through a
round-robin load balancer in front of router replicas: each request lands
on whichever replica the balancer picks. Prints what arrived as JSON (the
last line); `MARK` lines tell the test when to act.

Usage: balanced.py URL MODE
  everything  against server-everything (prefix "everything__"): the tool
              list, 20 calls, progress, sampling, elicitation, logging
              messages on the GET stream, resource updates
  kill        against the mock (prefix "web__"): one long progress call;
              prints MARK after its second progress notification (the test
              then kills the replica serving it) and waits for the answer
  loop        against the mock: calls echo every 100 ms for 10 s; prints
              MARK after the 10th (the test then restarts Redis empty);
              records every call that failed
"""

import asyncio
import json
import sys
import time
import warnings

import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

URL, MODE = sys.argv[1], sys.argv[2]
# Logging is deprecated in the newest era; this session's era still has it.
warnings.simplefilter("ignore")
logs, updates = [], []


def mark(what):
    print("MARK", what, flush=True)


def texts(result):
    return [c.text for c in result.content if getattr(c, "type", "") == "text"]


async def sampling(context, params):
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="four"), model="test-model", stopReason="endTurn"
    )


async def elicitation(context, params):
    return types.ElicitResult(action="accept", content={})


async def on_log(params):
    logs.append(params.level)


async def on_message(message):
    m = getattr(message, "root", message)
    if getattr(m, "method", None) == "notifications/resources/updated":
        updates.append(str(m.params.uri))


async def wait_for(found, seconds):
    deadline = time.monotonic() + seconds
    while not found() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return found()


async def everything(client, out):
    out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
    await client.set_logging_level("debug")
    out["echoes"] = [texts(await client.call_tool("everything__echo", {"message": f"m{i}"}))[0] for i in range(20)]
    seen = []

    async def on_progress(progress, total, message):
        seen.append(progress)

    result = await client.call_tool(
        "everything__trigger-long-running-operation", {"duration": 2, "steps": 4}, progress_callback=on_progress
    )
    out["progress"] = {"seen": seen, "text": texts(result)}
    out["sampling"] = texts(await client.call_tool("everything__trigger-sampling-request", {"prompt": "2+2?"}))
    out["elicitation"] = texts(await client.call_tool("everything__trigger-elicitation-request", {}))
    # Log messages every 5 s on the session's GET stream, at whichever
    # replica it is open: the first comes at once, the second 5 s later.
    await client.call_tool("everything__toggle-simulated-logging", {})
    out["logged"] = await wait_for(lambda: len(logs) >= 2, 20)
    out["logs"] = logs[:3]
    uri = "everything+demo://resource/dynamic/text/1"
    await client.subscribe_resource(uri)
    await client.call_tool("everything__toggle-subscriber-updates", {})
    out["updated"] = await wait_for(lambda: bool(updates), 20)
    out["updates"] = updates[:2]


async def kill(client, out):
    seen = []

    async def on_progress(progress, total, message):
        seen.append(progress)
        if len(seen) == 2:
            mark("second progress")

    result = await client.call_tool(
        "web__progress", {"steps": 8, "interval_ms": 500}, progress_callback=on_progress
    )
    out["progress"] = seen
    out["text"] = texts(result)
    out["is_error"] = bool(result.is_error)


async def loop(client, out):
    failures = []
    calls = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        calls += 1
        try:
            result = await client.call_tool("web__echo", {"n": calls})
            if texts(result) != [json.dumps({"n": calls}, separators=(",", ":"))]:
                failures.append(f"call {calls}: {texts(result)}")
        except Exception as e:  # noqa: BLE001 - every failure is what the test looks for
            failures.append(f"call {calls}: {type(e).__name__}: {e}")
        if calls == 10:
            mark("ten calls")
        await asyncio.sleep(0.1)
    out["calls"] = calls
    out["failures"] = failures


async def main():
    out = {}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300)) as http:
        async with Client(
            streamable_http_client(URL, http_client=http),
            mode="legacy",
            sampling_callback=sampling,
            elicitation_callback=elicitation,
            logging_callback=on_log,
            message_handler=on_message,
        ) as client:
            await {"everything": everything, "kill": kill, "loop": loop}[MODE](client, out)
    print(json.dumps(out), flush=True)


asyncio.run(main())
