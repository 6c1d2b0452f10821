"""The router as the client in the official conformance suite's client
scenarios: `conformance client --command "python3 conformance_client.py"`
appends the scenario server's URL. This starts the router with that URL as
its one upstream (no namespace, loopback allowed), then drives the
scenario's client request through it with the official Python SDK, and
stops the router. The router is what the scenario server sees as its
client.

For the `auth/*` scenarios the upstream acts for its user
(`[upstreams.oauth] grant = "authorization_code"`, the scenario context's
client, else the suite's client ID metadata document URL, else dynamic
registration): the router answers with an authorization link, which this
script follows as the user's browser would (the scenario's authorization
server approves at once), at most three times, and makes the request again.

Environment: MCP_CONFORMANCE_SCENARIO (set by the suite), SWITCHBOARD_BIN
(the router binary).
"""

import asyncio
import base64
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from mcp import Client, types

SCENARIO = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
UPSTREAM = sys.argv[-1]


AUTH = SCENARIO.startswith("auth/")
# The client ID metadata document URL the suite's authorization servers take.
CIMD = "https://conformance-test.local/client-metadata.json"
# A link the router hands out: its own /oauth/start.
LINK = re.compile(r"(https?://[^\s\"']+/oauth/start\?s=[A-Za-z0-9_.\-]+)")


def toml_string(s):
    return json.dumps(s)


def start_router():
    work = Path(tempfile.mkdtemp(prefix="sb-confclient-"))
    config = work / "router.toml"
    text = (
        '[auth]\nmode = "none"\n'
        f'[log]\nlevel = "{os.environ.get("SWITCHBOARD_LOG", "info")}"\n[egress]\nallow = ["loopback"]\n'
    )
    if AUTH:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        text = (
            f'[server]\nlisten = "127.0.0.1:{port}"\npublic_url = "http://127.0.0.1:{port}"\n'
            f'[database]\nurl = "sqlite://{work}/router.db"\n[vault]\nkey = "{base64.b64encode(secrets.token_bytes(32)).decode()}"\n' + text
        )
    else:
        text = '[server]\nlisten = "127.0.0.1:0"\n[database]\nurl = ""\n' + text
    text += f'[[upstreams]]\nname = "scenario"\ntransport = "http"\nprefix = ""\nurl = "{UPSTREAM}"\n'
    if AUTH:
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
        text += f'[upstreams.oauth]\ngrant = "authorization_code"\nclient_metadata_url = "{CIMD}"\n'
        if context.get("client_id"):
            text += f'client_id = {toml_string(context["client_id"])}\n'
        if context.get("client_secret"):
            text += f'client_secret = {toml_string(context["client_secret"])}\n'
    config.write_text(text)
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


# Scenarios whose server takes the first GET after a call for the call's
# reconnection: the client's GET stream (the SDK opens it beside its first
# requests) is given this long to open before the calls. The router opens
# its own GET upstream when its client's GET arrives, and a request of the
# client's that reaches the router first reaches the server first too;
# the server then judged the router's GET, coming after the call, a
# reconnection made too early (sse-retry failed about one run in fifteen;
# the order of a client's concurrent requests is the client's, not a
# router's, to keep). The elicitation scenario's server sends its
# `elicitation/create` on the GET stream (not tied to the call) and drops it
# when no GET stream is open yet: the call then waits out its 60 s timeout
# (one CI run in many, when the router's GET reached the server 12 ms after
# the call).
LISTEN_FIRST = {"sse-retry": 0.3, "elicitation-sep1034-client-defaults": 0.3}

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


# Authorizations followed in this run, at most.
MAX_AUTHORIZATIONS = 3
followed = 0


def follow(error):
    """Opens the authorization link in `error` as the user's browser would
    (redirects followed: to the authorization server, which approves, and
    back to the router's callback); whether there was one to follow."""
    global followed
    text = f"{error} {getattr(getattr(error, 'error', None), 'data', '')}"
    found = LINK.search(text)
    if not found or followed >= MAX_AUTHORIZATIONS:
        return False
    followed += 1
    try:
        with urllib.request.urlopen(found.group(1), timeout=30) as page:
            print(f"conformance_client: authorized: {page.read().decode(errors='replace').strip()}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001
        detail = e.read().decode(errors="replace") if hasattr(e, "read") else ""
        print(f"conformance_client: the authorization failed: {e} {detail}", file=sys.stderr)
    return True


async def with_authorization(request):
    """`request()`, again after following each authorization link it is
    answered with."""
    while True:
        try:
            return await request()
        except Exception as e:  # noqa: BLE001
            if not follow(e):
                raise


async def drive(url):
    era = "2026-07-28" if os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "") >= "2026" else "legacy"
    async with Client(url, mode=era, cache=None, elicitation_callback=defaults) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        if AUTH and names == ["authorize"]:
            # The upstream lists nothing until its user authorizes the router.
            try:
                await with_authorization(lambda: client.call_tool("authorize", {}))
            except Exception as e:  # noqa: BLE001
                print(f"conformance_client: authorize: {e}", file=sys.stderr)
            names = [t.name for t in (await client.list_tools()).tools]
        if SCENARIO in LISTEN_FIRST:
            await asyncio.sleep(LISTEN_FIRST[SCENARIO])
        for name, arguments in calls(names):
            try:
                await with_authorization(lambda: client.call_tool(name, arguments))
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
