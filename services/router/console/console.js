// The Switchboard console: the admin API in a browser. Written by hand, no
// build step. Everything the API returns is written as text (textContent),
// never as HTML. The admin token stays in this tab's session storage.
'use strict';

const TOKEN_KEY = 'switchboard-admin-token';
const PAGES = ['tenants', 'keys', 'upstreams', 'catalog', 'pins', 'calls', 'usage'];
const $ = (id) => document.getElementById(id);
let feed = null; // the live call feed's AbortController, while followed
let editing = null; // the registry entry the upstream form edits, if any

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function say(text, isError) {
  const status = $('status');
  status.textContent = text;
  status.className = isError ? 'error' : '';
}

class Refused extends Error {}

// One call of the admin API: the parsed JSON answer (null for none).
async function api(method, path, body) {
  const headers = { authorization: 'Bearer ' + token() };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    signOut('The admin token was refused: sign in again.');
    throw new Refused('signed out');
  }
  const text = await response.text();
  const value = text ? JSON.parse(text) : null;
  if (!response.ok) throw new Error((value && value.error) || response.status + ' ' + response.statusText);
  return value;
}

// Runs an action, saying how it went.
async function act(action, done) {
  try {
    await action();
    if (done) say(done);
  } catch (e) {
    if (!(e instanceof Refused)) say(e.message, true);
  }
}

function row(tbody, cells) {
  const tr = document.createElement('tr');
  for (const c of cells) {
    const td = document.createElement('td');
    if (c instanceof Node) td.append(c); else td.textContent = c === null || c === undefined ? '' : String(c);
    tr.append(td);
  }
  tbody.append(tr);
  return tr;
}

function button(label, onClick, accessibleName) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  if (accessibleName) b.setAttribute('aria-label', accessibleName);
  b.addEventListener('click', onClick);
  return b;
}

function when(ms) {
  return ms ? new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '';
}

function clear(tbody) {
  tbody.replaceChildren();
}

// ---- Pages ------------------------------------------------------------

async function tenantNames() {
  const { tenants } = await api('GET', '/v1/tenants');
  return tenants.map((t) => t.name);
}

async function fillTenants(select) {
  const names = await tenantNames();
  const kept = select.value;
  select.replaceChildren(...names.map((n) => new Option(n, n)));
  if (names.includes(kept)) select.value = kept;
}

const load = {
  async tenants() {
    const { tenants } = await api('GET', '/v1/tenants');
    const tbody = $('tenants-table').tBodies[0];
    clear(tbody);
    for (const t of tenants) {
      const pinning = t.pinning ? (t.pinning.approve || 'first_sight') + ', ' + (t.pinning.on_change || 'withhold') : 'off';
      const actions = t.source === 'database'
        ? button('Delete', () => act(async () => {
          if (!confirm('Delete tenant ' + t.name + ' and its keys?')) return;
          await api('DELETE', '/v1/tenants/' + encodeURIComponent(t.name));
          await load.tenants();
        }, 'Deleted tenant ' + t.name + '.'), 'Delete tenant ' + t.name)
        : '';
      row(tbody, [t.name, t.source, (t.upstreams || []).join(', '), t.discovery || 'full', pinning, actions]);
    }
  },

  async keys() {
    await fillTenants($('keys-tenant'));
    await showKeys();
  },

  async upstreams() {
    const { upstreams, registry } = await api('GET', '/v1/upstreams');
    const registered = new Set((registry || []).map((r) => r.name));
    const tbody = $('upstreams-table').tBodies[0];
    clear(tbody);
    for (const u of upstreams || []) {
      const actions = document.createElement('span');
      if (registered.has(u.name)) {
        const entry = registry.find((r) => r.name === u.name);
        actions.append(button('Edit', () => {
          editing = entry;
          $('upstream-name').value = u.name;
          const spec = entry.spec || {};
          $('upstream-url').value = spec.urls ? spec.urls.join(', ') : (spec.url || '');
          $('upstream-prefix').value = (entry.spec && entry.spec.prefix) || '';
          $('upstream-header').value = '';
          $('upstream-url').focus();
        }, 'Edit upstream ' + u.name));
        actions.append(button('Remove', () => act(async () => {
          if (!confirm('Remove upstream ' + u.name + ' from every router?')) return;
          await api('DELETE', '/v1/upstreams/' + encodeURIComponent(u.name));
          await load.upstreams();
        }, 'Removed upstream ' + u.name + '.'), 'Remove upstream ' + u.name));
      }
      row(tbody, [u.name, u.source, u.url || u.transport, u.up ? 'up' : 'down', u.protocol_version,
        u.tools, u.last_error, actions]);
    }
  },

  async catalog() {
    await fillTenants($('catalog-tenant'));
    await searchCatalog();
  },

  async pins() {
    const { pins, next_offset: more } = await api('GET', '/v1/pins?waiting=true');
    const list = $('pins-list');
    list.replaceChildren();
    const note = (text) => {
      const p = document.createElement('p');
      p.textContent = text;
      list.append(p);
    };
    if (pins.length === 0) note('Nothing waits for a decision.');
    for (const pin of pins) list.append(pinCard(pin));
    if (more != null) note('More definitions wait than this page shows: decide these, and the next appear.');
  },

  async calls() {
    follow();
  },

  async usage() {
    await showUsage();
  },
};

async function showKeys() {
  const tenant = $('keys-tenant').value;
  const tbody = $('keys-table').tBodies[0];
  // Cleared once the answer is in: two loads at once leave one list.
  const { keys } = tenant ? await api('GET', '/v1/tenants/' + encodeURIComponent(tenant) + '/keys') : { keys: [] };
  if (tenant !== $('keys-tenant').value) return;
  clear(tbody);
  for (const k of keys) {
    const revoked = k.revoked_at_ms !== null && k.revoked_at_ms !== undefined;
    const actions = revoked ? '' : button('Revoke', () => act(async () => {
      if (!confirm('Revoke key ' + k.prefix + '? Its next request is refused.')) return;
      await api('DELETE', '/v1/keys/' + encodeURIComponent(k.prefix));
      await showKeys();
    }, 'Revoked key ' + k.prefix + '.'), 'Revoke key ' + k.prefix);
    row(tbody, [k.prefix, when(k.created_at_ms), when(k.expires_at_ms) || 'never', revoked ? 'revoked ' + when(k.revoked_at_ms) : 'active', actions]);
  }
}

function hideNewKey() {
  $('key-new-value').textContent = '';
  $('key-new').hidden = true;
}

async function searchCatalog() {
  const tenant = $('catalog-tenant').value;
  const tbody = $('catalog-table').tBodies[0];
  if (!tenant) {
    clear(tbody);
    return;
  }
  const q = $('catalog-query').value.trim();
  const path = '/v1/catalog?tenant=' + encodeURIComponent(tenant) + (q ? '&q=' + encodeURIComponent(q) : '');
  const { tools } = await api('GET', path);
  clear(tbody);
  for (const t of tools) row(tbody, [t.name, t.upstream, t.state, t.description]);
  say(tools.length + ' tools' + (q ? ' for “' + q + '”' : '') + '.');
}

function show(value) {
  return value === null || value === undefined ? '(none)' : typeof value === 'string' ? value : JSON.stringify(value, null, 2);
}

function pinCard(pin) {
  const card = document.createElement('article');
  card.className = 'pin';
  const h = document.createElement('h3');
  h.textContent = pin.tool + ' — tenant ' + pin.tenant + ', upstream ' + pin.upstream;
  card.append(h);
  const since = document.createElement('p');
  since.textContent = (pin.approved_digest ? 'Changed since it was approved' : 'Never approved') + '; seen ' + when(pin.pending_since_ms) + '.';
  card.append(since);
  const table = document.createElement('table');
  table.className = 'diff';
  const caption = table.createCaption();
  caption.textContent = 'What changed in ' + pin.tool;
  const head = table.createTHead().insertRow();
  for (const name of ['Field', 'Approved', 'New']) {
    const th = document.createElement('th');
    th.scope = 'col';
    th.textContent = name;
    head.append(th);
  }
  const body = table.createTBody();
  for (const change of pin.changes) {
    const tr = body.insertRow();
    const field = document.createElement('th');
    field.scope = 'row';
    field.textContent = change.field;
    tr.append(field);
    for (const [value, cls] of [[change.approved, 'old'], [change.pending, 'new']]) {
      const td = tr.insertCell();
      const pre = document.createElement('pre');
      pre.className = cls;
      pre.textContent = show(value);
      td.append(pre);
    }
  }
  card.append(table);
  const decide = (what) => act(async () => {
    await api('POST', '/v1/pins/' + what, { tenant: pin.tenant, tool: pin.tool, digest: pin.pending_digest, by: 'console' });
    await load.pins();
  }, (what === 'approve' ? 'Approved ' : 'Rejected ') + pin.tool + ' for ' + pin.tenant + '.');
  card.append(button('Approve', () => decide('approve'), 'Approve the new definition of ' + pin.tool + ' for ' + pin.tenant));
  card.append(button('Reject', () => decide('reject'), 'Reject the new definition of ' + pin.tool + ' for ' + pin.tenant));
  return card;
}

// The live call feed: Server-Sent Events read from a fetch (EventSource
// cannot send the token).
async function follow() {
  if (feed) return;
  feed = new AbortController();
  const state = $('calls-state');
  const tbody = $('calls-table').tBodies[0];
  try {
    const response = await fetch('/v1/calls/stream', {
      headers: { authorization: 'Bearer ' + token() }, signal: feed.signal,
    });
    if (!response.ok) throw new Error('the call feed: ' + response.status);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += value;
      let end;
      while ((end = buffered.indexOf('\n\n')) >= 0) {
        const block = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        const event = (block.match(/^event: (.*)$/m) || [])[1];
        const data = (block.match(/^data: (.*)$/m) || [])[1];
        if (event === 'ready') state.textContent = 'Following calls as they finish.';
        if (event === 'missed') state.textContent = 'Some calls were missed (this page fell behind).';
        if (event === 'call') {
          const c = JSON.parse(data);
          const tr = row(tbody, [when(c.at_ms), c.tenant, c.method, c.target, c.upstream, c.outcome, (c.latency_us / 1000).toFixed(1)]);
          tbody.prepend(tr);
          while (tbody.rows.length > 200) tbody.deleteRow(-1);
        }
      }
    }
    state.textContent = 'The feed ended.';
  } catch (e) {
    if (e.name !== 'AbortError') state.textContent = 'The feed stopped: ' + e.message;
  } finally {
    feed = null;
  }
}

function unfollow() {
  if (feed) feed.abort();
  feed = null;
  $('calls-state').textContent = 'Not following.';
}

async function showUsage() {
  const from = $('usage-from').value;
  const group = $('usage-group').value;
  const { usage } = await api('GET', '/v1/usage?from=' + encodeURIComponent(from) + '&group_by=' + encodeURIComponent(group));
  const tbody = $('usage-table').tBodies[0];
  clear(tbody);
  const chart = $('usage-chart');
  chart.replaceChildren();
  const max = Math.max(1, ...usage.map((u) => u.calls));
  const barHeight = 22;
  chart.setAttribute('height', String(Math.max(40, usage.length * (barHeight + 6))));
  usage.forEach((u, i) => {
    const label = u.group.map((g) => g === null ? '—' : g).join(' / ');
    row(tbody, [label, u.calls, u.errors, u.request_bytes, u.response_bytes, u.calls ? (u.total_latency_us / u.calls / 1000).toFixed(2) : '']);
    const ns = 'http://www.w3.org/2000/svg';
    const bar = document.createElementNS(ns, 'rect');
    bar.setAttribute('x', '260');
    bar.setAttribute('y', String(i * (barHeight + 6)));
    bar.setAttribute('height', String(barHeight));
    bar.setAttribute('width', String(Math.max(2, (440 * u.calls) / max)));
    bar.setAttribute('class', 'bar');
    const title = document.createElementNS(ns, 'title');
    title.textContent = label + ': ' + u.calls + ' calls';
    bar.append(title);
    const text = document.createElementNS(ns, 'text');
    text.setAttribute('x', '0');
    text.setAttribute('y', String(i * (barHeight + 6) + 16));
    text.textContent = label.slice(0, 36) + ' (' + u.calls + ')';
    chart.append(bar, text);
  });
  say(usage.length ? usage.length + ' groups.' : 'No calls in that time.');
}

// ---- Navigation and sign-in -------------------------------------------

function current() {
  const name = location.hash.slice(1);
  return PAGES.includes(name) ? name : 'tenants';
}

function route() {
  const signedIn = token() !== null;
  $('nav').hidden = !signedIn;
  const page = signedIn ? current() : 'signin';
  for (const section of document.querySelectorAll('.page')) section.hidden = section.id !== 'page-' + page;
  for (const link of document.querySelectorAll('#nav a')) {
    if (link.getAttribute('href') === '#' + page) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  if (page !== 'calls') unfollow();
  if (page !== 'keys') hideNewKey();
  $('page-' + page).querySelector('h2').focus();
  if (signedIn) act(() => load[page]());
}

function signOut(message) {
  unfollow();
  sessionStorage.removeItem(TOKEN_KEY);
  say(message || 'Signed out.');
  route();
}

document.addEventListener('DOMContentLoaded', () => {
  $('signin-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const candidate = $('signin-token').value;
    const response = await fetch('/v1/tenants', { headers: { authorization: 'Bearer ' + candidate } });
    if (!response.ok) {
      say(response.status === 401 ? 'That token was refused.' : 'The admin API answered ' + response.status + '.', true);
      return;
    }
    $('signin-token').value = '';
    sessionStorage.setItem(TOKEN_KEY, candidate);
    say('Signed in.');
    if (!location.hash) location.hash = '#tenants'; else route();
  });
  $('sign-out').addEventListener('click', () => signOut());

  $('tenant-form').addEventListener('submit', (e) => {
    e.preventDefault();
    act(async () => {
      const name = $('tenant-name').value.trim();
      const upstreams = $('tenant-upstreams').value.split(',').map((s) => s.trim()).filter(Boolean);
      const body = { name, upstreams };
      if ($('tenant-pinning').value) body.pinning = { approve: $('tenant-pinning').value };
      await api('POST', '/v1/tenants', body);
      $('tenant-name').value = '';
      await load.tenants();
      say('Created tenant ' + name + '.');
    });
  });

  $('keys-tenant').addEventListener('change', () => { hideNewKey(); act(showKeys); });
  $('key-create').addEventListener('click', () => act(async () => {
    const tenant = $('keys-tenant').value;
    if (!tenant) throw new Error('Choose a tenant first.');
    const created = await api('POST', '/v1/tenants/' + encodeURIComponent(tenant) + '/keys', {});
    $('key-new-value').textContent = created.key;
    $('key-new').hidden = false;
    $('key-new-done').focus();
    await showKeys();
    say('Created key ' + created.prefix + ' for ' + tenant + '. It is shown once.');
  }));
  $('key-new-done').addEventListener('click', () => { hideNewKey(); $('key-create').focus(); });

  $('upstream-form').addEventListener('submit', (e) => {
    e.preventDefault();
    act(async () => {
      const name = $('upstream-name').value.trim();
      // An edit keeps the entry's other settings; its sealed headers cannot
      // be read back, so changing an entry that has some means giving them.
      const before = editing && editing.name === name ? editing : null;
      const spec = before ? { ...before.spec } : { transport: 'http' };
      const url = $('upstream-url').value.trim();
      if (spec.urls) spec.urls = url.split(',').map((s) => s.trim()).filter(Boolean); else spec.url = url;
      const prefix = $('upstream-prefix').value.trim();
      if (prefix) spec.prefix = prefix; else delete spec.prefix;
      const headers = {};
      for (const line of $('upstream-header').value.split('\n').filter((l) => l.trim())) {
        const at = line.indexOf(':');
        if (at < 1) throw new Error('Write each header on a line of its own, as Name: value.');
        headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
      }
      // The headers given replace all the entry's sealed ones: each must be given.
      const given = Object.keys(headers).map((h) => h.toLowerCase());
      const missing = ((before && before.headers) || []).filter((h) => !given.includes(h.toLowerCase()));
      if (missing.length) {
        throw new Error('Upstream ' + name + ' has sealed headers (' + missing.join(', ') + '), which cannot be read back: give them again to change it.');
      }
      if (given.length) spec.headers = headers;
      await api('PUT', '/v1/upstreams/' + encodeURIComponent(name), spec);
      $('upstream-header').value = '';
      editing = null;
      say('Saved upstream ' + name + '; every router serves it within seconds.');
      await load.upstreams();
    });
  });

  $('catalog-form').addEventListener('submit', (e) => { e.preventDefault(); act(searchCatalog); });
  $('catalog-tenant').addEventListener('change', () => act(searchCatalog));
  $('usage-form').addEventListener('submit', (e) => { e.preventDefault(); act(showUsage); });

  window.addEventListener('hashchange', route);
  route();
});
