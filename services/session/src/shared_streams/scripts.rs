//! The Lua scripts of the shared streams: each operation on a stream is one
//! script, so it is atomic and one round trip.

/// Appends one event: KEYS log, meta, dedupe; ARGV seq (`''`: the next),
/// field (`m` or `e`), value, max events, ttl ms, wake channel prefix, wake
/// payload, owner replica (`''`: none), dedupe ms (`''`: none), the
/// upstream's resume point after this event (`''`: none). Never an
/// error (a failed script would fail its whole pipeline): an entry id
/// already written (a retried write) is skipped. Returns 1 when written,
/// 0 when skipped as a duplicate announcement, 2 when refused: a stream 0
/// already holds `max events` that no reader has sent (trimming would
/// drop one unread).
pub(super) const APPEND: &str = r"
if ARGV[9] ~= '' then
  if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[9]) then return 0 end
end
if ARGV[1] == '' then
  local d = redis.call('HGET', KEYS[2], 'delivered')
  local unread
  if d then
    unread = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0') - tonumber(d)
  else
    unread = redis.call('XLEN', KEYS[1])
  end
  if unread >= tonumber(ARGV[4]) then return 2 end
end
local n
if ARGV[1] == '' then
  if redis.call('HEXISTS', KEYS[2], 'seq') == 0 then
    local t = redis.call('TIME')
    redis.call('HSET', KEYS[2], 'seq', string.format('%.0f', t[1] * 1000000 + math.floor(t[2] / 1000) * 1000))
  end
  n = redis.call('HINCRBY', KEYS[2], 'seq', 1)
else
  n = tonumber(ARGV[1])
  local top = tonumber(redis.call('HGET', KEYS[2], 'seq') or '-1')
  if n > top then redis.call('HSET', KEYS[2], 'seq', ARGV[1]) end
end
redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '1-' .. string.format('%.0f', n), ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
local t = redis.call('TIME')
redis.call('HSET', KEYS[2], 'open', '1', 'last', t[1] * 1000 + math.floor(t[2] / 1000))
if ARGV[8] ~= '' then redis.call('HSET', KEYS[2], 'owner', ARGV[8]) end
if ARGV[10] ~= '' then redis.call('HSET', KEYS[2], 'upe', ARGV[10]) end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
local reader = redis.call('HGET', KEYS[2], 'reader')
if reader then
  redis.call('PUBLISH', ARGV[6] .. string.match(reader, '^[^:]+'), ARGV[7])
end
return 1
";

/// Marks a stream answered, resumable a while longer: KEYS meta, log; ARGV
/// ttl ms, wake prefix, payload.
pub(super) const CLOSE: &str = r"
redis.call('HSET', KEYS[1], 'closed', '1', 'open', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
local reader = redis.call('HGET', KEYS[1], 'reader')
if reader then
  redis.call('PUBLISH', ARGV[2] .. string.match(reader, '^[^:]+'), ARGV[3])
end
return 1
";

/// Takes a stream over for a new reader: KEYS meta; ARGV token, ttl ms,
/// wake prefix, payload, must exist (`1`). Returns false for a stream that
/// must exist and does not, else `{delivered}` (`''` if none).
pub(super) const OPEN: &str = r"
if ARGV[5] == '1' and redis.call('HGET', KEYS[1], 'open') ~= '1' then return false end
local old = redis.call('HGET', KEYS[1], 'reader')
redis.call('HSET', KEYS[1], 'reader', ARGV[1])
if redis.call('HGET', KEYS[1], 'closed') ~= '1' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if old and old ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[3] .. string.match(old, '^[^:]+'), ARGV[4])
end
return {redis.call('HGET', KEYS[1], 'delivered') or ''}
";

/// One read: KEYS log, meta; ARGV token, after (`''`: from the start),
/// count, ttl ms, heartbeat key prefix, orphan ms, request stream (`1`).
/// Returns `{0}` when another reader took the stream over, else `{1,
/// closed, entries, abandoned}`. An open stream's keys live on while it is
/// read. If `after` is beyond a GET stream's numbering, the numbering
/// restarted (Redis lost the stream): everything is read. A request
/// stream is numbered by the replica serving it, never restarted: `after`
/// beyond it is the copy lagging behind what the client got, and the read
/// waits for what follows.
pub(super) const READ: &str = r"
if redis.call('HGET', KEYS[2], 'reader') ~= ARGV[1] then return {0} end
local closed = redis.call('HGET', KEYS[2], 'closed') == '1'
if not closed then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
local start = '-'
if ARGV[2] ~= '' then
  local top = tonumber(redis.call('HGET', KEYS[2], 'seq') or '-1')
  if ARGV[7] == '1' or tonumber(ARGV[2]) <= top then start = '(1-' .. ARGV[2] end
end
local entries = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ARGV[3])
local abandoned = 0
local owner = redis.call('HGET', KEYS[2], 'owner')
if not closed and owner and redis.call('EXISTS', ARGV[5] .. owner) == 0 then
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  if now - tonumber(redis.call('HGET', KEYS[2], 'last') or '0') > tonumber(ARGV[6]) then abandoned = 1 end
end
return {1, closed and 1 or 0, entries, abandoned}
";

/// Records what a reader sent, for the next reader without `Last-Event-ID`
/// (never moving back, and only by the stream's reader): KEYS meta; ARGV
/// seq, token.
pub(super) const DELIVERED: &str = r"
if redis.call('HGET', KEYS[1], 'reader') ~= ARGV[2] then return 0 end
local d = tonumber(redis.call('HGET', KEYS[1], 'delivered') or '-1')
if tonumber(ARGV[1]) > d then redis.call('HSET', KEYS[1], 'delivered', ARGV[1]) end
return 1
";

/// Takes over an abandoned request stream to continue it: KEYS meta; ARGV
/// this replica, heartbeat key prefix, orphan ms. `{1, origin, resume
/// point, last seq}` when taken (this replica owns it now), `{2}` when a
/// live replica owns it (maybe one that took it over first), `{0}` when it
/// cannot be continued (answered, or nothing says where it came from).
pub(super) const TAKE_OVER: &str = r"
if redis.call('HGET', KEYS[1], 'closed') == '1' then return {0} end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and redis.call('EXISTS', ARGV[2] .. owner) == 1 then return {2} end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if now - tonumber(redis.call('HGET', KEYS[1], 'last') or '0') <= tonumber(ARGV[3]) then return {2} end
local origin = redis.call('HGET', KEYS[1], 'origin')
if not origin then return {0} end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'last', now)
return {1, origin, redis.call('HGET', KEYS[1], 'upe') or '', redis.call('HGET', KEYS[1], 'seq') or '-1'}
";
