"""Drives a server with the official Python SDK in a chosen protocol era and
prints what happened as JSON, one object per line.

Usage: modern_client.py URL MODE [FLAVOUR] [PREFIX]
  URL      the Streamable HTTP endpoint (a server, or the router)
  MODE     "2026-07-28" (adopt the modern era directly, no handshake),
           "auto" (probe server/discover, fall back to initialize), or
           "legacy" (initialize handshake)
  FLAVOUR  what is behind URL: "dual" (dual_era_server.py, the default) or
           "everything" (@modelcontextprotocol/server-everything)
  PREFIX   prepended to tool and prompt names (e.g. "everything__" through the
           router); default: $PREFIX, else empty. Resource URIs get the router's
           matching scheme prefix ("everything+"); $URI_PREFIX overrides it.

Environment: SWITCHBOARD_KEY, if set, is sent as Authorization: Bearer.

Each step prints {"step": NAME, ...facts}; the last line holds every step's
facts keyed by name, plus "ok": true. Any failed call or unexpected result
prints {"step": "error", ...} and exits 1 with the reason on stderr.
"""

import asyncio
import json
import os
import sys
import traceback

import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

URL = sys.argv[1]
MODE = sys.argv[2]
FLAVOUR = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else "dual"
PREFIX = sys.argv[4] if len(sys.argv) > 4 else os.environ.get("PREFIX", "")


def scheme_prefix(prefix: str) -> str:
    """The router's resource-URI prefix for a tool prefix like "everything__"."""
    if "URI_PREFIX" in os.environ:
        return os.environ["URI_PREFIX"]
    base = prefix[:-2] if prefix.endswith("__") else prefix
    if not base:
        return ""
    out = "".join(c.lower() if c.isalnum() or c in ".-" else "-" for c in base)
    if not out[0].isalpha():
        out = "u" + out
    return out + "+"


URI_PREFIX = scheme_prefix(PREFIX)

facts: dict = {}


class Failure(Exception):
    pass


def emit(step: str, **data) -> None:
    facts[step] = data
    print(json.dumps({"step": step, **data}), flush=True)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Failure(message)


def texts(result) -> list[str]:
    return [c.text for c in result.content if getattr(c, "type", "") == "text"]


# Server-to-client requests, answered the same way whether they arrive as a
# real request on a 2025 session or inside an input_required result (2026).
callbacks = {"sampling": 0, "elicitation": 0}


async def sampling(context, params: types.CreateMessageRequestParams):
    callbacks["sampling"] += 1
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="short"),
        model="test-model",
        stop_reason="endTurn",
    )


async def elicitation(context, params: types.ElicitRequestParams):
    callbacks["elicitation"] += 1
    return types.ElicitResult(action="accept", content={"name": "Ada"})


async def list_all_tools(client: Client) -> list[str]:
    names, cursor, pages = [], None, 0
    while True:
        page = await client.list_tools(cursor=cursor)
        pages += 1
        names += [t.name for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            return names
        expect(pages < 100, "tools/list never stopped paginating")


async def call(client: Client, step: str, tool: str, arguments: dict, **kwargs):
    result = await client.call_tool(PREFIX + tool, arguments, **kwargs)
    out = texts(result)
    expect(not result.is_error, f"{tool} returned an error: {out}")
    return result, out


async def progress_call(client: Client, step: str, tool: str, arguments: dict, steps: int) -> None:
    seen = []

    async def on_progress(progress, total, message):
        seen.append(progress)

    _, out = await call(client, step, tool, arguments, progress_callback=on_progress)
    emit(step, text=out, progress=seen, progress_count=len(seen))
    expect(len(seen) == steps, f"{tool}: expected {steps} progress notifications, got {seen}")
    return out


async def check_dual(client: Client, tools: list[str]) -> None:
    want = [PREFIX + n for n in ("add", "slow_count", "ask_name", "summarize")]
    expect(all(n in tools for n in want), f"missing tools: want {want}, got {tools}")

    _, out = await call(client, "add", "add", {"a": 2, "b": 3})
    emit("add", text=out)
    expect(out == ["5"], f"add(2,3) gave {out}")

    out = await progress_call(client, "slow_count", "slow_count", {"n": 3}, 3)
    expect(out == ["counted 3"], f"slow_count(3) gave {out}")

    before = callbacks["elicitation"]
    _, out = await call(client, "ask_name", "ask_name", {})
    emit("ask_name", text=out, elicitations=callbacks["elicitation"] - before)
    expect(out == ["hello Ada"], f"ask_name gave {out}")
    expect(callbacks["elicitation"] - before == 1, "the elicitation callback was not called exactly once")

    before = callbacks["sampling"]
    _, out = await call(client, "summarize", "summarize", {"text": "a long story about routers"})
    emit("summarize", text=out, samplings=callbacks["sampling"] - before)
    expect(out == ["short"], f"summarize gave {out}")
    expect(callbacks["sampling"] - before == 1, "the sampling callback was not called exactly once")

    prompt = await client.get_prompt(PREFIX + "greet", {"name": "Ada"})
    prompt_texts = [m.content.text for m in prompt.messages if getattr(m.content, "type", "") == "text"]
    emit("prompt", text=prompt_texts)
    expect(prompt_texts == ["Say hello to Ada."], f"greet gave {prompt_texts}")

    resource = await client.read_resource(URI_PREFIX + "dual://info")
    resource_texts = [c.text for c in resource.contents if hasattr(c, "text")]
    emit("resource", uri=URI_PREFIX + "dual://info", text=resource_texts)
    expect(resource_texts == ["dual-era test server"], f"dual://info gave {resource_texts}")


async def check_everything(client: Client, tools: list[str]) -> None:
    want = [PREFIX + n for n in ("echo", "get-sum", "trigger-long-running-operation")]
    expect(all(n in tools for n in want), f"missing tools: want {want}, got {tools}")

    _, out = await call(client, "echo", "echo", {"message": "hi"})
    emit("echo", text=out)
    expect(out == ["Echo: hi"], f"echo gave {out}")

    _, out = await call(client, "get_sum", "get-sum", {"a": 2, "b": 3})
    emit("get_sum", text=out)
    expect(out == ["The sum of 2 and 3 is 5."], f"get-sum gave {out}")

    await progress_call(
        client, "long_running", "trigger-long-running-operation", {"duration": 1, "steps": 3}, 3
    )

    # server-everything registers these only for clients that declared the
    # capability, which the callbacks make this client do.
    if PREFIX + "trigger-sampling-request" in tools:
        before = callbacks["sampling"]
        _, out = await call(client, "sampling", "trigger-sampling-request", {"prompt": "2+2?"})
        emit("sampling", text=out, samplings=callbacks["sampling"] - before)
        expect(any('"short"' in t for t in out), f"trigger-sampling-request gave {out}")
        expect(callbacks["sampling"] - before == 1, "the sampling callback was not called exactly once")
    else:
        raise Failure("trigger-sampling-request is not listed (sampling capability not seen?)")

    if PREFIX + "trigger-elicitation-request" in tools:
        before = callbacks["elicitation"]
        _, out = await call(client, "elicitation", "trigger-elicitation-request", {})
        emit("elicitation", text=out, elicitations=callbacks["elicitation"] - before)
        expect(any("- Name: Ada" in t for t in out), f"trigger-elicitation-request gave {out}")
        expect(callbacks["elicitation"] - before == 1, "the elicitation callback was not called exactly once")
    else:
        raise Failure("trigger-elicitation-request is not listed (elicitation capability not seen?)")

    prompt = await client.get_prompt(PREFIX + "simple-prompt")
    prompt_texts = [m.content.text for m in prompt.messages if getattr(m.content, "type", "") == "text"]
    emit("prompt", text=prompt_texts)
    expect(prompt_texts == ["This is a simple prompt without arguments."], f"simple-prompt gave {prompt_texts}")

    uri = URI_PREFIX + "demo://resource/dynamic/text/1"
    resource = await client.read_resource(uri)
    resource_texts = [c.text for c in resource.contents if hasattr(c, "text")]
    emit("resource", uri=uri, text=resource_texts)
    expect(len(resource_texts) == 1 and resource_texts[0].startswith("Resource 1:"), f"{uri} gave {resource_texts}")


async def main() -> None:
    expect(FLAVOUR in ("dual", "everything"), f"unknown flavour {FLAVOUR!r}")
    headers = {}
    if os.environ.get("SWITCHBOARD_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['SWITCHBOARD_KEY']}"
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0, read=300.0)) as http:
        async with Client(
            streamable_http_client(URL, http_client=http),
            mode=MODE,
            cache=None,
            read_timeout_seconds=300,
            sampling_callback=sampling,
            elicitation_callback=elicitation,
        ) as client:
            session = client.session
            info = client.server_info
            emit(
                "connect",
                mode=MODE,
                protocol_version=client.protocol_version,
                modern=client.protocol_version in MODERN_PROTOCOL_VERSIONS,
                handshake=session.initialize_result is not None,
                era="modern" if client.protocol_version in MODERN_PROTOCOL_VERSIONS else "handshake",
                server_info=info.model_dump(mode="json", exclude_none=True) if info else None,
            )
            if MODE == "legacy":
                expect(session.initialize_result is not None, "legacy mode did not run the initialize handshake")
            elif MODE != "auto":
                expect(client.protocol_version == MODE, f"asked for {MODE}, got {client.protocol_version}")

            tools = await list_all_tools(client)
            emit("tools", names=tools)
            if FLAVOUR == "dual":
                await check_dual(client, tools)
            else:
                await check_everything(client, tools)
    print(json.dumps({"ok": True, "mode": MODE, "flavour": FLAVOUR, "callbacks": callbacks, **facts}), flush=True)


def describe(error: BaseException) -> str:
    # anyio task groups wrap failures; show the innermost ones.
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe(e) for e in error.exceptions)
    code = getattr(error, "code", None)
    return f"{type(error).__name__}{f' {code}' if code is not None else ''}: {error}"


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except BaseException as error:  # noqa: BLE001 - report anything, then fail
        if isinstance(error, SystemExit):
            raise
        message = describe(error)
        print(json.dumps({"step": "error", "error": message, "mode": MODE, "flavour": FLAVOUR}), flush=True)
        print(f"modern_client.py: {MODE} against {FLAVOUR} at {URL} failed: {message}", file=sys.stderr)
        if os.environ.get("SWITCHBOARD_TEST_VERBOSE"):
            traceback.print_exception(error)
        sys.exit(1)
