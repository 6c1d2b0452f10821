"""The official Python SDK as an OAuth 2.1 client of the router.

Usage: oauth_client.py URL [LOGIN_HINT]

With no token, the SDK gets the router's 401, reads its protected resource
metadata, discovers the authorization server, registers itself (dynamic
client registration), runs the authorization code flow with PKCE (a
cookie-keeping HTTP client plays the browser: the test server logs in and
consents without a page), and retries with its token. Then:
  1. lists the tools and calls `echo`: a call the first token's scopes may
     not cover gets 403 insufficient_scope, and the SDK steps up (authorizes
     again for the wider scope) and retries;
  2. marks its token expired and calls again: the SDK refreshes it with the
     refresh token first.
Prints one JSON line: the tools, the call's text, the scopes granted before
and after the step-up, whether the token was refreshed, the client id.
"""

import asyncio
import json
import sys
import time
from urllib.parse import parse_qs, urlencode, urljoin, urlparse

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

URL = sys.argv[1]
LOGIN_HINT = sys.argv[2] if len(sys.argv) > 2 else None
REDIRECT = "http://127.0.0.1:9/callback"  # never reached: the redirect is read, not followed


class Memory(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client = None
        self.scopes_seen = []

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens
        self.scopes_seen.append(tokens.scope)

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, info):
        self.client = info


landing = {}


async def browse(url: str) -> None:
    """The user's browser: follows the authorization server's redirects
    (keeping its cookies) until they lead to the redirect URI."""
    if LOGIN_HINT:
        url += "&" + urlencode({"login_hint": LOGIN_HINT})
    landing.clear()
    async with httpx2.AsyncClient() as browser:
        for _ in range(12):
            r = await browser.get(url)
            if r.status_code not in (302, 303):
                raise RuntimeError(f"authorization stopped at {r.status_code}: {r.text[:300]}")
            url = urljoin(url, r.headers["location"])
            if url.startswith(REDIRECT):
                landing.update({k: v[0] for k, v in parse_qs(urlparse(url).query).items()})
                return
    raise RuntimeError("no redirect to the redirect URI")


async def callback() -> AuthorizationCodeResult:
    if "code" not in landing:
        raise RuntimeError(f"no code: {landing}")
    return AuthorizationCodeResult(code=landing["code"], state=landing.get("state"), iss=landing.get("iss"))


async def main():
    storage = Memory()
    provider = OAuthClientProvider(
        server_url=URL,
        client_metadata=OAuthClientMetadata(
            client_name="switchboard-test",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browse,
        callback_handler=callback,
    )
    out = {}
    async with httpx2.AsyncClient(auth=provider, timeout=30) as http:
        async with Client(streamable_http_client(URL, http_client=http)) as c:
            out["tools"] = sorted(t.name for t in (await c.list_tools()).tools)
            out["scope_before"] = storage.tokens.scope
            result = await c.call_tool("alpha__echo", {"said": "hello"})
            out["call"] = result.content[0].text
            out["scope_after"] = storage.tokens.scope
        # The token runs out: the next request refreshes it first.
        before = storage.tokens.access_token
        provider.context.token_expiry_time = time.time() - 1
        async with Client(streamable_http_client(URL, http_client=http)) as c:
            result = await c.call_tool("alpha__echo", {"said": "again"})
            out["call_after_refresh"] = result.content[0].text
        out["refreshed"] = storage.tokens.access_token != before
    out["client_id"] = storage.client.client_id
    out["scopes_seen"] = storage.scopes_seen
    print(json.dumps(out))


asyncio.run(main())
