// A real OAuth 2.1 authorization server for the tests (oidc-provider), on
// loopback, port of its own choosing (it prints "authorization server
// listening on http://ADDR/"). What it offers:
//   - metadata (RFC 8414 and OpenID discovery), a JWKS (RS256 keys made at
//     start; POST /rotate adds a new signing key in front);
//   - dynamic client registration (RFC 7591; a client may later ask for any
//     scope, whatever it registered with), authorization code with PKCE
//     (required), refresh tokens, client credentials, introspection and
//     revocation;
//   - resource indicators (RFC 8707): a token for any http://127.0.0.1:PORT/mcp
//     resource has that URL as its `aud`; a JWT, unless the client's name
//     contains "opaque" (then an opaque token, which can be introspected
//     and revoked);
//   - no login page: GET /interaction/:uid logs in the user named by the
//     authorization request's `login_hint` (else TEST_USER, default "alice")
//     and consents to exactly the scopes asked for;
//   - every access token carries an `org` claim (ORG, default "acme");
//   - GET /stats: how many tokens each grant type has issued;
//   - token exchange (RFC 8693), registered as an extension grant: a JWT
//     access token of this server (the subject token) traded by client
//     `exchanger` for one of another resource, for the same user (`sub`),
//     with at most the subject token's scopes.
// Confidential clients: `router` / `router-secret` (introspection),
// `machine`, `machine2` and `machine-opaque` (opaque tokens), each with
// secret `machine-secret` (client credentials), and `exchanger` /
// `exchanger-secret` (token exchange).
import http from 'node:http';
import { createPublicKey, generateKeyPairSync, verify } from 'node:crypto';
import Provider, { errors } from 'oidc-provider';

const RESOURCE = /^http:\/\/127\.0\.0\.1:\d+\/mcp$/;
const SCOPES = ['mcp:list', 'mcp:call', 'mcp:read'];
const ORG = process.env.ORG || 'acme';
const EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';

let generation = 0;
function signingKey() {
  generation += 1;
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid: `key-${generation}`, use: 'sig', alg: 'RS256' };
}

const server = http.createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

function configuration(keys) {
  return {
    clients: [
      { client_id: 'router', client_secret: 'router-secret', grant_types: [], response_types: [], redirect_uris: [] },
      ...['machine', 'machine2', 'machine-opaque'].map((id) => ({
        client_id: id, client_name: id, client_secret: 'machine-secret', grant_types: ['client_credentials'],
        response_types: [], redirect_uris: [],
      })),
      {
        client_id: 'exchanger', client_secret: 'exchanger-secret', grant_types: [EXCHANGE],
        response_types: [], redirect_uris: [],
      },
    ],
    jwks: { keys },
    cookies: { keys: ['test-only-cookie-key'] },
    scopes: ['openid', 'offline_access', ...SCOPES],
    pkce: { required: () => true },
    clientDefaults: { grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'] },
    features: {
      devInteractions: { enabled: false },
      registration: { enabled: true },
      introspection: { enabled: true },
      revocation: { enabled: true },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: async (ctx, client, oneOf) => oneOf,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (ctx, resource, client) => {
          if (!RESOURCE.test(resource)) throw new errors.InvalidTarget();
          const opaque = (client?.clientName || '').includes('opaque');
          return {
            scope: SCOPES.join(' '),
            audience: resource,
            accessTokenTTL: Number(process.env.TOKEN_TTL || 3600),
            accessTokenFormat: opaque ? 'opaque' : 'jwt',
            ...(opaque ? {} : { jwt: { sign: { alg: 'RS256' } } }),
          };
        },
      },
    },
    extraTokenClaims: async () => ({ org: ORG }),
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
    findAccount: async (ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
    // Consent to what was asked: the OpenID scopes, and of each resource's
    // scopes those requested (so a client can ask for more later: step-up).
    loadExistingGrant: async (ctx) => {
      const asked = new Set(String(ctx.oidc.params.scope || '').split(' '));
      const grant = new ctx.oidc.provider.Grant({
        clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope([...ctx.oidc.requestParamOIDCScopes].join(' '));
      for (const indicator of Object.keys(ctx.oidc.resourceServers || {})) {
        grant.addResourceScope(indicator, SCOPES.filter((s) => asked.has(s)).join(' '));
      }
      await grant.save();
      return grant;
    },
  };
}

let keys = [signingKey()];
const issued = {};
let provider = build(keys);

// The claims of `jwt` if this server signed it (any of its keys), for this
// issuer, and it has not expired; else null.
function verified(jwt) {
  const [head, body, signature] = String(jwt || '').split('.');
  if (!signature) return null;
  try {
    const header = JSON.parse(Buffer.from(head, 'base64url'));
    const key = keys.find((k) => k.kid === header.kid);
    if (!key || header.alg !== 'RS256') return null;
    const good = verify('RSA-SHA256', Buffer.from(`${head}.${body}`),
      createPublicKey({ key, format: 'jwk' }), Buffer.from(signature, 'base64url'));
    const claims = JSON.parse(Buffer.from(body, 'base64url'));
    if (!good || claims.iss !== issuer || !(claims.exp * 1000 > Date.now())) return null;
    return claims;
  } catch {
    return null;
  }
}

// The token exchange grant: the subject token's user, a token of the
// requested resource, no wider scope than the subject token's.
async function tokenExchange(ctx) {
  const { client, params, provider: p } = ctx.oidc;
  if (params.subject_token_type !== ACCESS_TOKEN) {
    throw new errors.InvalidRequest(`subject_token_type must be ${ACCESS_TOKEN}`);
  }
  if (params.requested_token_type && params.requested_token_type !== ACCESS_TOKEN) {
    throw new errors.InvalidRequest('only access tokens are issued');
  }
  const subject = verified(params.subject_token);
  if (!subject) throw new errors.InvalidGrant('the subject token is not a valid token of this server');
  if (!RESOURCE.test(params.resource || '')) throw new errors.InvalidTarget();
  const held = String(subject.scope || '').split(' ').filter(Boolean);
  const asked = params.scope ? params.scope.split(' ') : held;
  if (asked.some((s) => !held.includes(s))) throw new errors.InvalidScope('wider than the subject token', params.scope);
  const token = new p.AccessToken({ accountId: subject.sub, client, scope: asked.join(' '), gty: 'token_exchange' });
  token.resourceServer = new p.ResourceServer(params.resource, {
    scope: SCOPES.join(' '), audience: params.resource, accessTokenTTL: Number(process.env.TOKEN_TTL || 3600),
    accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } },
  });
  const value = await token.save();
  ctx.body = {
    access_token: value, issued_token_type: ACCESS_TOKEN, token_type: 'Bearer',
    expires_in: token.expiration, scope: token.scope,
  };
}

function build(keys) {
  const p = new Provider(issuer, configuration(keys));
  p.on('grant.success', (ctx) => {
    const type = ctx.oidc.params.grant_type;
    issued[type] = (issued[type] || 0) + 1;
  });
  p.registerGrantType(EXCHANGE, tokenExchange, [
    'subject_token', 'subject_token_type', 'requested_token_type', 'resource', 'audience', 'scope',
    'actor_token', 'actor_token_type',
  ]);
  // An authorization request without a scope would be denied: ask for listing.
  p.use(async (ctx, next) => {
    if (ctx.path === '/auth' && ctx.method === 'GET' && !ctx.query.scope) {
      ctx.query = { ...ctx.query, scope: 'mcp:list mcp:call' };
    }
    return next();
  });
  p.use(async (ctx, next) => {
    const uid = ctx.path.match(/^\/interaction\/([^/]+)$/);
    if (!uid || ctx.method !== 'GET') return next();
    const details = await p.interactionDetails(ctx.req, ctx.res);
    const user = details.params.login_hint || process.env.TEST_USER || 'alice';
    const result = details.prompt.name === 'login' ? { login: { accountId: user } } : { consent: {} };
    const to = await p.interactionResult(ctx.req, ctx.res, result, { mergeWithLastSubmission: true });
    ctx.status = 303;
    ctx.redirect(to);
  });
  return p;
}

server.on('request', (req, res) => {
  if (req.method === 'GET' && req.url === '/stats') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ issued }));
    return;
  }
  if (req.method === 'POST' && req.url === '/rotate') {
    // A new signing key in front; the old one stays published (tokens it
    // signed stay good). The in-memory state (clients, grants) starts over.
    keys = [signingKey(), ...keys];
    provider = build(keys);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kid: keys[0].kid }));
    return;
  }
  if (req.method === 'POST' && req.url === '/reg') {
    // Registration: the client's `scope` is dropped, so that it may ask for
    // any of the server's scopes later (oidc-provider would otherwise hold
    // it to those it registered with, and no step-up could widen them).
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => {
      try {
        const body = JSON.parse(Buffer.concat(chunks).toString() || '{}');
        delete body.scope;
        req.body = body;
      } catch {
        req.body = {};
      }
      provider.callback()(req, res);
    });
    return;
  }
  provider.callback()(req, res);
});

console.log(`authorization server listening on ${issuer}/`);
