//! The Lua scripts that change the cluster's state in Redis, each atomic on the server.
//!
//! Scripts on the control slot (`{idlegate}`) change a session hash and append to the event
//! stream in one step, and only when the hash changes: that is what makes every online and
//! offline event exactly-once, whoever sends it (the node itself, a node taking a uid over,
//! or the reaper of a dead node), and however often a batch is retried. Route scripts work
//! on one route key each, so they run on whichever master holds it.

use redis::Script;

/// Appends events with ids `<ms>-<n>`, `n` counting every event ever logged (kept in
/// `KEYS[3]` of the script that includes it, the stream being `KEYS[2]` and `ARGV[maxlen_at]`
/// its cap). `ms` never goes back, so ids only grow even if Redis's clock steps back.
const EMIT: &str = r#"
local function emitter(stream, last_key, maxlen)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local last = redis.call('HMGET', last_key, 'ms', 'n')
  local ms, n = tonumber(last[1] or '0'), tonumber(last[2] or '0')
  if n == 0 then
    local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    if top[1] then
      local a, b = string.match(top[1][1], '^(%d+)-(%d+)$')
      ms, n = tonumber(a), tonumber(b)
    end
  end
  local e = {}
  function e.emit(...)
    n = n + 1
    if now > ms then ms = now end
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, string.format('%d-%d', ms, n), ...)
  end
  function e.save()
    redis.call('HSET', last_key, 'ms', ms, 'n', n)
  end
  return e
end
"#;

/// Applies one batch of a member's session changes, in order.
///
/// KEYS: sessions of the member, the stream, the stream's last id, the member's applied
/// batch. ARGV: member, node name, batch number, stream cap, then five per change:
/// - `L uid session replaced at`: a login; `replaced` is `<member>|<session>` the route
///   named before (or empty): if that session is in its member's hash it ends as kicked;
///   if its member has not announced it yet (two logins raced), it is marked taken, so
///   the announcement never comes; either way its member is told through its inbox;
/// - `E uid session reason at`: a session ended;
/// - `D uid session payload at`: a DATA frame, logged only while its session is held.
///
/// Returns 0 for a batch already applied (a retry after a lost reply), else 1.
const APPLY: &str = r#"
local seq = tonumber(ARGV[3])
if seq <= tonumber(redis.call('GET', KEYS[4]) or '0') then return 0 end
redis.call('SET', KEYS[4], seq)
local ev = emitter(KEYS[2], KEYS[3], ARGV[4])
local me, node = ARGV[1], ARGV[2]
for i = 5, #ARGV, 5 do
  local kind, uid, s, x, at = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  if kind == 'L' then
    if x ~= '' then
      local m, ps = string.match(x, '^(.*)|([^|]*)$')
      if m and m ~= me then
        local key = '{idlegate}:sessions:' .. m
        if redis.call('HGET', key, uid) == ps then
          redis.call('HDEL', key, uid)
          ev.emit('t', 'offline', 'uid', uid, 's', ps, 'r', 'kicked', 'at', at)
        else
          -- Its member has not announced it yet: the announcement must not revive it.
          redis.call('HSET', '{idlegate}:taken:' .. m, uid, ps)
        end
        redis.call('XADD', '{idlegate}:inbox:' .. m, 'MAXLEN', '~', 100000, '*', 'op', 'kick', 'uid', uid, 's', ps)
      end
    end
    local taken = '{idlegate}:taken:' .. me
    if redis.call('HGET', taken, uid) == s then
      -- Taken over by a login elsewhere before this login reached Redis: nobody hears of
      -- it, and its node has been told to end it.
      redis.call('HDEL', taken, uid)
    elseif redis.call('HGET', KEYS[1], uid) ~= s then
      redis.call('HSET', KEYS[1], uid, s)
      ev.emit('t', 'online', 'uid', uid, 's', s, 'node', node, 'at', at)
    end
  elseif kind == 'E' then
    if redis.call('HGET', KEYS[1], uid) == s then
      redis.call('HDEL', KEYS[1], uid)
      ev.emit('t', 'offline', 'uid', uid, 's', s, 'r', x, 'at', at)
    end
  elseif kind == 'D' then
    if redis.call('HGET', KEYS[1], uid) == s then
      ev.emit('t', 'data', 'uid', uid, 'p', x, 'at', at)
    end
  end
end
ev.save()
return 1
"#;

/// Ends one session of another member as kicked, for the API's kick of a uid held
/// elsewhere: the event and the member's notice in one step, or nothing if it is gone.
///
/// KEYS: the member's sessions, the stream, its last id, the member's inbox. ARGV: uid,
/// session, stream cap, unix ms. Returns 1 if it ended the session.
const KICK: &str = r#"
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local ev = emitter(KEYS[2], KEYS[3], ARGV[3])
ev.emit('t', 'offline', 'uid', ARGV[1], 's', ARGV[2], 'r', 'kicked', 'at', ARGV[4])
ev.save()
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 100000, '*', 'op', 'kick', 'uid', ARGV[1], 's', ARGV[2])
return 1
"#;

/// Takes up to ARGV[1] sessions out of a dead member's hash, logging each offline as
/// `node_lost`; returns them as uid, session, uid, session, ...
///
/// KEYS: the member's sessions, the stream, its last id. ARGV: count, stream cap, unix ms.
const REAP: &str = r#"
local scan = redis.call('HSCAN', KEYS[1], 0, 'COUNT', ARGV[1])
local found = scan[2]
if #found == 0 then return {} end
local ev = emitter(KEYS[2], KEYS[3], ARGV[2])
for i = 1, #found, 2 do
  redis.call('HDEL', KEYS[1], found[i])
  ev.emit('t', 'offline', 'uid', found[i], 's', found[i + 1], 'r', 'node_lost', 'at', ARGV[3])
end
ev.save()
return found
"#;

/// Refreshes a member's lease, unless the member was reaped meanwhile.
///
/// KEYS: the lease, the members set, the member's reaped marker. ARGV: member, value, lease
/// in ms. Returns 1, or 0 if the member was reaped.
const LEASE: &str = r#"
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"#;

/// Points a route at a new login.
///
/// KEYS: the route. ARGV: `<member>|<session>`, since_ms. Returns `<member>|<session>` of
/// the session it replaced, or nil. Retried for the same login, it returns what the first
/// call replaced, kept in the route's last field.
const ROUTE_SET: &str = r#"
local old = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. '|'
if old and string.sub(old, 1, #mine) == mine then
  local replaced = string.match(old, '^[^|]*|[^|]*|[^|]*|(.*)$')
  if replaced and replaced ~= '' then return replaced end
  return false
end
local replaced = ''
if old then replaced = string.match(old, '^([^|]*|[^|]*)|') or '' end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. ARGV[2] .. '|' .. replaced)
if replaced == '' then return false end
return replaced
"#;

/// Deletes a route if it still names the given owner (`<member>|<session>|`), so a late
/// cleanup never erases a newer login. KEYS: the route. Returns 1 if deleted.
const ROUTE_DEL: &str = r#"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"#;

/// The scripts, loaded once per process.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub apply: Script,
    pub kick: Script,
    pub reap: Script,
    pub lease: Script,
    pub route_set: Script,
    pub route_del: Script,
}

// === impl Scripts ===

impl Scripts {
    pub(crate) fn new() -> Scripts {
        let with_emit = |body: &str| Script::new(&format!("{EMIT}\n{body}"));
        Scripts {
            apply: with_emit(APPLY),
            kick: with_emit(KICK),
            reap: with_emit(REAP),
            lease: Script::new(LEASE),
            route_set: Script::new(ROUTE_SET),
            route_del: Script::new(ROUTE_DEL),
        }
    }

    /// Every script, for `SCRIPT LOAD` on every master before pipelines call them by hash.
    pub(crate) fn all(&self) -> [&Script; 6] {
        [&self.apply, &self.kick, &self.reap, &self.lease, &self.route_set, &self.route_del]
    }
}
