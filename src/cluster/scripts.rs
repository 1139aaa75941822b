//! The Lua scripts that change the cluster's state in Redis, each atomic on the server.
//!
//! Scripts on the control slot (`{idlegate}`) change a session hash and append to the event
//! stream in one step, and only when the hash changes: that is what makes every online and
//! offline event exactly-once, whoever sends it (the node itself, a node taking a uid over,
//! or the reaper of a dead node), and however often a batch is retried. Every script that
//! writes under a member first checks that member's reaped marker: a reaped member is
//! fenced off for good. Route scripts work on one route key each, so they run on whichever
//! master holds it.

use redis::Script;

/// The event stream's writer, included by every script that logs events.
///
/// Ids are `<ms>-<n>`, `n` counting every event ever logged (kept in the hash `last_key`
/// with the stream's byte count and its epoch). `ms` never goes back, so ids only grow
/// even if Redis's clock steps back. The stream is trimmed to `maxlen` entries and
/// `maxbytes` bytes (field names and values plus 32 per entry), oldest first; the byte
/// count is kept exactly because this writer trims by itself instead of `XADD MAXLEN`.
/// Each entry's size is kept in a list beside the stream (`<stream>:sizes`, in the same
/// order), so trimming pops sizes and cuts the stream with `XTRIM`: it costs what it trims
/// and never reads a payload. Entries older than the list (a stream written before it
/// existed) are read once, the old way, as they reach the front.
///
/// The epoch names one unbroken history of the stream. When the hash is missing (Redis
/// restarted empty, or a failover lost it) or a caller saw other signs of lost writes
/// (`e.renew()`), a new epoch begins with an entry `t=epoch`: readers report it to their
/// consumers as a gap of unknown size (`earlier_stream`), never as an unbroken sequence.
pub(crate) const EMIT: &str = r#"
-- Sorted set uid -> the stamp of its last user event: the floor of its session events'.
local USER_AT = '{idlegate}:user_at'
-- How long a floor is kept: far longer than any batch is held back (a node cut off that
-- long was reaped, and its sessions ended, long before), short enough that the set holds
-- only the uids of the last hour.
local FLOOR_KEEP_MS = 3600000
-- Hash uid -> its status (STATUS frames, issue 52) while it is online as a user: set by
-- `APPLY` beside its `status` event, cleared with its `user_offline`, read by `PRESENCE_OF`.
local STATUS = '{idlegate}:status'

local function emitter(stream, last_key, maxlen, maxbytes)
  maxlen, maxbytes = tonumber(maxlen), tonumber(maxbytes)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local last = redis.call('HMGET', last_key, 'ms', 'n', 'bytes', 'epoch', 'sized', 'epoch_at')
  local ms, n, bytes = tonumber(last[1] or '0'), tonumber(last[2] or '0'), tonumber(last[3] or '0')
  local epoch = last[4]
  -- The id of the current epoch's marker: the webhook relay starts no later than it
  -- (`TURN_FROM`).
  local epoch_at = last[6]
  -- The sizes of the newest `sized` entries, oldest first: a list whose elements are the
  -- sizes one call added (one element a call, however many it added), each as four bytes,
  -- big-endian: packing is far cheaper than formatting numbers as text in Lua.
  local sizes = stream .. ':sizes'
  local sized = tonumber(last[5] or '0')
  -- Nothing known to be listed (the first call, a stream from before the list, or a hash
  -- Redis lost): whatever the list holds describes nothing.
  if sized == 0 then redis.call('DEL', sizes) end
  -- The sizes of the entries this script added, listed in one element by `save`.
  local added = {}
  local function size(fields)
    local s = 32
    for i = 1, #fields do s = s + #fields[i] end
    return s
  end
  local function add(fields)
    n = n + 1
    if now > ms then ms = now end
    local b = size(fields)
    bytes = bytes + b
    redis.call('XADD', stream, string.format('%d-%d', ms, n), unpack(fields))
    added[#added + 1] = b
  end
  local e = {}
  local renewed = false
  function e.renew()
    if renewed then return end
    renewed = true
    -- A new epoch must differ from the one it replaces even within one millisecond.
    local fresh = now
    if tonumber(epoch or '0') >= fresh then fresh = tonumber(epoch) + 1 end
    epoch = string.format('%d', fresh)
    add({'t', 'epoch', 'e', epoch})
    epoch_at = string.format('%d-%d', ms, n)
  end
  if not epoch then
    local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    if top[1] then
      local a, b = string.match(top[1][1], '^(%d+)-(%d+)$')
      ms, n = math.max(ms, tonumber(a)), math.max(n, tonumber(b))
    end
    e.renew()
  end
  function e.emit(...)
    add({...})
  end
  function e.skip(k)
    n = n + k
  end
  function e.epoch()
    return epoch
  end
  -- The number of the last event logged: a node that saw a higher one in this epoch knows
  -- that Redis lost writes (a failover to a replica that lagged).
  function e.n()
    return n
  end
  function e.now()
    return now
  end
  -- The time the next event is logged at, in ms: its id's. Never less than an earlier
  -- event's, whatever the nodes' clocks say: user events are stamped with it, so a uid's
  -- `at_ms` never goes back when one node's writes reach Redis late (issue 48).
  function e.stamp()
    return string.format('%d', math.max(now, ms))
  end
  -- The stamp of a user event of `uid`, recorded as the uid's floor: none of its session
  -- events logged later is stamped earlier (issue 49, promise 3), even when a node's writes
  -- reach Redis late and carry that node's older times. Floors older than `FLOOR_KEEP_MS`
  -- are pruned by `RELEASE`.
  function e.user_stamp(uid)
    local stamp = e.stamp()
    redis.call('ZADD', USER_AT, stamp, uid)
    return stamp
  end
  -- `uid`'s `user_offline`: its last session ended for reason `r` at `ended` (its floor
  -- when unknown); its status ends with it.
  function e.user_offline(uid, r, ended)
    local stamp = e.user_stamp(uid)
    redis.call('HDEL', STATUS, uid)
    add({'t', 'user_offline', 'uid', uid, 'r', r, 'e', ended or stamp, 'at', stamp})
  end
  -- `at` (a session event's time, by its node's clock), raised to `uid`'s floor.
  function e.floor(uid, at)
    local f = tonumber(redis.call('ZSCORE', USER_AT, uid) or '0')
    if f > (tonumber(at) or 0) then return string.format('%d', f) end
    return at
  end
  -- Takes sizes from the front of the list while `more(taken)` holds, taking each from
  -- `bytes`; returns how many it took. Reads only the elements it takes from, and writes
  -- back the rest of the last one.
  local function take_sizes(more)
    local taken = 0
    while more(taken) do
      local head = redis.call('LINDEX', sizes, 0)
      if not head then break end
      local rest = nil
      for at = 1, #head, 4 do
        if not more(taken) then
          rest = string.sub(head, at)
          break
        end
        bytes = bytes - struct.unpack('>I4', head, at)
        taken = taken + 1
      end
      if rest then
        redis.call('LSET', sizes, 0, rest)
        break
      end
      redis.call('LPOP', sizes)
    end
    sized = sized - taken
    return taken
  end
  function e.save()
    if #added > 0 then
      -- In pieces: Lua passes at most a few thousand values to one call.
      local packed = {}
      for i = 1, #added, 1000 do
        local j = math.min(i + 999, #added)
        packed[#packed + 1] = struct.pack('>' .. string.rep('I4', j - i + 1), unpack(added, i, j))
      end
      redis.call('RPUSH', sizes, table.concat(packed))
      sized = sized + #added
      added = {}
    end
    local len = redis.call('XLEN', stream)
    local over = function() return len > maxlen or bytes > maxbytes end
    if over() then
      -- Sizes of entries no longer in the stream (it was cut some other way).
      if sized > len then
        local gone = sized - len
        take_sizes(function(taken) return taken < gone end)
      end
      -- The oldest entries without a listed size, read and deleted the old way.
      while over() and len > sized do
        local old = redis.call('XRANGE', stream, '-', '+', 'COUNT', math.min(128, len - sized))
        if #old == 0 then break end
        local ids = {}
        for _, entry in ipairs(old) do
          if not over() then break end
          ids[#ids + 1] = entry[1]
          bytes = bytes - size(entry[2])
          len = len - 1
        end
        redis.call('XDEL', stream, unpack(ids))
      end
      -- Then from the sizes alone, and the stream cut to what is left in one `XTRIM`.
      local cut = take_sizes(function(taken)
        local left = len - taken
        return left > maxlen or (bytes > maxbytes and left > 0)
      end)
      if cut > 0 then
        len = len - cut
        redis.call('XTRIM', stream, 'MAXLEN', len)
      end
      if len == 0 or bytes < 0 then bytes = 0 end
    end
    redis.call('HSET', last_key, 'ms', ms, 'n', n, 'bytes', bytes, 'epoch', epoch, 'sized', sized)
    if epoch_at then redis.call('HSET', last_key, 'epoch_at', epoch_at) end
  end
  return e
end

-- What a member keeps of one of its sessions beside its field in the sessions hash (its
-- will, its claims), in a hash of its own under the session's field as `<session>|<value>`,
-- for whoever logs the session's end without its node (a login elsewhere taking it over,
-- the reaper of a dead node): taken (and deleted) if it is session s's, else nil.
local function take_kept(key, f, s)
  local v = redis.call('HGET', key, f)
  if not v then return nil end
  local bar = string.find(v, '|', 1, true)
  if not bar or string.sub(v, 1, bar - 1) ~= s then return nil end
  redis.call('HDEL', key, f)
  return string.sub(v, bar + 1)
end

-- An MQTT session's will, kept in its member's wills hash as `<topic>\0<payload>`: its topic
-- and payload, if it is session s's.
local function take_will(key, f, s)
  local w = take_kept(key, f, s)
  if not w then return nil end
  local z = string.find(w, '\0', 1, true)
  if not z then return nil end
  return string.sub(w, 1, z - 1), string.sub(w, z + 1)
end

-- A uid's last session across the cluster ended (for reason r, at ms at): its user_offline
-- now, or with an offline grace (grace_ms > 0) held in the grace set (gk: uid -> when the
-- grace ends, by Redis's clock) with its reason and ending (wk: uid -> `<r>|<at>`), for
-- RELEASE to log once the grace ran out, unless the uid logs in first (`user_back`).
-- Redis holds it, so it outlives the node whose session ended. An ending someone chose
-- (CloseReason::is_chosen: no reconnect is likely) is never held. Either way the uid was
-- last seen at `at`: listed in `seen` as `uid:at` for the caller, which writes it (for
-- `--last-seen-ttl`) under the uid's own key, spread over the cluster's slots rather than
-- on this one.
local CHOSEN = {logout = true, kicked = true, token_expired = true}
local seen = {}
-- What the users hash (uk) holds for a uid in its offline grace: no session, yet online as a
-- user, so a scan of the hash (`GET /v1/online/uids`) lists it (see `held` below).
local GRACE_MARK = 'g'
local function user_gone(ev, uk, gk, wk, uid, r, at, grace_ms, seen_ms)
  if grace_ms > 0 and not CHOSEN[r] then
    redis.call('ZADD', gk, ev.now() + grace_ms, uid)
    redis.call('HSET', wk, uid, r .. '|' .. at)
    redis.call('HSET', uk, uid, GRACE_MARK)
  else
    ev.user_offline(uid, r, at)
  end
  if seen_ms > 0 then
    seen[#seen + 1] = uid .. ':' .. at
  end
end

-- A login takes a uid from no session to one: true if it came back within its grace (no
-- user event either way), false for a user_online.
local function user_back(gk, wk, uid)
  if redis.call('ZREM', gk, uid) == 1 then
    redis.call('HDEL', wk, uid)
    return true
  end
  return false
end

-- A session's claims (`--jwt-claims-to-events`), kept in its member's claims hash while the
-- session is held, so that whoever logs its offline event gives it the claims its online
-- event had.
local function take_claims(key, f, s)
  return take_kept(key, f, s)
end

-- A session's field in its member's hash: the uid, then `/device` for a named device.
local function field(uid, d)
  if d == '' then return uid end
  return uid .. '/' .. d
end

-- The users hash: uid -> the uid's sessions across every member, in the order their
-- `online`s were logged, one a line: `<epoch>|<member>|<session>|<device>`, the epoch the
-- `online` was logged in, and `!` before one whose `online` said it was superseded. What
-- decides a uid's user events (none left: it is offline), and what `APPLY` bounds by
-- `--max-devices` in stream order. Every script that takes a session out of its member's
-- hash takes it off the list (`held_remove`); a login reads the list through `held`, which
-- also drops any entry its member's hash no longer holds, so the list can never keep a uid
-- online that holds nothing. A uid in its offline grace holds `GRACE_MARK` instead of a
-- list: so every uid online as a user has a field, which a scan of the hash relies on.
local function held_lines(users, uid)
  local lines = {}
  local v = redis.call('HGET', users, uid)
  if v and v ~= GRACE_MARK then
    for e in string.gmatch(v, '[^\n]+') do lines[#lines + 1] = e end
  end
  return lines
end

local function held_put(users, uid, lines)
  if #lines == 0 then
    redis.call('HDEL', users, uid)
  else
    redis.call('HSET', users, uid, table.concat(lines, '\n'))
  end
  return #lines
end

-- The uid's sessions, each checked against its member's hash: what a login bounds. Also
-- returns the list's lines as kept.
local function held(users, uid)
  local lines = held_lines(users, uid)
  local list, kept = {}, {}
  for _, e in ipairs(lines) do
    local sp, ep, m, s, d = string.match(e, '^(!?)([^|]*)|([^|]*)|([^|]*)|(.*)$')
    if m and redis.call('HGET', '{idlegate}:sessions:' .. m, field(uid, d)) == s then
      list[#list + 1] = {m = m, s = s, d = d, sp = sp == '!', epoch = ep}
      kept[#kept + 1] = e
    end
  end
  if #kept < #lines then held_put(users, uid, kept) end
  return list, kept
end

-- Lists session s of member m (already in m's hash), announced in `epoch`, last, after
-- `lines` (the list as it stands, read again if nil); returns how many the uid holds.
local function held_add(users, uid, epoch, m, s, d, sp, lines)
  lines = lines or held_lines(users, uid)
  local line = epoch .. '|' .. m .. '|' .. s .. '|' .. d
  if sp then line = '!' .. line end
  lines[#lines + 1] = line
  return held_put(users, uid, lines)
end

-- Takes session s of member m off the uid's list; returns how many the uid holds.
local function held_remove(users, uid, m, s)
  local lines, kept = held_lines(users, uid), {}
  local mark = '|' .. m .. '|' .. s .. '|'
  for _, e in ipairs(lines) do
    if not string.find(e, mark, 1, true) then kept[#kept + 1] = e end
  end
  if #kept == #lines then return #lines end
  return held_put(users, uid, kept)
end

-- How many sessions the uid holds.
local function held_count(users, uid)
  local v = redis.call('HGET', users, uid)
  if not v or v == GRACE_MARK then return 0 end
  local _, breaks = string.gsub(v, '\n', '')
  return breaks + 1
end

-- Removes session s (field f of member m) without an event, if m's hash still holds it:
-- a session whose end Redis lost in a failover after its offline was logged (and perhaps
-- read). Its offline went out once; a second would break exactly-once, and the consumer
-- was told of the broken history (the new epoch's gap). Returns true if it was held.
local function forget(users, m, uid, f, s)
  local key = '{idlegate}:sessions:' .. m
  if redis.call('HGET', key, f) ~= s then return false end
  redis.call('HDEL', key, f)
  take_kept('{idlegate}:wills:' .. m, f, s)
  take_kept('{idlegate}:claims:' .. m, f, s)
  held_remove(users, uid, m, s)
  return true
end

-- An offline event, with the session's will and claims when it has them.
local function emit_offline(ev, uid, s, d, r, at, wt, wp, c)
  local fields = {'t', 'offline', 'uid', uid, 's', s, 'd', d, 'r', r}
  if wt then
    fields[#fields + 1] = 'wt'
    fields[#fields + 1] = wt
    fields[#fields + 1] = 'wp'
    fields[#fields + 1] = wp
  end
  if c then
    fields[#fields + 1] = 'c'
    fields[#fields + 1] = c
  end
  fields[#fields + 1] = 'at'
  fields[#fields + 1] = ev.floor(uid, at)
  ev.emit(unpack(fields))
end
"#;

/// Applies one batch of a member's session changes, in order.
///
/// A session is a field of its member's session hash: the uid, then `/device` for a named
/// device (`keys::session_field`). The users hash counts each uid's sessions across every
/// member, so the uid's user-level events are decided here, under the same atomic step as
/// the session events they follow.
///
/// KEYS: sessions of the member, the stream, its last-id hash, the member's applied batch,
/// the member's reaped marker, the users hash, the member's wills, the grace set and its
/// reasons, the member's claims, the member's verified marker. ARGV: member, node name, the
/// number of the batch's last change, the last number of the member's batch applied before
/// it (0 for none), stream cap, stream byte cap, data events dropped before this batch, the
/// offline grace in ms (0: none), `--last-seen-ttl` in ms, the number of the batch's first
/// change, the stream epoch the node knows (empty for none) and the highest event number it
/// saw in that epoch, `--max-devices`, then six per change (the last is the device name, empty for the
/// default device).
///
/// The applied marker holds the member's highest change number applied. A batch whose last
/// number is at or below it was applied already (a retry after a lost reply, or a batch cut
/// shorter after a timeout whose longer send ran after all), and its changes at or below it
/// are skipped: no change is ever applied twice. The changes:
/// - `L uid session replaced at device`: a login; `replaced` is `<member>|<session>|<device>`
///   the route named before (or empty); `L|<timeout>|<json>|<origin>` (or `L1|...`): the
///   session's timeout in ms (its class's), carried by its online event as `tm`, its claims
///   (`<json>`, empty for none), kept in the member's claims hash and carried by its
///   online and offline events as `c`, and its door and client address (`<door> <ip:port>`,
///   `-` for what is unknown), carried by its online event as `o`. `replaced` names the route named before: a relogin of the device elsewhere, or the oldest
///   session of a uid at `--max-devices` across the nodes. If that session is in its
///   member's hash it ends as kicked; either way its member is told through its inbox and
///   ends it (one its member has not announced yet, two logins having raced, is announced
///   when its login arrives, then ends). `replaced` is `!` for a login the route says a
///   newer login superseded: announced all the same, and ended by its node. (`L1`, the
///   node's view that this is the uid's first session there, is read as `L`: user events
///   are decided here, see below.)
/// - `R uid session replaced at device`: a held session's route set again (Redis lost the
///   route, not the session): `replaced` as a login's, and never announced, as a login
///   elsewhere may have ended the session meanwhile (nemesis seed 3 at `--max-devices 1`:
///   announced again as a login, an evicted session got a second `online`).
/// - `E uid session reason at device`: a session ended; `E1` when its node saw it as the
///   uid's last there. A plain `E` is a session its node ended for a login of the same uid
///   that follows it.
/// - `D uid session payload at device`: a DATA frame, logged only while its session is held;
///   `D|<topic>` for an MQTT PUBLISH, whose topic goes in the event as `tp`.
/// - An `E` (or `E1`) may carry an MQTT will after a `|`: its topic, 0x00, its payload, for
///   the offline event's `wt` and `wp`.
/// - `W|<topic>\0<payload> uid session '' at device`: an MQTT session's will, kept in the
///   member's wills hash while the session is held, so that an ending its node never logs
///   (taken over from another node, or reaped with a dead node) still carries it.
/// - `S uid session status at device`: the user's status (issue 52; empty: cleared), set and
///   logged as a `status` event (`st`) only while its session is held; `user_offline`
///   clears it.
/// - `F uid session '' at device`: forget a session without an event. Its node ended it and
///   the end was applied, but Redis lost that write in a failover and holds the session
///   again: its `offline` went out once already (see `forget`).
/// - `V '' '' '' '' ''`: the member's hash is known current in this epoch (its node
///   reconciled it after lost writes): the verified marker takes the epoch.
///
/// After Redis lost writes, a member's hash may hold sessions the member had ended, whose
/// `offline` consumers may have read before the failover. Only the member's node knows
/// which. So a login's kick of a session of *another* member whose verified marker names an
/// older epoch logs nothing here: the kick goes to that member's inbox, and its node ends the
/// session if it holds it (its own `offline`, after this login's `online`) or forgets it in
/// its reconcile if not. The marker is set by a member's first batch and by the end of each
/// reconcile (`V`); a member without one (none of its writes survived) holds nothing stale.
/// A member's batch in an epoch its hash was not verified in marks it `w<epoch>` (see
/// `REAP`).
/// A replaced entry of this member's own, prefixed with `~`, is one its node ended: it is
/// forgotten, not kicked. A batch also detects lost writes from the event numbers: when the
/// stream's last number in the node's epoch is below the highest the node saw in it, the
/// failover lost other members' writes, and the batch renews the epoch before its changes.
///
/// User events come from the users hash alone (the uid's sessions across the cluster),
/// never from a node's own view: a node may still hold a session another node already took
/// over. `user_online` follows the `online` that takes the uid from no session to one,
/// `user_offline` the `offline` that leaves it none. An ending that makes room for a login
/// (a takeover, a plain `E`) owes its `user_offline` only until the batch ends: the login
/// that replaces it, announced in the same batch, is no user-level transition and settles
/// it; otherwise the batch ends by logging it. With an offline grace, a `user_offline` is
/// held in the grace set instead (`user_gone`), and a login that finds its uid there takes
/// it out and is no `user_online` (`user_back`).
///
/// Returns `{status, epoch, dropped, n, seen}`: status -1 if the member was reaped (nothing
/// changed; then the third element is the reaped marker: the member's applied marker as
/// the fence fell, so the caller knows which changes an earlier try of the batch, whose
/// reply was lost, did apply), 0 for a batch already applied (a retry after a lost reply), 1 applied, 2
/// applied but the applied marker was behind what the member had applied or the stream's
/// number behind what the node saw: Redis lost writes. `n` is the last event number. `dropped`
/// lists, comma-separated, the `uid:session` whose data events the batch dropped because
/// the session was no longer held (a login elsewhere took it over meanwhile): their
/// clients must not be told their data was taken (an MQTT PUBACK), so their node ends them.
/// `seen` lists, comma-separated, the `uid:unix ms` of each uid this batch took offline:
/// the caller records when each was last seen, under keys spread over the cluster.
pub(crate) const APPLY: &str = r#"
local fence = redis.call('GET', KEYS[5])
if fence then return {-1, '', fence} end
local last, prev, first = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[10])
local applied = tonumber(redis.call('GET', KEYS[4]) or '0')
local dropped_key = KEYS[4] .. ':dropped'
if last <= applied then
  local mark = redis.call('HMGET', KEYS[3], 'epoch', 'n')
  return {0, mark[1] or '', redis.call('GET', dropped_key) or '', tonumber(mark[2] or '0')}
end
redis.call('SET', KEYS[4], last)
-- The first change not applied yet: all of them, unless a longer batch from the same
-- first number ran after its sender gave up on it.
local from = 14
if applied >= first then from = 14 + 6 * (applied - first + 1) end
-- `uid:session` of sessions whose data events this batch dropped (no longer held: taken
-- over meanwhile), kept for a retry's answer.
local dropped = {}
if applied >= first then
  -- What the longer batch dropped is part of this one's answer: its reply was lost.
  for pair in string.gmatch(redis.call('GET', dropped_key) or '', '[^,]+') do
    dropped[#dropped + 1] = pair
  end
end
local ev = emitter(KEYS[2], KEYS[3], ARGV[5], ARGV[6])
local status = 1
local known = ARGV[11]
if applied < prev or (known ~= '' and known == ev.epoch() and ev.n() < tonumber(ARGV[12])) then
  status = 2
  ev.renew()
end
-- A member's first batch: its hash is all its own writes.
if status == 1 and prev == 0 and applied == 0 then redis.call('SET', KEYS[11], ev.epoch()) end
-- A member writing in an epoch its hash was not verified in: `w<epoch>` tells a reaper that
-- its hash holds sessions announced since the break, not only ones from before it.
local verified = redis.call('GET', KEYS[11])
if verified and verified ~= ev.epoch() and verified ~= 'w' .. ev.epoch() then
  redis.call('SET', KEYS[11], 'w' .. ev.epoch())
end
-- Whether a kick may log the end of member m's session here: m's hash is current (see above).
local function current(m)
  local v = redis.call('GET', '{idlegate}:applied:' .. m .. ':verified')
  return not v or v == ev.epoch()
end
-- The count of dropped events belongs before the first change: skipped with it.
if applied < first then ev.skip(tonumber(ARGV[7])) end
local me, node = ARGV[1], ARGV[2]
local grace_ms = tonumber(ARGV[8])
local seen_ms = tonumber(ARGV[9])
local max_devices = tonumber(ARGV[13])
-- uid -> {reason, at} of a user_offline owed by an ending that made room for a login,
-- settled by that login or logged when the batch ends; `owed_order` keeps them in order.
local owed, owed_order = {}, {}
local function owe(uid, r, at)
  if not owed[uid] then owed_order[#owed_order + 1] = uid end
  owed[uid] = {r, at}
end
-- Tells member m's node through its inbox to end its session s of uid. Not a reaped
-- member's: nobody reads its inbox any more, and its reaper deleted it already, so a kick
-- written after would stay in Redis for good (the model of issue 53 found it: a login
-- routed after a fence named a session under its node's old member name).
local function kick(m, uid, s)
  if redis.call('EXISTS', '{idlegate}:reaped:' .. m) == 1 then return end
  redis.call('XADD', '{idlegate}:inbox:' .. m, 'MAXLEN', '~', 100000, '*', 'op', 'kick', 'uid', uid, 's', s)
end
-- Ends session `s` that member m holds on device field pf of uid: its `offline` goes here
-- (with its will unless `will` is false, and its claims), its uid's count drops, and
-- with `kick` its node is told through its inbox to close it.
local function end_held(m, uid, pf, pd, s, r, eat, will, kick_it)
  redis.call('HDEL', '{idlegate}:sessions:' .. m, pf)
  local wt, wp = take_will('{idlegate}:wills:' .. m, pf, s)
  local c = take_claims('{idlegate}:claims:' .. m, pf, s)
  if not will then wt, wp = nil, nil end
  emit_offline(ev, uid, s, pd, r, eat, wt, wp, c)
  if held_remove(KEYS[6], uid, m, s) <= 0 then owe(uid, r, eat) end
  if kick_it then kick(m, uid, s) end
end
-- Marks session ps of member m on device pf as superseded before it was announced: the
-- mark is the newest such session (see below), and its `online` says so.
local function mark_superseded(m, pf, ps)
  -- A reaped member announces nothing more, and its marks were deleted with it.
  if redis.call('EXISTS', '{idlegate}:reaped:' .. m) == 1 then return end
  local marks = '{idlegate}:superseded:' .. m
  local newest = redis.call('HGET', marks, pf)
  if not newest or ps > newest then redis.call('HSET', marks, pf, ps) end
end
-- Whether this member's session s on device f was superseded before it was announced; a
-- mark no newer than s is spent by it.
local function superseded_mark(f, s)
  local marks = '{idlegate}:superseded:' .. me
  local newest = redis.call('HGET', marks, f)
  if newest and s >= newest then redis.call('HDEL', marks, f) end
  return newest and s <= newest or false
end
for i = from, #ARGV, 6 do
  local kind, uid, s, x, at, d = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  -- What rides after a '|' in the kind: a data event's topic, an offline event's will.
  local extra = nil
  local bar = string.find(kind, '|', 1, true)
  if bar then
    extra = string.sub(kind, bar + 1)
    kind = string.sub(kind, 1, bar - 1)
  end
  local user = string.sub(kind, 2) == '1'
  kind = string.sub(kind, 1, 1)
  local f = field(uid, d)
  -- `R`: a login's route set again (Redis holds the session, but lost its route): what it
  -- replaced is ended as a login's, and it is never announced again.
  if kind == 'L' or kind == 'R' then
    if x ~= '' and x ~= '!' then
      -- The route's chain: the owner this login replaced, then whom that one replaced (a
      -- login replaced before it was announced may leave its own predecessor held).
      for entry in string.gmatch(x, '[^\n]+') do
        -- `~`: a session of this member whose end its node applied (see above).
        local ended = string.sub(entry, 1, 1) == '~'
        if ended then entry = string.sub(entry, 2) end
        -- `=<reason>|<at>|<will>|`: a session that ended by itself, whose node marked its
        -- route (`ROUTE_END`) before logging its `offline`.
        local gone = nil
        if string.sub(entry, 1, 1) == '=' then
          local r, eat, w, rest = string.match(entry, '^=([^|]*)|([^|]*)|([^|]*)|(.*)$')
          if r then
            gone = {r, eat, w == '1'}
            entry = rest
          end
        end
        local m, ps, pd = string.match(entry, '^([^|]*)|([^|]*)|(.*)$')
        local key, pf = nil, nil
        if m then key, pf = '{idlegate}:sessions:' .. m, field(uid, pd) end
        if m == me and ps == s then
          -- The login itself: never a session it replaces. A route's chain can name it when
          -- the route commands of a retried batch ran out of order and the login is in the
          -- batch twice (queued, then announced again by a reconcile): nemesis seed 1 on a
          -- Redis Cluster, where it ended the session and announced it once more.
        elseif m and ended then
          if m == me then forget(KEYS[6], m, uid, pf, ps) end
        elseif m and m ~= me and current(m) and (redis.call('HGET', key, pf) or ps) < ps then
          -- Another member holds an older session of the device than the one named: the
          -- named one, its node's later login there, ends it there, and a chain names each
          -- member's device once, by its newest login (`ROUTE_SET`). Its `offline` goes
          -- here, before this login's `online`, as kicked.
          end_held(m, uid, pf, pd, redis.call('HGET', key, pf), 'kicked', at, true, true)
          -- The named one is not announced yet: its `online` says it was superseded.
          mark_superseded(m, pf, ps)
        elseif m and redis.call('HGET', key, pf) == ps then
          if m == me or current(m) then
            -- Held: its `offline` goes here, before this login's `online`. One that ended by
            -- itself goes as its node ended it (issue 49: logged by its node alone, after
            -- this login's `online`, it put its uid over `--max-devices` in stream order); one
            -- this login takes over, as kicked.
            -- Its node says whether the will goes out (not after a clean DISCONNECT); the
            -- kick, if any, goes below.
            if gone then
              end_held(m, uid, pf, pd, ps, gone[1], gone[2], gone[3], false)
            else
              end_held(m, uid, pf, pd, ps, 'kicked', at, true, false)
            end
          end
        elseif m and m ~= me then
          -- Not held: not announced yet (its batch is on its way, two logins having raced),
          -- or ended already. A login announced after this one's `online` is marked, so its
          -- `online` says it was superseded (see `!` below). The mark is the newest such
          -- session of m on the device: a node numbers its sessions in order (fixed-width
          -- hex compares as numbers) and logs a device's logins in order, so every login of
          -- m there up to it was replaced; a mark naming a session ended already flags none.
          mark_superseded(m, pf, ps)
        end
        -- Held or not yet announced, its node ends it; one not yet announced is announced
        -- when its login arrives, and its end follows (see `!` below). One that ended by
        -- itself is its node's already.
        if m and not ended and not gone and not (m == me and ps == s) then
          kick(m, uid, ps)
        end
      end
    end
    -- Every login is announced, even one a newer login took over (or superseded, `!`)
    -- before it got here: its client was welcomed and may have had PUBLISHes acknowledged,
    -- so its `online`, its data and its `offline` (kicked, with its will) come in order
    -- once its node, told through its inbox (or by `!`), ends it. Such a login's `online`
    -- carries `sp`: it came after the login that superseded it, and a consumer counting a
    -- uid's devices in stream order leaves it out (the one overlap `--max-devices` allows).
    local before = (kind == 'L') and redis.call('HGET', KEYS[1], f)
    if kind == 'L' and before ~= s then
      -- An older session of this member on the device, never ended here, is overwritten
      -- without an event (as it always was); it leaves the uid's list with it.
      if before then held_remove(KEYS[6], uid, me, before) end
      redis.call('HSET', KEYS[1], f, s)
      local superseded = superseded_mark(f, s) or x == '!'
      -- The uid's bound in stream order, whatever the routes say. The routes make room
      -- before a login is welcomed, and the chain above ends what they named; but Redis can
      -- lose a route without a gap in the stream (a Redis Cluster server that holds routes,
      -- not the control slot, restarted empty), and then a login finds nothing to replace.
      -- So a login ends any session another member holds on its device (nemesis seed 4 on a
      -- Redis Cluster: the device online twice), then the uid's oldest sessions until it
      -- holds no more than `--max-devices` (seed 4 at `--max-devices 1`: 32 moments over the
      -- bound), each as kicked, before its own `online`. Superseded logins are left out, as
      -- a consumer leaves them out. A session is ended here only if its member's hash is
      -- current, or its `online` was logged in this epoch: one from before lost writes
      -- is its own node's to settle (see above), and a consumer counts only what came
      -- after the gap. That holds for this member's own sessions too: its node alone knows
      -- which of them ended before the loss (nemesis seed 6 on a Redis Cluster at
      -- `--max-devices 2`: a failover brought back a session of the login's own node ended
      -- a minute before, and this ended it a second time).
      -- The list as it stands when this login ended nothing here (most logins), so it is
      -- read once.
      local lines = nil
      if not superseded then
        local list, kept = held(KEYS[6], uid)
        local room, ended = {}, false
        for _, h in ipairs(list) do
          if current(h.m) or h.epoch == ev.epoch() then
            if h.d == d and h.m ~= me then
              end_held(h.m, uid, f, d, h.s, 'kicked', at, true, true)
              ended = true
            elseif not h.sp then
              room[#room + 1] = h
            end
          end
        end
        for i = 1, #room + 1 - max_devices do
          local h = room[i]
          end_held(h.m, uid, field(uid, h.d), h.d, h.s, 'kicked', at, true, true)
          ended = true
        end
        if not ended then lines = kept end
      end
      local n = held_add(KEYS[6], uid, ev.epoch(), me, s, d, superseded, lines)
      -- `<timeout>|<claims>|<origin>`: the timeout (ms) and the origin hold no '|', the
      -- claims (JSON) may.
      local c, o, tm = '', '- -', ''
      if extra then
        local first_bar = string.find(extra, '|', 1, true)
        if first_bar then
          tm, extra = string.sub(extra, 1, first_bar - 1), string.sub(extra, first_bar + 1)
        end
        local at_bar = string.find(extra, '|[^|]*$')
        if at_bar then
          c, o = string.sub(extra, 1, at_bar - 1), string.sub(extra, at_bar + 1)
        else
          c = extra
        end
      end
      local fields = {'t', 'online', 'uid', uid, 's', s, 'd', d, 'node', node, 'o', o}
      if tm ~= '' and tm ~= '0' then
        fields[#fields + 1] = 'tm'
        fields[#fields + 1] = tm
      end
      if c ~= '' then
        redis.call('HSET', KEYS[10], f, s .. '|' .. c)
        fields[#fields + 1] = 'c'
        fields[#fields + 1] = c
      end
      if superseded then
        fields[#fields + 1] = 'sp'
        fields[#fields + 1] = '1'
      end
      fields[#fields + 1] = 'at'
      fields[#fields + 1] = ev.floor(uid, at)
      ev.emit(unpack(fields))
      if n == 1 then
        if owed[uid] then
          -- It replaces the session whose end owed the user_offline: no transition.
          owed[uid] = nil
        elseif not user_back(KEYS[8], KEYS[9], uid) then
          ev.emit('t', 'user_online', 'uid', uid, 'at', ev.user_stamp(uid))
        end
      end
    end
  elseif kind == 'E' then
    superseded_mark(f, s)
    if redis.call('HGET', KEYS[1], f) == s then
      redis.call('HDEL', KEYS[1], f)
      local n = held_remove(KEYS[6], uid, me, s)
      -- The node says whether the will goes out (not after a clean DISCONNECT); the kept
      -- copy goes either way.
      take_will(KEYS[7], f, s)
      local c = take_claims(KEYS[10], f, s)
      if extra then
        local z = string.find(extra, '\0', 1, true)
        emit_offline(ev, uid, s, d, x, at, string.sub(extra, 1, z - 1), string.sub(extra, z + 1), c)
      else
        emit_offline(ev, uid, s, d, x, at, nil, nil, c)
      end
      if n <= 0 then
        if user then
          owed[uid] = nil
          user_gone(ev, KEYS[6], KEYS[8], KEYS[9], uid, x, at, grace_ms, seen_ms)
        else
          owe(uid, x, at)
        end
      end
    end
  elseif kind == 'S' then
    -- A status, while its session is held: the user's, until it sets another or goes
    -- offline as a user.
    if redis.call('HGET', KEYS[1], f) == s then
      if x == '' then
        redis.call('HDEL', STATUS, uid)
      else
        redis.call('HSET', STATUS, uid, x)
      end
      ev.emit('t', 'status', 'uid', uid, 'st', x, 'at', ev.floor(uid, at))
    end
  elseif kind == 'F' then
    forget(KEYS[6], me, uid, f, s)
  elseif kind == 'V' then
    if status == 1 then redis.call('SET', KEYS[11], ev.epoch()) end
  elseif kind == 'W' then
    if extra and redis.call('HGET', KEYS[1], f) == s then
      redis.call('HSET', KEYS[7], f, s .. '|' .. extra)
    end
  elseif kind == 'D' then
    if redis.call('HGET', KEYS[1], f) == s then
      if extra then
        ev.emit('t', 'data', 'uid', uid, 'p', x, 'tp', extra, 'at', at)
      else
        ev.emit('t', 'data', 'uid', uid, 'p', x, 'at', at)
      end
    elseif dropped[#dropped] ~= uid .. ':' .. s then
      dropped[#dropped + 1] = uid .. ':' .. s
    end
  end
end
-- A uid is in owed_order once per time it came to owe (an ending, a login settling it, an
-- ending again): its user_offline is logged once, however often it is listed.
for _, uid in ipairs(owed_order) do
  local o = owed[uid]
  owed[uid] = nil
  if o and held_count(KEYS[6], uid) <= 0 then
    user_gone(ev, KEYS[6], KEYS[8], KEYS[9], uid, o[1], o[2], grace_ms, seen_ms)
  end
end
ev.save()
local lost = table.concat(dropped, ',')
redis.call('SET', dropped_key, lost)
return {status, ev.epoch(), lost, ev.n(), table.concat(seen, ',')}
"#;

/// Logs the `user_offline` of up to ARGV[1] uids whose offline grace ran out by Redis's
/// clock, oldest first, each with its last session's reason and ending (`e`). Every node
/// calls it every tick; the `ZREM` inside one atomic step is what makes each `user_offline`
/// exactly once, and a grace outlives whichever node began it.
///
/// KEYS: the grace set, its reasons, the stream, its last-id hash, the users hash. ARGV:
/// count, stream cap, stream byte cap. Returns `{uids taken, epoch or ''}`.
const RELEASE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Floors past keeping: this costs what it prunes.
redis.call('ZREMRANGEBYSCORE', USER_AT, '-inf', '(' .. (now - FLOOR_KEEP_MS))
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then return {0, ''} end
local ev = emitter(KEYS[3], KEYS[4], ARGV[2], ARGV[3])
local released = 0
for _, uid in ipairs(due) do
  redis.call('ZREM', KEYS[1], uid)
  local why = redis.call('HGET', KEYS[2], uid) or ''
  redis.call('HDEL', KEYS[2], uid)
  local r, at = string.match(why, '^([^|]*)|(%d+)$')
  -- A uid with a session again came back without a login taking it out (only if Redis
  -- lost writes between the two): it never went offline.
  if held_count(KEYS[5], uid) <= 0 then
    if redis.call('HGET', KEYS[5], uid) == GRACE_MARK then redis.call('HDEL', KEYS[5], uid) end
    ev.user_offline(uid, r or 'node_lost', at)
    released = released + 1
  end
end
ev.save()
return {#due, ev.epoch()}
"#;

/// Takes the webhook relay's turn if nobody holds it, or keeps it for this member, unless
/// the request reached Redis past its deadline: a relay whose link to Redis turned slow
/// confirms no renewal and stops relaying, but its renewals still arrive, late, and each
/// would hold the turn for another TTL, keeping it from every node that could relay (issue
/// 49, promise 4: a delay on the relaying node's link stopped the webhooks while it lasted).
///
/// KEYS: the turn. ARGV: member, TTL in ms, the deadline by Redis's clock in unix ms (0:
/// none, for a node that has not heard Redis's clock yet). Returns `{1 while the member
/// holds it, 0 if another does, -1 if too late; Redis's clock in unix ms}`, from which the
/// node sets its next deadline.
const TURN_HOLD: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[3] or '0')
if deadline > 0 and now > deadline then return {-1, now} end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {0, now} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, now}
"#;

/// The relay's acknowledged position and the batch in flight past it; when there is no
/// position (before the first one ever, or Redis lost it), the stream's newest id, recorded
/// as acknowledged, and nothing in flight.
///
/// A position Redis kept through a loss of writes may lie in a history the receiver has
/// already been told more of (nemesis seed 1 on a Redis Cluster with every kind: a failover
/// to a replica that lagged by a minute brought back the position and the events of that
/// minute, and the next relay sent one of them again under a new `webhook-id`). Two signs
/// of it, and what the relay does instead:
/// - the position lies before the current epoch's marker: the relay starts just before the
///   marker, where the stream reports the break (`earlier_stream`);
/// - the stream's number, in the epoch the relaying node last saw, is below the highest
///   that node saw (the epoch not yet renewed), or the stream's epoch is older than the one
///   that node saw (Redis went back past a renewal: nemesis seed 1 on a Redis Cluster, at
///   the commit that mended seeds 6 and 9, where a relay that had been stopped took the
///   turn from a replica two minutes behind): the relay starts at the stream's end, after
///   a `gap` of its own, and tells its node (which reconciles). Epochs are Redis's clock
///   at their renewal, each above the last, so an older one is a smaller number.
///
/// KEYS: the acknowledged position, the stream's last-id hash, the batch in flight. ARGV:
/// the epoch and the highest event number the relaying node saw (empty: none yet).
/// Returns `{id, 1, '', ''}` when it recorded the position just now, `{id, 0, sending or
/// '', ''}` otherwise, `{id, 0, '', 'epoch'}` or `{id, 0, '', 'rewound'}` for the two signs.
const TURN_FROM: &str = r#"
local function parse(id)
  local a, b = string.match(id or '', '^(%d+)-(%d+)$')
  if not a then return nil end
  return tonumber(a), tonumber(b)
end
local at = redis.call('GET', KEYS[1])
local last = redis.call('HMGET', KEYS[2], 'ms', 'n', 'epoch', 'epoch_at')
if at then
  local ams, an = parse(at)
  local mms, mn = parse(last[4])
  if an and an > 0 and mms and (ams < mms or (ams == mms and an < mn)) then
    redis.call('DEL', KEYS[3])
    return {string.format('%d-%d', mms, mn - 1), 0, '', 'epoch'}
  end
  local theirs, known = tonumber(last[3] or '0') or 0, tonumber(ARGV[1]) or 0
  local behind = last[3] == ARGV[1] and tonumber(last[2] or '0') < tonumber(ARGV[2])
  if ARGV[1] ~= '' and (behind or theirs < known) then
    redis.call('DEL', KEYS[3])
    return {(last[1] or '0') .. '-' .. (last[2] or '0'), 0, '', 'rewound'}
  end
  return {at, 0, redis.call('GET', KEYS[3]) or '', ''}
end
at = (last[1] or '0') .. '-' .. (last[2] or '0')
redis.call('SET', KEYS[1], at)
redis.call('DEL', KEYS[3])
return {at, 1, '', ''}
"#;

/// Records the batch the member is about to send (its last event id), only while it holds
/// the turn. KEYS: the turn, the batch in flight. ARGV: member, event id. Returns 1 if
/// recorded.
const TURN_SEND: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"#;

/// Records the relay's acknowledged position and keeps its turn, only while the member
/// holds the turn: a relay that lost it (paused past its TTL) moves nothing.
///
/// KEYS: the turn, the acknowledged position, the batch in flight (taken: none now). ARGV:
/// member, event id, TTL in ms. Returns 1 if recorded.
const TURN_ACK: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"#;

/// Gives the relay's turn up if the member holds it. KEYS: the turn. ARGV: member.
const TURN_LEAVE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"#;

/// Claims the reaping of a member whose lease ran out, or renews this node's claim, and
/// fences the member off (its reaped marker) in the same step, so no write of the member
/// lands between the claim and the reaping.
///
/// The reaped marker holds the member's applied marker as the fence fell: no write of the
/// member lands after it, so it says exactly which of the member's changes Redis has. A
/// batch the member tried again after a lost reply learns from it what its earlier try
/// applied (`APPLY` answers it with "fenced"), and sends only the rest again under its new
/// name; the applied marker itself goes with the reaping.
///
/// KEYS: the member's lease, its reaping claim, its reaped marker, its applied marker.
/// ARGV: this member, claim in ms, marker in seconds. Returns 1 if this node holds the
/// claim.
pub(crate) const CLAIM: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[3], redis.call('GET', KEYS[4]) or '0', 'EX', ARGV[3], 'NX')
return 1
"#;

/// One bounded step of reaping a dead member: up to about ARGV[2] sessions from the hash
/// cursor ARGV[1] on, each logged offline as `node_lost` (and its uid's `user_offline` when
/// it held no session on another node) and moved into the member's unroute hash, from
/// which the reaper deletes its route (and which a reaper taking over finishes first). A
/// session is logged only by the call whose `HDEL` removed it, so two reapers can never
/// log one twice.
///
/// A member whose verified marker names an older epoch, and which wrote nothing since (no
/// `w<epoch>`), died before Redis lost writes and never reconciled: its hash is as the
/// failover left it, so every session in it announced its `online` before the break, and
/// may have had its `offline` logged before it too (an end, or a reaping, that the failover
/// lost). Only the dead node knew which. Its sessions are removed without an event: the
/// consumer was told of the break (the new epoch's gap), and a second `offline` would break
/// exactly-once. Like `APPLY`, a step first renews the epoch when the stream's number in
/// the node's epoch is below the highest the node saw.
///
/// KEYS: the member's sessions, the stream, its last-id hash, the member's unroute hash,
/// the users hash, the member's wills (an MQTT session's goes in its `node_lost`), the
/// grace set and its reasons, the member's claims (a session's go in its `node_lost`), the
/// member's verified marker. ARGV: cursor, count, stream cap, stream byte cap, unix ms,
/// the offline grace in ms (a `user_offline` waits it out as after any ending),
/// `--last-seen-ttl` in ms, the stream epoch the node knows (empty for none) and the
/// highest event number it saw in it. Returns
/// `{next cursor, sessions left, sessions reaped, epoch, of them removed without an event,
/// seen, the last event number}`, `seen` as `APPLY`'s. The reaper keeps the number: a
/// failover that loses this reaping finds the reaper knowing more than the stream, and its
/// next `REAP` of the member renews the epoch and removes what it logged before without a
/// second `offline` (the model of issue 53 found it: without the number, a reaping lost in
/// a failover was logged twice).
pub(crate) const REAP: &str = r#"
local scan = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local found = scan[2]
local ev = emitter(KEYS[2], KEYS[3], ARGV[3], ARGV[4])
local known = ARGV[8]
if known ~= '' and known == ev.epoch() and ev.n() < tonumber(ARGV[9]) then ev.renew() end
local verified = redis.call('GET', KEYS[10])
local stale = verified and verified ~= ev.epoch() and verified ~= 'w' .. ev.epoch()
local reaped, silent = 0, 0
local member = string.sub(KEYS[1], #'{idlegate}:sessions:' + 1)
for i = 1, #found, 2 do
  if redis.call('HDEL', KEYS[1], found[i]) == 1 then
    local uid, d = string.match(found[i], '^(%d+)/?(.*)$')
    uid = uid or found[i]
    local wt, wp = take_will(KEYS[6], found[i], found[i + 1])
    local c = take_claims(KEYS[9], found[i], found[i + 1])
    local n = held_remove(KEYS[5], uid, member, found[i + 1])
    if stale then
      silent = silent + 1
    else
      emit_offline(ev, uid, found[i + 1], d or '', 'node_lost', ARGV[5], wt, wp, c)
      if n <= 0 then
        user_gone(ev, KEYS[5], KEYS[7], KEYS[8], uid, 'node_lost', ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]))
      end
    end
    redis.call('HSET', KEYS[4], found[i], found[i + 1])
    reaped = reaped + 1
  end
end
ev.save()
return {scan[1], redis.call('HLEN', KEYS[1]), reaped, ev.epoch(), silent, table.concat(seen, ','), ev.n()}
"#;

/// Refreshes a member's lease, unless the member was reaped meanwhile.
///
/// KEYS: the lease, the members set, the member's reaped marker, the stream's last-id
/// hash, the stream, the member's applied marker. ARGV: member, value, lease in ms, the
/// stream epoch the node knows (empty for none) and the highest event number it saw in it,
/// the stream's cap and byte cap, the last change the node knows the member applied (0 for
/// none). Returns `{1 or 0 if the member was reaped, epoch or '', the last event number, 1
/// if Redis lost writes}`: every node learns the stream's progress each tick, which is how
/// a batch notices a failover that lost other members' writes.
///
/// Redis lost writes when the stream's number in the node's epoch is below the highest the
/// node saw, or when the member's applied marker is below what it applied (the marker is
/// then set to it): the refresh renews the epoch, so consumers meet the gap within a tick
/// though nothing else is logged, and the node reconciles though it has nothing to write. The model of issue 53 found
/// both: a failover that lost an `online` a consumer had read, on a cluster that then
/// logged nothing, never told the consumer; and a node whose lost `offline` was followed by
/// as many events of others (its number caught up) kept the ended session in Redis, online
/// in presence, for as long as it wrote nothing.
pub(crate) const LEASE: &str = r#"
local mark = redis.call('HMGET', KEYS[4], 'epoch', 'n')
local epoch, n = mark[1] or '', tonumber(mark[2] or '0')
local fenced = redis.call('EXISTS', KEYS[3]) == 1
local lost = ARGV[4] ~= '' and ARGV[4] == epoch and n < tonumber(ARGV[5])
-- A fenced member's applied marker went with its reaping. One behind is set back to what
-- the member applied: the loss is told once, here, and not again by the next lease or
-- batch (each telling would begin another epoch); the reconcile it starts repairs what the
-- marker stood for.
if not fenced and tonumber(redis.call('GET', KEYS[6]) or '0') < tonumber(ARGV[8]) then
  redis.call('SET', KEYS[6], ARGV[8])
  lost = true
end
if lost then
  local ev = emitter(KEYS[5], KEYS[4], ARGV[6], ARGV[7])
  ev.renew()
  ev.save()
  epoch, n = ev.epoch(), ev.n()
end
local said = lost and 1 or 0
if fenced then return {0, epoch, n, said} end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return {1, epoch, n, said}
"#;

/// Points a uid's route for one device at a new login, unless a newer login of another
/// member holds that device.
///
/// A route is a hash per uid: device (empty for the default one) -> `<member>|<session>|
/// <since_ms>|<replaced>`; an ended route's `replaced` begins with its end mark
/// (`ROUTE_END`). KEYS: the route. ARGV: `<member>|<session>`, since_ms, member, device,
/// `--max-devices`. Logins of one device compare by `since_ms`, then by owner text: a
/// retried batch can never point the route back at an older login. A route of this
/// member's own older session, or one that ended, is always replaced (a member applies its
/// logins in order). A new device of a uid that holds `--max-devices` routes takes the
/// place of an ended one, else of the oldest login among them, unless this login is older
/// still: the one decision that bounds a uid's sessions across the cluster.
///
/// Returns `<member>|<session>|<device>` of the session it replaced (`=<reason>|<at>|<will>|`
/// before it if that session ended), followed (one a line) by the first entries of what
/// that session had replaced itself, up to `MAX_CHAIN` in all; `!` if a newer login holds
/// the place; or nil. The chain is what keeps "the kicked session's `offline` before the
/// new `online`" when a login replaces one whose own takeover has not reached the control
/// slot yet: its predecessor may still be held, and `APPLY` ends every held session the
/// chain names. Four covers logins of one device on four nodes within one batch's round
/// trip; newlines never occur in a member, a session or a device name (control characters
/// are refused in each). Retried for the same login, it returns what the first call
/// replaced, kept in the route's last field.
pub(crate) const ROUTE_SET: &str = r#"
local MAX_CHAIN = 4
local me, dev, max = ARGV[1], ARGV[4], tonumber(ARGV[5])
local mine = tonumber(ARGV[2])
local function parts(v)
  return string.match(v, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
end
-- A route's last part: its end mark (`#<reason>|<at>|<will>` on a line of its own, set by
-- `ROUTE_END`), if it ended, and what it had replaced.
local function split_end(prior)
  if string.sub(prior, 1, 1) ~= '#' then return nil, prior end
  local nl = string.find(prior, '\n', 1, true)
  if nl then return string.sub(prior, 2, nl - 1), string.sub(prior, nl + 1) end
  return string.sub(prior, 2), ''
end
-- The chain entry for `owner` (`<member>|<session>`) on device `d`: `=<end>|` before it
-- when it ended, so `APPLY` logs that end as its node would, before this login.
local function entry(owner, d, ended)
  if ended then return '=' .. ended .. '|' .. owner .. '|' .. d end
  return owner .. '|' .. d
end
-- Whether a live login of another member, since `theirs`, is newer than this one.
local function newer(om, owner, theirs)
  if om == ARGV[3] then return false end
  return theirs > mine or (theirs == mine and owner > me)
end
local old = redis.call('HGET', KEYS[1], dev)
-- What this login replaces: `out` (chain entries), at most MAX_CHAIN, the newest of each
-- member's device only: `APPLY` ends whatever session that member holds on the device up to
-- it, so older ones add nothing, and a burst of one node's logins (a batch held back by a
-- slow Redis) cannot push the one it holds out of the chain (nemesis seed 3 at
-- `--max-devices 1`).
local out, named = {}, {}
-- `k`: the entry's member and device, `<member>|<device>`; parsed from `e` when not given
-- (an entry of a chain read back from a route).
local function put(e, k)
  if #out >= MAX_CHAIN then return end
  if not k then
    local owner = string.match(e, '^=[^|]*|[^|]*|[^|]*|(.*)$') or e
    local m, d = string.match(owner, '^([^|]*)|[^|]*|(.*)$')
    k = (m or '') .. '|' .. (d or '')
  end
  if named[k] then return end
  named[k] = true
  out[#out + 1] = e
end
-- `om`, `d`: the head's member and device.
local function add(head, om, d, prior)
  put(head, om .. '|' .. d)
  for e in string.gmatch(prior or '', '[^\n]+') do put(e) end
end
if old then
  local om, os, since, prior = parts(old)
  if om then
    local ended, rest = split_end(prior)
    local owner = om .. '|' .. os
    if owner == me then
      if rest ~= '' then return rest end
      return false
    end
    if string.sub(me, -#os - 1) == '|' .. os then
      -- The same login sent again under its node's new member name (the old one was reaped
      -- while its batch was on its way): the route becomes the new name's, and what the
      -- login replaced is still its to end (nemesis seed 3 at `--max-devices 1`: the route
      -- was taken back instead, and what it had replaced, still held, went unnamed).
      redis.call('HSET', KEYS[1], dev, me .. '|' .. ARGV[2] .. '|' .. rest)
      if rest ~= '' then return rest end
      return false
    end
    if not ended and newer(om, owner, tonumber(since) or 0) then return '!' end
    add(entry(owner, dev, ended), om, dev, rest)
    if not ended then
      -- The device's live login: its place is this one's, the uid's count unchanged.
      redis.call('HSET', KEYS[1], dev, me .. '|' .. ARGV[2] .. '|' .. table.concat(out, '\n'))
      return table.concat(out, '\n')
    end
  end
end
-- A new place for the uid (no route on the device, or one that ended): the other devices'
-- routes, live or ended (an ended one's `offline` may not be logged yet), must leave room.
-- The route whose place this login takes: an ended one first (its session is gone; its end
-- orders itself before this login), else the oldest login.
local all = redis.call('HGETALL', KEYS[1])
local others = 0
local victim, vended, vsince, vowner, vom, vrest = nil, nil, nil, nil, nil, nil
for i = 1, #all, 2 do
  if all[i] ~= dev then
    others = others + 1
    local om, os, since, prior = parts(all[i + 1])
    if om then
      local t = tonumber(since) or 0
      local ended, rest = split_end(prior)
      local better = victim == nil
        or (ended and not vended)
        or ((ended ~= nil) == (vended ~= nil) and (t < vsince or (t == vsince and om .. '|' .. os < vowner)))
      if better then
        victim, vended, vsince, vowner, vom, vrest = all[i], ended, t, om .. '|' .. os, om, rest
      end
    end
  end
end
if others >= max and victim then
  -- Older than every live login it could replace: a newer login won the uid's last place
  -- before this one's route got here.
  if not vended and newer(vom, vowner, vsince) then return '!' end
  redis.call('HDEL', KEYS[1], victim)
  add(entry(vowner, victim, vended), vom, victim, vrest)
end
local replaced = table.concat(out, '\n')
redis.call('HSET', KEYS[1], dev, me .. '|' .. ARGV[2] .. '|' .. replaced)
if replaced == '' then return false end
return replaced
"#;

/// Marks a uid's route of one session ended, if it still names the given owner
/// (`<member>|<session>|`), whatever its device: run just before `APPLY` logs the
/// session's `offline`, where deleting the route would open a gap. A login of the device
/// (or of a new device at `--max-devices`) on another node, routed in that gap, would find
/// no route to replace and be logged online before this `offline`: a uid over its bound in
/// stream order (issue 49). Marked, the route is replaced as any other, and the new login's
/// `APPLY` logs this end first, as its node would (reason, time, whether its will goes
/// out), if that node has not yet. Presence reads a marked route as gone; the writer
/// deletes it (`ROUTE_DEL`) once the `offline` is logged.
///
/// KEYS: the route. ARGV: the owner, the reason, the end's unix ms, `1` if the will goes
/// out, else `0`. Returns 1 if marked (or marked already).
pub(crate) const ROUTE_END: &str = r#"
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local v = all[i + 1]
  if string.sub(v, 1, #ARGV[1]) == ARGV[1] then
    local rest = string.sub(v, #ARGV[1] + 1)
    local bar = string.find(rest, '|', 1, true)
    if not bar then return 0 end
    local prior = string.sub(rest, bar + 1)
    if string.sub(prior, 1, 1) == '#' then return 1 end
    local mark = '#' .. ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4]
    if prior ~= '' then mark = mark .. '\n' .. prior end
    redis.call('HSET', KEYS[1], all[i], ARGV[1] .. string.sub(rest, 1, bar) .. mark)
    return 1
  end
end
return 0
"#;

/// Deletes a uid's route of one session if it still names the given owner
/// (`<member>|<session>|`), whatever its device, so a late cleanup never erases a newer
/// login. KEYS: the route. Returns 1 if deleted.
pub(crate) const ROUTE_DEL: &str = r#"
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i + 1], 1, #ARGV[1]) == ARGV[1] then
    redis.call('HDEL', KEYS[1], all[i])
    return 1
  end
end
return 0
"#;

/// Each uid's presence as a watcher's snapshot tells it (issue 52), with the stream's newest
/// id, read in one atomic step: what it says is exact as of that id, and each change after
/// it is in the stream after it, so a fan-out applies from there without a hole or a repeat.
///
/// KEYS: the users hash, the status hash, the user-event floors (`USER_AT`), the stream's
/// last-id hash. ARGV: uids. Returns `{ms, n, online, at, status, online, at, status, ...}`:
/// `online` 1 while the uid holds a session or is in its offline grace (the users hash has
/// a field for every uid online as a user), `at` the stamp of its last user event (0 once
/// it is forgotten, an hour on), `status` its status while online ('' for none).
const PRESENCE_OF: &str = r#"
local last = redis.call('HMGET', KEYS[4], 'ms', 'n')
local out = {tonumber(last[1] or '0'), tonumber(last[2] or '0')}
for _, uid in ipairs(ARGV) do
  local on = redis.call('HEXISTS', KEYS[1], uid)
  out[#out + 1] = on
  out[#out + 1] = tonumber(redis.call('ZSCORE', KEYS[3], uid) or '0')
  if on == 1 then
    out[#out + 1] = redis.call('HGET', KEYS[2], uid) or ''
  else
    out[#out + 1] = ''
  end
end
return out
"#;

/// The scripts, loaded once per process.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub apply: Script,
    pub claim: Script,
    pub reap: Script,
    pub lease: Script,
    pub route_set: Script,
    pub route_del: Script,
    pub route_end: Script,
    pub release: Script,
    pub turn_hold: Script,
    pub turn_from: Script,
    pub turn_ack: Script,
    pub turn_send: Script,
    pub turn_leave: Script,
    pub presence_of: Script,
}

// === impl Scripts ===

impl Scripts {
    pub(crate) fn new() -> Scripts {
        let with_emit = |body: &str| Script::new(&format!("{EMIT}\n{body}"));
        Scripts {
            apply: with_emit(APPLY),
            claim: Script::new(CLAIM),
            reap: with_emit(REAP),
            lease: with_emit(LEASE),
            route_set: Script::new(ROUTE_SET),
            route_del: Script::new(ROUTE_DEL),
            route_end: Script::new(ROUTE_END),
            release: with_emit(RELEASE),
            turn_hold: Script::new(TURN_HOLD),
            turn_from: Script::new(TURN_FROM),
            turn_ack: Script::new(TURN_ACK),
            turn_send: Script::new(TURN_SEND),
            turn_leave: Script::new(TURN_LEAVE),
            presence_of: Script::new(PRESENCE_OF),
        }
    }

    /// Every script, for `SCRIPT LOAD` on every master before pipelines call them by hash.
    pub(crate) fn all(&self) -> [&Script; 14] {
        [
            &self.apply,
            &self.claim,
            &self.reap,
            &self.lease,
            &self.route_set,
            &self.route_del,
            &self.route_end,
            &self.release,
            &self.turn_hold,
            &self.turn_from,
            &self.turn_ack,
            &self.turn_send,
            &self.turn_leave,
            &self.presence_of,
        ]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! `APPLY`'s numbering against a real `redis-server` (on a Unix socket in a temporary
    //! folder), driven by `redis-cli`: the contract the writer's cut batches rely on.

    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};

    use super::{APPLY, EMIT, PRESENCE_OF, ROUTE_END, ROUTE_SET};
    use crate::cluster::keys;
    use crate::proto::CloseReason;

    /// The scripts' list of endings the grace does not hold is `CloseReason::is_chosen`'s.
    #[test]
    fn the_scripts_chosen_endings_are_the_protocols() {
        let line = EMIT.lines().find(|l| l.starts_with("local CHOSEN = ")).expect("the CHOSEN table");
        let mut scripts: Vec<&str> =
            line.split(['{', ',', '}']).filter_map(|p| p.trim().strip_suffix(" = true")).collect();
        let mut rust: Vec<&str> = CloseReason::ALL.iter().filter(|r| r.is_chosen()).map(|r| r.label()).collect();
        scripts.sort_unstable();
        rust.sort_unstable();
        assert_eq!(scripts, rust);
    }

    /// A `redis-server` for one test; stopped when dropped.
    pub(crate) struct Redis {
        child: Child,
        socket: PathBuf,
        _dir: tempfile::TempDir,
    }

    impl Redis {
        /// Starts one, or says how to install it and returns `None` (never under CI).
        pub(crate) fn start() -> Option<Redis> {
            let dir = tempfile::tempdir().unwrap();
            let socket = dir.path().join("redis.sock");
            let spawned = Command::new("redis-server")
                .args(["--port", "0", "--save", "", "--appendonly", "no"])
                .arg("--unixsocket")
                .arg(&socket)
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .spawn();
            let child = match spawned {
                Ok(child) => child,
                Err(e) if std::env::var_os("CI").is_some() => panic!("redis-server must run under CI: {e}"),
                Err(_) => {
                    eprintln!("skipped: needs redis-server (apt-get install redis-server redis-tools)");
                    return None;
                }
            };
            let redis = Redis { child, socket, _dir: dir };
            for _ in 0..200 {
                if redis.cli(&["PING"]).trim() == "PONG" {
                    return Some(redis);
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            panic!("redis-server did not answer on {}", redis.socket.display());
        }

        pub(crate) fn cli(&self, args: &[&str]) -> String {
            cli(&self.socket, args)
        }
    }

    impl Drop for Redis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn cli(socket: &Path, args: &[&str]) -> String {
        let out = Command::new("redis-cli").arg("-s").arg(socket).arg("--raw").args(args).output();
        String::from_utf8_lossy(&out.expect("redis-cli runs").stdout).into_owned()
    }

    /// `APPLY` for member `m`: changes numbered `first..=last`, the member's batch before
    /// it ending at `prev`; returns its status.
    fn apply(redis: &Redis, first: u64, last: u64, prev: u64, changes: &[[&str; 6]]) -> String {
        apply_as(redis, "m", first, last, prev, changes)
    }

    /// `APPLY` for `member`, as [`apply`], at `--max-devices 1`.
    fn apply_as(redis: &Redis, member: &str, first: u64, last: u64, prev: u64, changes: &[[&str; 6]]) -> String {
        apply_bounded(redis, member, "1", [first, last, prev], changes)
    }

    /// `APPLY` for `member` at `--max-devices max_devices`; `numbers` are the batch's first
    /// and last change and the member's batch before it, as [`apply`]'s.
    fn apply_bounded(
        redis: &Redis,
        member: &str,
        max_devices: &str,
        numbers: [u64; 3],
        changes: &[[&str; 6]],
    ) -> String {
        let [first, last, prev] = numbers;
        let script = format!("{EMIT}\n{APPLY}");
        let keys = [
            keys::sessions(member),
            keys::EVENTS.to_string(),
            keys::EVENTS_LAST.to_string(),
            keys::applied(member),
            keys::reaped(member),
            keys::USERS.to_string(),
            keys::wills(member),
            keys::GRACE.to_string(),
            keys::GRACE_WHY.to_string(),
            keys::claims(member),
            keys::verified(member),
        ];
        let (first, last, prev) = (first.to_string(), last.to_string(), prev.to_string());
        let mut args: Vec<&str> = vec!["EVAL", &script, "11"];
        args.extend(keys.iter().map(String::as_str));
        args.extend([member, "n", &last, &prev, "1000", "1000000", "0", "0", "60000", &first, "", "0", max_devices]);
        args.extend(changes.iter().flatten());
        redis.cli(&args).lines().next().unwrap_or("").to_string()
    }

    /// The payloads of the data events in the stream, in order.
    fn data(redis: &Redis) -> Vec<String> {
        let collect = "local out = {} for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do \
             for i = 1, #e[2], 2 do if e[2][i] == 'p' then out[#out + 1] = e[2][i + 1] end end end return out";
        redis.cli(&["EVAL", collect, "1", keys::EVENTS]).lines().map(String::from).collect()
    }

    const S: &str = "000000000000000a";

    /// Logs `count` events of `payload` through the emitter under caps of `maxlen` entries
    /// and `maxbytes` bytes; returns the stream's length, its byte count, and the number and
    /// the sum of the sizes listed (checked against the count the hash keeps).
    fn emit(redis: &Redis, count: usize, payload: &str, maxlen: usize, maxbytes: usize) -> [u64; 4] {
        let script = format!(
            "{EMIT}\nlocal ev = emitter(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) \
             for i = 1, tonumber(ARGV[3]) do ev.emit('t', 'data', 'p', ARGV[4]) end ev.save() \
             local sum, listed = 0, 0 \
             for _, e in ipairs(redis.call('LRANGE', KEYS[1] .. ':sizes', 0, -1)) do \
               for at = 1, #e, 4 do sum = sum + struct.unpack('>I4', e, at) listed = listed + 1 end \
             end \
             assert(listed == tonumber(redis.call('HGET', KEYS[2], 'sized'))) \
             return {{redis.call('XLEN', KEYS[1]), redis.call('HGET', KEYS[2], 'bytes'), listed, sum}}"
        );
        let (maxlen, maxbytes, count) = (maxlen.to_string(), maxbytes.to_string(), count.to_string());
        let args = ["EVAL", &script, "2", keys::EVENTS, keys::EVENTS_LAST, &maxlen, &maxbytes, &count, payload];
        let raw = redis.cli(&args);
        let out: Vec<u64> = raw.lines().map(|l| l.trim().parse().unwrap_or_else(|_| panic!("{raw}"))).collect();
        out.try_into().unwrap()
    }

    /// Issue 48, defect 3: trimming read the 128 oldest entries, payloads included, to trim
    /// one or two. Each entry's size now sits in a list beside the stream, and trimming
    /// pops sizes and cuts with `XTRIM`: the count and the bytes stay exact at either cap,
    /// and a stream written before the list existed is trimmed the old way at its front.
    #[test]
    fn trimming_keeps_the_stream_its_sizes_and_its_byte_count_in_step() {
        let Some(redis) = Redis::start() else { return };
        // 132 bytes an entry: 32, `t`, `data`, `p` and the payload of 94.
        let payload = "x".repeat(94);
        // The count cap: 10 entries (the epoch entry among the first).
        let [len, bytes, sizes, sum] = emit(&redis, 25, &payload, 10, 1 << 30);
        assert_eq!((len, sizes), (10, 10));
        assert_eq!((bytes, sum), (10 * 132, 10 * 132));
        // The byte cap: 5 entries' worth.
        let [len, bytes, sizes, sum] = emit(&redis, 3, &payload, 1000, 5 * 132);
        assert_eq!((len, sizes, bytes, sum), (5, 5, 5 * 132, 5 * 132));
        // A stream from before the list: its entries have no size listed; the newest do.
        redis.cli(&["HDEL", keys::EVENTS_LAST, "sized"]);
        let [len, bytes, sizes, _] = emit(&redis, 2, &payload, 1000, 4 * 132);
        assert_eq!((len, bytes, sizes), (4, 4 * 132, 2), "the unlisted oldest went first");
        let [len, bytes, sizes, sum] = emit(&redis, 3, &payload, 3, 1 << 30);
        assert_eq!((len, sizes, bytes, sum), (3, 3, 3 * 132, 3 * 132));
    }

    fn datum(p: &str) -> [&str; 6] {
        ["D", "7", S, p, "1001", ""]
    }

    /// Nemesis seed 1 on a Redis Cluster: a login announced again in the same batch whose
    /// route chain names the login itself is no kick: one `online`, no `offline`.
    #[test]
    fn a_login_never_replaces_itself() {
        let Some(redis) = Redis::start() else { return };
        let login = ["L|30000||tcp 127.0.0.1:1", "7", S, "", "1000", ""];
        let again = ["L|30000||tcp 127.0.0.1:1", "7", S, &format!("m|{S}|"), "1001", ""];
        assert_eq!(apply(&redis, 1, 2, 0, &[login, again]), "1");
        let kinds = "local out = {} for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do \
             out[#out + 1] = e[2][2] end return out";
        let kinds: Vec<String> = redis.cli(&["EVAL", kinds, "1", keys::EVENTS]).lines().map(String::from).collect();
        assert_eq!(kinds, ["epoch", "online", "user_online"]);
        assert_eq!(redis.cli(&["HGET", &keys::sessions("m"), "7"]).trim(), S);
    }

    /// A batch sent, given up on and sent again cut in pieces: the piece within it is
    /// skipped whole, the piece past its end is applied from where it ended. No change
    /// twice, none lost.
    #[test]
    fn a_batch_cut_after_a_longer_send_ran_applies_each_change_once() {
        let Some(redis) = Redis::start() else { return };
        let login = ["L|30000||tcp 127.0.0.1:1", "7", S, "", "1000", ""];
        // Changes 1..=4, whose answer the writer never saw.
        assert_eq!(apply(&redis, 1, 4, 0, &[login, datum("a"), datum("b"), datum("c")]), "1");
        // Sent again as 1..=2: Redis has them.
        assert_eq!(apply(&redis, 1, 2, 0, &[login, datum("a")]), "0");
        // Then 3..=6: 3 and 4 are in Redis, 5 and 6 are new.
        assert_eq!(apply(&redis, 3, 6, 2, &[datum("b"), datum("c"), datum("d"), datum("e")]), "1");
        assert_eq!(data(&redis), ["a", "b", "c", "d", "e"]);
        // A retry of 3..=6 after a lost reply changes nothing.
        assert_eq!(apply(&redis, 3, 6, 2, &[datum("b"), datum("c"), datum("d"), datum("e")]), "0");
        assert_eq!(data(&redis), ["a", "b", "c", "d", "e"]);
        assert_eq!(redis.cli(&["GET", &keys::applied("m")]).trim(), "6");
    }

    /// `ROUTE_SET` of uid 7's `device` for `member`'s session `s`, since `since`, under
    /// `--max-devices` `max`: its answer.
    fn route_set(redis: &Redis, member: &str, s: &str, since: &str, device: &str, max: &str) -> String {
        let owner = format!("{member}|{s}");
        let args = ["EVAL", ROUTE_SET, "1", "idlegate:route:7", &owner, since, member, device, max];
        redis.cli(&args).trim_end_matches('\n').to_string()
    }

    /// Each event of the stream as `type session at [sp]`, in order.
    fn events(redis: &Redis) -> Vec<String> {
        let lua = "local out = {} for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do \
             local f = {} for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end \
             local line = f.t .. ' ' .. (f.s or '-') .. ' ' .. (f.r or '-') \
             if f.sp then line = line .. ' sp' end out[#out + 1] = line end return out";
        redis.cli(&["EVAL", lua, "1", keys::EVENTS]).lines().map(String::from).collect()
    }

    const S2: &str = "000000000000000b";

    /// Issue 49, promise 2: a session that ended by itself deleted its route before its
    /// `offline` was logged, and a login of its device on another node, routed in that gap,
    /// was logged online first (a uid over `--max-devices` in stream order). The route is
    /// now marked ended, and the replacing login's `APPLY` logs that end first, as its node
    /// would have (its reason), and the node's own `offline` later finds nothing to log.
    #[test]
    fn an_ended_route_orders_the_login_that_replaces_it_after_its_offline() {
        let Some(redis) = Redis::start() else { return };
        assert_eq!(route_set(&redis, "a", S, "1000", "", "1"), "");
        assert_eq!(apply_as(&redis, "a", 1, 1, 0, &[["L1|30000||- -", "7", S, "", "1000", ""]]), "1");
        let owner = format!("a|{S}|");
        let marked = redis.cli(&["EVAL", ROUTE_END, "1", "idlegate:route:7", &owner, "idle_timeout", "1500", "0"]);
        assert_eq!(marked.trim(), "1");
        let chain = route_set(&redis, "b", S2, "1600", "", "1");
        assert_eq!(chain, format!("=idle_timeout|1500|0|a|{S}|"));
        assert_eq!(apply_as(&redis, "b", 1, 1, 0, &[["L1|30000||- -", "7", S2, &chain, "1600", ""]]), "1");
        assert_eq!(apply_as(&redis, "a", 2, 2, 1, &[["E1", "7", S, "idle_timeout", "1500", ""]]), "1");
        assert_eq!(
            events(&redis),
            [
                "epoch - -".to_string(),
                format!("online {S} -"),
                "user_online - -".to_string(),
                format!("offline {S} idle_timeout"),
                format!("online {S2} -"),
            ]
        );
    }

    /// Issue 49, promise 2: a login whose route a login on another node replaced before its
    /// batch got here is announced after that login's `online`; it says so (`sp`), and so
    /// does every login of its node on the device before it (nemesis seed 3: the chain named
    /// two logins of one node, and only the older was flagged). A later login is not.
    #[test]
    fn a_login_replaced_before_it_was_announced_says_so() {
        let Some(redis) = Redis::start() else { return };
        const S3: &str = "000000000000000c";
        const S4: &str = "000000000000000d";
        assert_eq!(route_set(&redis, "a", S, "1000", "", "1"), "");
        let first = route_set(&redis, "a", S3, "1001", "", "1");
        assert_eq!(first, format!("a|{S}|"));
        let chain = route_set(&redis, "b", S2, "1100", "", "1");
        // Each member's device once, by its newest login.
        assert_eq!(chain, format!("a|{S3}|"));
        assert_eq!(apply_as(&redis, "b", 1, 1, 0, &[["L1|30000||- -", "7", S2, &chain, "1100", ""]]), "1");
        let logins = [["L1|30000||- -", "7", S, "", "1000", ""], ["L|30000||- -", "7", S3, &first, "1001", ""]];
        assert_eq!(apply_as(&redis, "a", 1, 2, 0, &logins), "1");
        assert_eq!(apply_as(&redis, "a", 3, 3, 2, &[["L|30000||- -", "7", S4, "", "1200", ""]]), "1");
        let got = events(&redis);
        assert_eq!(
            got[1..],
            [
                format!("online {S2} -"),
                "user_online - -".into(),
                format!("online {S} - sp"),
                format!("offline {S} kicked"),
                format!("online {S3} - sp"),
                // S4's route (given here as naming nothing) would have named S2; `APPLY`
                // ends a device's session elsewhere all the same.
                format!("offline {S2} kicked"),
                format!("online {S4} -"),
            ]
        );
        // A login older than every one holding the uid's places loses, at `--max-devices`
        // as on one device.
        assert_eq!(route_set(&redis, "c", "000000000000000c", "900", "tablet", "1"), "!");
    }

    /// A login that lost its route to a newer one (`!`) can reach Redis before the login
    /// that won: two logins of one device on two nodes in the same millisecond, the winner's
    /// batch behind the loser's. The loser is announced first, as superseded, and its node
    /// ends it; only then does the winner's batch arrive. User events follow the stream: the
    /// uid held the loser alone, then nothing, then the winner, so it goes online, offline
    /// and online again, each once, and every consumer sees the same. What the CI run of
    /// stop 61 saw in `simultaneous_duplicate_logins_leave_exactly_one_session_per_uid`.
    #[test]
    fn a_login_that_lost_its_route_and_is_announced_first_is_its_user_s_own_transition() {
        let Some(redis) = Redis::start() else { return };
        // Same millisecond on two nodes: the owner's text breaks the tie, "b|..." wins.
        assert_eq!(route_set(&redis, "b", S2, "1000", "", "1"), "");
        let lost = route_set(&redis, "a", S, "1000", "", "1");
        assert_eq!(lost, "!");
        // The loser's batch first: announced as superseded, then ended by its node (told by
        // the `!`); the winner's batch arrives last.
        let (login, end) = (["L1|30000||- -", "7", S, &lost, "1000", ""], ["E1", "7", S, "kicked", "1001", ""]);
        assert_eq!(apply_as(&redis, "a", 1, 2, 0, &[login, end]), "1");
        assert_eq!(apply_as(&redis, "b", 1, 1, 0, &[["L1|30000||- -", "7", S2, "", "1000", ""]]), "1");
        assert_eq!(
            events(&redis)[1..],
            [
                format!("online {S} - sp"),
                "user_online - -".into(),
                format!("offline {S} kicked"),
                "user_offline - kicked".into(),
                format!("online {S2} -"),
                "user_online - -".into(),
            ]
        );
    }

    /// Nemesis seed 3 at `--max-devices 1`: an ended route left on one device (its deletion
    /// lost to a slow Redis) was replaced by a login of that device without a look at the
    /// uid's other routes, and the uid had two live routes, and two sessions online in the
    /// stream. A login taking an ended route's place makes room as a new device's does.
    #[test]
    fn nemesis_seed_3_max_devices_1_a_login_on_an_ended_route_still_makes_room() {
        let Some(redis) = Redis::start() else { return };
        let (live, ended) = (format!("a|{S}|1000|"), "a|000000000000000e|900|#kicked|950|0");
        redis.cli(&["HSET", "idlegate:route:7", "d0", &live, "d1", ended]);
        let chain = route_set(&redis, "b", S2, "1100", "d1", "1");
        assert_eq!(chain, format!("=kicked|950|0|a|000000000000000e|d1\na|{S}|d0"));
        assert_eq!(redis.cli(&["HKEYS", "idlegate:route:7"]).trim(), "d1");
    }

    /// Nemesis seed 3 at `--max-devices 1`: a burst of one node's logins (its batch held
    /// back by a slow Redis) filled the route's chain, and the session that node held, older
    /// than all of them, fell out of it: a login elsewhere went online beside it. The chain
    /// names a member's device once, by its newest login, and whatever older session the
    /// member holds there ends first.
    #[test]
    fn nemesis_seed_3_max_devices_1_a_held_session_older_than_the_chain_ends_first() {
        let Some(redis) = Redis::start() else { return };
        const S3: &str = "000000000000000c";
        assert_eq!(route_set(&redis, "a", S, "1000", "", "1"), "");
        assert_eq!(apply_as(&redis, "a", 1, 1, 0, &[["L1|30000||- -", "7", S, "", "1000", ""]]), "1");
        assert_eq!(route_set(&redis, "a", S3, "1001", "", "1"), format!("a|{S}|"));
        let chain = route_set(&redis, "b", S2, "1100", "", "1");
        assert_eq!(chain, format!("a|{S3}|"));
        assert_eq!(apply_as(&redis, "b", 1, 1, 0, &[["L1|30000||- -", "7", S2, &chain, "1100", ""]]), "1");
        let got = events(&redis);
        assert_eq!(
            got[1..],
            [
                format!("online {S} -"),
                "user_online - -".into(),
                format!("offline {S} kicked"),
                format!("online {S2} -")
            ]
        );
    }

    /// Nemesis seed 3 at `--max-devices 1`: a login whose batch was fenced (its member
    /// reaped meanwhile) had its route taken back before it went again under the new name,
    /// and the held session it had replaced went unnamed. Routed again, the login keeps its
    /// route and what it replaced, under the new name.
    #[test]
    fn nemesis_seed_3_max_devices_1_a_login_routed_again_under_a_new_name_keeps_its_chain() {
        let Some(redis) = Redis::start() else { return };
        assert_eq!(route_set(&redis, "b", S2, "1000", "", "1"), "");
        assert_eq!(route_set(&redis, "a", S, "1100", "", "1"), format!("b|{S2}|"));
        assert_eq!(route_set(&redis, "a2", S, "1100", "", "1"), format!("b|{S2}|"));
        let route = redis.cli(&["HGET", "idlegate:route:7", ""]);
        assert_eq!(route.trim_end(), format!("a2|{S}|1100|b|{S2}|"));
    }

    /// Nemesis seed 4 on a Redis Cluster: a server holding routes restarted empty, and a
    /// login of a device another node held found no route to replace: the device was online
    /// twice in the stream. A login ends whatever session another member holds on its
    /// device, route or not.
    #[test]
    fn nemesis_cluster_seed_4_a_login_ends_its_devices_session_elsewhere_without_a_route() {
        let Some(redis) = Redis::start() else { return };
        redis.cli(&["SADD", "{idlegate}:members", "a", "b"]);
        assert_eq!(apply_as(&redis, "b", 1, 1, 0, &[["L1|30000||- -", "7", S2, "", "1000", ""]]), "1");
        assert_eq!(apply_as(&redis, "a", 1, 1, 0, &[["L1|30000||- -", "7", S, "", "1100", ""]]), "1");
        let got = events(&redis);
        assert_eq!(
            got[1..],
            [
                format!("online {S2} -"),
                "user_online - -".into(),
                format!("offline {S2} kicked"),
                format!("online {S} -")
            ]
        );
    }

    /// Nemesis seed 4 on a Redis Cluster at `--max-devices 1`: a server that held routes
    /// (not the control slot) restarted empty, and logins of uids whose routes were lost
    /// found nothing to replace: 32 moments over the bound in stream order, where no gap
    /// told the consumer of a loss. `APPLY` now bounds the uid by the sessions the control
    /// slot lists for it, oldest out first, whatever the route said; a superseded login
    /// counts for none, as for a consumer; the last session's end is still the uid's
    /// `user_offline`.
    #[test]
    fn nemesis_cluster_seed_4_max_devices_2_a_login_whose_route_was_lost_keeps_the_bound() {
        let Some(redis) = Redis::start() else { return };
        const S3: &str = "000000000000000c";
        const S4: &str = "000000000000000d";
        let login = |member: &str, s: &'static str, x: &'static str, at: &'static str, device: &'static str| {
            let prev = redis.cli(&["GET", &keys::applied(member)]).trim().parse::<u64>().unwrap_or(0);
            let change = [if prev == 0 { "L1|30000||- -" } else { "L|30000||- -" }, "7", s, x, at, device];
            apply_bounded(&redis, member, "2", [prev + 1, prev + 1, prev], &[change])
        };
        assert_eq!(login("b", S2, "", "1000", "phone"), "1");
        assert_eq!(login("a", S, "", "1100", "desk"), "1");
        // The route, lost, named nothing: the oldest of the uid's places makes room.
        assert_eq!(login("c", S3, "", "1200", "tablet"), "1");
        // Superseded before it got here: announced, and left out of the count.
        assert_eq!(login("b", S4, "!", "1300", "watch"), "1");
        let got = events(&redis);
        assert_eq!(
            got[1..],
            [
                format!("online {S2} -"),
                "user_online - -".into(),
                format!("online {S} -"),
                format!("offline {S2} kicked"),
                format!("online {S3} -"),
                format!("online {S4} - sp"),
            ]
        );
        // b's node is told to close the session it still holds.
        let inbox = redis.cli(&["XRANGE", "{idlegate}:inbox:b", "-", "+"]);
        assert!(inbox.contains("kick") && inbox.contains(S2), "{inbox}");
        // The uid's last session ends: its user_offline, once.
        let end = |member: &str, s: &'static str, device: &'static str, user: bool| {
            let prev = redis.cli(&["GET", &keys::applied(member)]).trim().parse::<u64>().unwrap();
            let change = [if user { "E1" } else { "E" }, "7", s, "logout", "1400", device];
            apply_bounded(&redis, member, "2", [prev + 1, prev + 1, prev], &[change])
        };
        assert_eq!(end("b", S4, "watch", false), "1");
        assert_eq!(end("a", S, "desk", false), "1");
        assert_eq!(end("c", S3, "tablet", true), "1");
        let got = events(&redis);
        assert_eq!(
            got[got.len() - 4..],
            [
                format!("offline {S4} logout"),
                format!("offline {S} logout"),
                format!("offline {S3} logout"),
                "user_offline - logout".to_string(),
            ]
        );
        assert_eq!(redis.cli(&["HLEN", keys::USERS]).trim(), "0");
    }

    /// Nemesis seed 6 on a Redis Cluster at `--max-devices 2`: a failover lost the end of a
    /// session (its `offline` logged and read a minute before), so the promoted replica still
    /// listed it, under the old epoch, in its member's hash; a login of the same member on
    /// another device ended it a second time to keep the bound. The login's own member is
    /// not current either (it has not reconciled since the loss): such a session is its
    /// node's to settle, and nothing is logged for it here.
    #[test]
    fn nemesis_cluster_seed_6_max_devices_2_a_session_a_failover_brought_back_is_not_ended_twice() {
        let Some(redis) = Redis::start() else { return };
        const S3: &str = "000000000000000c";
        let batch = |n: u64, change: [&str; 6]| apply_bounded(&redis, "a", "2", [n, n, n - 1], &[change]);
        assert_eq!(batch(1, ["L1|30000||- -", "7", S, "", "1000", "d1"]), "1");
        assert_eq!(batch(2, ["L|30000||- -", "7", S2, "", "1001", "d0"]), "1");
        // What the failover leaves: a new epoch, the member not verified in it, and the
        // hash and the users list as they were before S's end (which the consumer read).
        assert_eq!(batch(3, ["E", "7", S, "logout", "1002", "d1"]), "1");
        let users = redis.cli(&["HGET", keys::USERS, "7"]).trim().to_string();
        let old_epoch = redis.cli(&["HGET", keys::EVENTS_LAST, "epoch"]).trim().to_string();
        redis.cli(&["HSET", &keys::sessions("a"), "7/d1", S]);
        redis.cli(&["HSET", keys::USERS, "7", &format!("{old_epoch}|a|{S}|d1\n{users}")]);
        redis.cli(&["HSET", keys::EVENTS_LAST, "epoch", &(old_epoch.parse::<u64>().unwrap() + 1).to_string()]);
        redis.cli(&["SET", &keys::verified("a"), &old_epoch]);
        let before = events(&redis).len();
        assert_eq!(batch(4, ["L|30000||- -", "7", S3, "", "1003", "d2"]), "1");
        let got = events(&redis);
        // S2 (announced in the old epoch too, by a member not verified since) stays its
        // node's to settle as well: only the login is logged.
        assert_eq!(got[before..], [format!("online {S3} -")], "{got:?}");
    }

    /// Nemesis seed 3 at `--max-devices 1`: a reconcile pointed a lost route back at a
    /// session Redis held, as a login; a login elsewhere evicted the session meanwhile, and
    /// it was announced a second time. A route set again (`R`) never announces.
    #[test]
    fn nemesis_seed_3_max_devices_1_a_route_set_again_never_announces() {
        let Some(redis) = Redis::start() else { return };
        assert_eq!(apply_as(&redis, "a", 1, 1, 0, &[["R|30000||- -", "7", S, "", "1000", ""]]), "1");
        assert_eq!(events(&redis), ["epoch - -"]);
    }

    /// Issue 49, promise 3: a session event carrying an older time than its uid's last user
    /// event (a node's batch that reached Redis late) is stamped no earlier than it.
    #[test]
    fn a_late_session_event_is_never_stamped_before_its_uids_last_user_event() {
        let Some(redis) = Redis::start() else { return };
        let login = ["L1|30000||- -", "7", S, "", "1000", ""];
        assert_eq!(apply_as(&redis, "a", 1, 2, 0, &[login, ["E1", "7", S, "logout", "1001", ""]]), "1");
        assert_eq!(apply_as(&redis, "b", 1, 1, 0, &[["L1|30000||- -", "7", S2, "", "1002", ""]]), "1");
        let lua = "local out = {} for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do \
             for i = 1, #e[2], 2 do if e[2][i] == 'at' then out[#out + 1] = e[2][i + 1] end end end return out";
        let at: Vec<u64> = redis.cli(&["EVAL", lua, "1", keys::EVENTS]).lines().map(|l| l.parse().unwrap()).collect();
        // online, user_online, offline, user_offline, online, user_online.
        assert_eq!(at.len(), 6, "{at:?}");
        assert_eq!(at[0], 1000);
        assert!(at[2] >= at[1] && at[4] >= at[3] && at[3] > 1_000_000, "{at:?}");
    }

    /// `TURN_FROM`'s answer, as lines, for a relaying node that saw `seen` (its epoch and
    /// highest event number).
    fn turn_from(redis: &Redis, seen: [&str; 2]) -> Vec<String> {
        let keys = [keys::RELAY_ACKED, keys::EVENTS_LAST, keys::RELAY_SENDING];
        let mut args = vec!["EVAL", super::TURN_FROM, "3"];
        args.extend(keys);
        args.extend(seen);
        redis.cli(&args).lines().map(String::from).collect()
    }

    /// Nemesis seed 1 on a Redis Cluster, run again at the commit that mended seeds 6 and 9:
    /// a server restarted, the replica promoted in its place was two minutes behind, past
    /// an epoch renewal, and a node that had been stopped took the relay's turn from the
    /// position Redis brought back before anyone renewed the epoch; it sent three events
    /// again under a new `webhook-id`. The node's own epoch was newer than the stream's,
    /// which `TURN_FROM` did not look at; now an older epoch in Redis is a rewind.
    #[test]
    fn nemesis_seed_1_redis_cluster_again_a_stream_older_than_the_relay_saw_is_not_relayed_from() {
        let Some(redis) = Redis::start() else { return };
        let from = |seen: [&str; 2]| turn_from(&redis, seen);
        assert_eq!(emit(&redis, 3, "x", 1000, 1 << 20)[0], 4);
        let epoch: u64 = redis.cli(&["HGET", keys::EVENTS_LAST, "epoch"]).trim().parse().unwrap();
        let ms = redis.cli(&["HGET", keys::EVENTS_LAST, "epoch_at"]).trim().split('-').next().unwrap().to_string();
        redis.cli(&["SET", keys::RELAY_ACKED, &format!("{ms}-2")]);
        let end = redis.cli(&["HGET", keys::EVENTS_LAST, "ms"]).trim().to_string();
        // The node saw this epoch, with a number below the stream's: the position holds.
        assert_eq!(from([&epoch.to_string(), "1"]), [format!("{ms}-2"), "0".into(), String::new(), String::new()]);
        // The node saw a later epoch, which Redis lost: the stream's end, after a gap.
        let later = (epoch + 1).to_string();
        assert_eq!(from([&later, "1"]), [format!("{end}-4"), "0".into(), String::new(), "rewound".into()]);
    }

    /// Nemesis seed 1 on a Redis Cluster with every kind: a failover to a replica that
    /// lagged by a minute brought back the relay's position and that minute's events, and
    /// the next relay sent one of them again under a new `webhook-id`. `TURN_FROM` now
    /// tells such a position apart: behind the epoch's marker, or the stream's number below
    /// what the relaying node saw in its epoch.
    #[test]
    fn nemesis_seed_1_redis_cluster_a_position_redis_brought_back_is_not_relayed_from() {
        let Some(redis) = Redis::start() else { return };
        let from = |seen: [&str; 2]| turn_from(&redis, seen);
        // Four events logged (the epoch's marker is the first), the position at the third.
        assert_eq!(emit(&redis, 3, "x", 1000, 1 << 20)[0], 4);
        let epoch = redis.cli(&["HGET", keys::EVENTS_LAST, "epoch"]).trim().to_string();
        let marker = redis.cli(&["HGET", keys::EVENTS_LAST, "epoch_at"]).trim().to_string();
        let ms = marker.split('-').next().unwrap().to_string();
        assert!(marker.ends_with("-1"), "{marker}");
        redis.cli(&["SET", keys::RELAY_ACKED, &format!("{ms}-3")]);
        redis.cli(&["SET", keys::RELAY_SENDING, &format!("{ms}-4")]);
        // As it was: the batch in flight is sent again.
        assert_eq!(from([&epoch, "4"]), [format!("{ms}-3"), "0".into(), format!("{ms}-4"), String::new()]);
        // The node saw number 9 in this epoch: Redis went back; start at the stream's end.
        let end = redis.cli(&["HGET", keys::EVENTS_LAST, "ms"]).trim().to_string();
        assert_eq!(from([&epoch, "9"]), [format!("{end}-4"), "0".into(), String::new(), "rewound".into()]);
        // In a newer epoch than the node saw, the number says nothing; the position alone
        // counts.
        assert_eq!(from(["1", "9"])[3], "");
        // A position before the current epoch's marker: start just before the marker.
        redis.cli(&["HSET", keys::EVENTS_LAST, "epoch_at", &format!("{ms}-4")]);
        assert_eq!(from(["", ""]), [format!("{ms}-3"), "0".into(), String::new(), "epoch".into()]);
        redis.cli(&["HSET", keys::EVENTS_LAST, "epoch_at", &format!("{}-4", ms.parse::<u64>().unwrap() + 1)]);
        assert_eq!(from(["", ""])[3], "epoch");
        // No position at all: the stream's newest, recorded.
        redis.cli(&["DEL", keys::RELAY_ACKED]);
        assert_eq!(from(["", ""])[1], "1");
    }

    /// `PRESENCE_OF` of `uids`, as `redis-cli --raw` prints it: one line a value.
    fn presence_of(redis: &Redis, uids: &[&str]) -> Vec<String> {
        let keys = [keys::USERS, keys::STATUS, keys::USER_AT, keys::EVENTS_LAST];
        let mut args: Vec<&str> = vec!["EVAL", PRESENCE_OF, "4"];
        args.extend(keys);
        args.extend(uids);
        redis.cli(&args).lines().map(String::from).collect()
    }

    #[test]
    fn a_status_is_logged_while_its_session_is_held_and_ends_with_its_user() {
        let Some(redis) = Redis::start() else { return };
        const T: &str = "000000000000000b";
        let login = ["L|30000||tcp 127.0.0.1:1", "7", S, "", "1000", ""];
        let status = |s: &'static str, text: &'static str| ["S", "7", s, text, "1001", ""];
        assert_eq!(apply(&redis, 1, 2, 0, &[login, status(S, "away ☕")]), "1");
        assert_eq!(redis.cli(&["HGET", keys::STATUS, "7"]).trim(), "away ☕");
        // One step reads the users, their statuses and the stream's newest id.
        let last = |field| redis.cli(&["HGET", keys::EVENTS_LAST, field]).trim().to_string();
        let online_at = redis.cli(&["ZSCORE", keys::USER_AT, "7"]).trim().to_string();
        let answer = presence_of(&redis, &["7", "8"]);
        assert_eq!(
            answer,
            [last("ms"), last("n"), "1".into(), online_at, "away ☕".into(), "0".into(), "0".into(), String::new()]
        );
        // A session not held sets nothing; an empty status clears it, and is logged.
        assert_eq!(apply(&redis, 3, 5, 2, &[status(T, "not mine"), status(S, ""), status(S, "busy")]), "1");
        let statuses = "local out = {} for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do \
             if e[2][2] == 'status' then out[#out + 1] = '[' .. e[2][6] .. ']' end end return out";
        let logged: Vec<String> = redis.cli(&["EVAL", statuses, "1", keys::EVENTS]).lines().map(String::from).collect();
        assert_eq!(logged, ["[away ☕]", "[]", "[busy]"]);
        // The uid's last session ends: its user_offline takes the status with it, and a
        // status of the ended session sets nothing.
        let end = ["E1", "7", S, "logout", "1002", ""];
        assert_eq!(apply(&redis, 6, 7, 5, &[end, status(S, "late")]), "1");
        assert_eq!(redis.cli(&["HEXISTS", keys::STATUS, "7"]).trim(), "0");
        let answer = presence_of(&redis, &["7"]);
        assert_eq!(answer[2..4], ["0".to_string(), redis.cli(&["ZSCORE", keys::USER_AT, "7"]).trim().to_string()]);
        let kinds = "local out = {} for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do \
             out[#out + 1] = e[2][2] end return out";
        let kinds: Vec<String> = redis.cli(&["EVAL", kinds, "1", keys::EVENTS]).lines().map(String::from).collect();
        assert_eq!(kinds, ["epoch", "online", "user_online", "status", "status", "status", "offline", "user_offline"]);
    }

    /// The model of issue 53, its first counterexample: a login's chain named a session of
    /// a member already reaped (the session sent again under its node's new name after a
    /// fence, routed behind a login that had replaced it). `APPLY` wrote a kick to the reaped
    /// member's inbox and a superseded mark under it, after its reaper had deleted both:
    /// nobody would read or delete them again.
    #[test]
    fn model_a_login_naming_a_reaped_member_leaves_nothing_of_it_behind() {
        let Some(redis) = Redis::start() else { return };
        const OLD: &str = "n0#00000000";
        redis.cli(&["SET", &keys::reaped(OLD), "0"]);
        // OLD's session S, not held (reaped before it landed), named by member b's login.
        let chain = format!("{OLD}|{S}|");
        let login = ["L|30000||tcp 127.0.0.1:1", "7", S2, &chain, "1001", ""];
        assert_eq!(apply_as(&redis, "b", 1, 1, 0, &[login]), "1");
        assert_eq!(redis.cli(&["EXISTS", &keys::inbox(OLD)]).trim(), "0", "no kick for a reaped member");
        assert_eq!(redis.cli(&["EXISTS", &keys::superseded(OLD)]).trim(), "0", "no mark for a reaped member");
        // A live member's session named the same way is still kicked and marked.
        let chain = format!("c|{S}|");
        let login = ["L|30000||tcp 127.0.0.1:1", "7", "000000000000000c", &chain, "1002", "d1"];
        assert_eq!(apply_as(&redis, "b", 2, 2, 1, &[login]), "1");
        assert_eq!(redis.cli(&["XLEN", &keys::inbox("c")]).trim(), "1");
        assert_eq!(redis.cli(&["EXISTS", &keys::superseded("c")]).trim(), "1");
    }
}
