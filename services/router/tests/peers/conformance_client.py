"""The router as the client in the official conformance suite's client
scenarios: `conformance client --command "python3 conformance_client.py"`
appends the scenario server's URL. This starts the router with that URL as
its one upstream (no namespace, loopback allowed), then drives the
scenario's client request through it with the official Python SDK, and
stops the router. The router is what the scenario server sees as its
client.

Environment: MCP_CONFORMANCE_SCENARIO (set by the suite), SWITCHBOARD_BIN
(the router binary).
"""

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from mcp import Client, types

SCENARIO = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
UPSTREAM = sys.argv[-1]


def start_router():
    work = Path(tempfile.mkdtemp(prefix="sb-confclient-"))
    config = work / "router.toml"
    config.write_text(
        '[server]\nlisten = "127.0.0.1:0"\n[auth]\nmode = "none"\n[database]\nurl = ""\n'
        f'[log]\nlevel = "{os.environ.get("SWITCHBOARD_LOG", "info")}"\n[egress]\nallow = ["loopback"]\n'
        f'[[upstreams]]\nname = "scenario"\ntransport = "http"\nprefix = ""\nurl = "{UPSTREAM}"\n'
    )
    log = open(work / "router.log", "w+")
    router = subprocess.Popen([os.environ["SWITCHBOARD_BIN"], "serve", "--config", str(config)],
                              stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        log.seek(0)
        found = re.search(r"switchboard listening on (http://[^ /]+/mcp)", log.read())
        if found:
            return router, found.group(1), work
        if router.poll() is not None:
            break
        import time
        time.sleep(0.05)
    log.seek(0)
    sys.exit(f"the router did not start:\n{log.read()}")


async def defaults(context, params):
    """Accept, with each field's default (the user changing nothing)."""
    schema = getattr(params, "requested_schema", None) or getattr(params, "requestedSchema", None) or {}
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    content = {name: prop["default"] for name, prop in properties.items() if "default" in prop}
    return types.ElicitResult(action="accept", content=content)


# What each scenario has the client do beyond initialising and listing.
CALLS = {
    "tools_call": [("add_numbers", {"a": 2, "b": 3})],
    "elicitation-sep1034-client-defaults": [("test_client_elicitation_defaults", {})],
    "sep-2322-client-request-state": [
        ("test_mrtr_echo_state", {}),
        ("test_mrtr_no_state", {}),
        ("test_mrtr_unrelated", {}),
        ("test_mrtr_no_result_type", {}),
    ],
}


def calls(names):
    """The scenario's tool calls: those its context names (with their
    arguments), else the ones above, else the first tool's."""
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    if context.get("toolCalls"):
        return [(c["name"], c.get("arguments", {})) for c in context["toolCalls"]]
    if SCENARIO in CALLS:
        return CALLS[SCENARIO]
    if SCENARIO in ("initialize", "json-schema-ref-no-deref") or not names:
        return []
    return [(names[0], {})]


async def drive(url):
    era = "2026-07-28" if os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "") >= "2026" else "legacy"
    async with Client(url, mode=era, cache=None, elicitation_callback=defaults) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        for name, arguments in calls(names):
            try:
                await client.call_tool(name, arguments)
            except Exception as e:  # noqa: BLE001
                # What the scenario checks is what its server saw of the
                # router; a result this SDK will not take is reported, and
                # the next call made.
                print(f"conformance_client: {name}: {e}", file=sys.stderr)


def main():
    router, url, work = start_router()
    try:
        asyncio.run(drive(url))
    finally:
        router.terminate()
        try:
            router.wait(timeout=10)
        except subprocess.TimeoutExpired:
            router.kill()
        sys.stderr.write((work / "router.log").read_text()[-4000:])


main()
