"""The bus's Lua scripts: each step that must be atomic, as Redis runs it.

Every script's comment says its KEYS, its ARGV and what it returns;
:class:`pipeline.bus.store.BusStore` registers them and wraps each in a typed
method. A script that pushes to a key a client named goes through
``push_or_bury`` (:data:`PUSH_OR_BURY`): a key that is not a list gets no push
and the message goes to the dead-letter list (:mod:`pipeline.bus.dead`).
"""

from __future__ import annotations

from pipeline import keys
from pipeline.bus import dead

# bury(target, value, why): set value aside in the dead-letter list.
# push_or_bury(target, value, why): RPUSH value to target when target is a list (or
# absent), else set it aside in the dead-letter list. 1 pushed, 0 set aside. The push
# is tried first (redis.pcall): a WRONGTYPE refusal writes nothing, and the usual push
# costs one command, not a TYPE check and the push; any other error (OOM, READONLY)
# fails the script as redis.call would.
PUSH_OR_BURY = f"""
local function bury(target, value, why)
  local head = cjson.encode({{queue = target, at = tonumber(redis.call('TIME')[1]),
    reason = why, attempts = 0, size = #value, truncated = #value > {dead.BODY_MAX}}})
  redis.call('LPUSH', '{keys.bus_dead()}', head .. '\\n' .. string.sub(value, 1, {dead.BODY_MAX}))
  redis.call('LTRIM', '{keys.bus_dead()}', 0, {dead.LIST_MAX - 1})
  return 0
end
local function push_or_bury(target, value, why)
  local pushed = redis.pcall('RPUSH', target, value)
  if type(pushed) ~= 'table' or not pushed['err'] then return 1 end
  if string.sub(pushed['err'], 1, 9) ~= 'WRONGTYPE' then error(pushed) end
  local kind = redis.call('TYPE', target)['ok']
  return bury(target, value, why .. ': ' .. target .. ' holds a ' .. kind .. ', not a list')
end
"""

# KEYS: queue, inflight. ARGV: count, longest item returned. Moves up to count items and
# returns them; an item longer than the limit comes back as its first `limit` and last
# 4096 bytes: too large to handle, it is judged (and answered, `ret` being near either
# end) from those, and never crosses to the bus whole.
CLAIM = """
local items = redis.call('LPOP', KEYS[1], ARGV[1])
if not items then return {} end
redis.call('RPUSH', KEYS[2], unpack(items))
local limit = tonumber(ARGV[2])
for i = 1, #items do
  if #items[i] > limit then
    items[i] = string.sub(items[i], 1, limit) .. string.sub(items[i], -4096)
  end
end
return items
"""

# KEYS: fence, staging, queue, inflight. ARGV: token, count, longest item returned. The
# fenced half of a claim (see BusStore.wait_claim): when the fencing token is still this
# bus's, moves what the staging list holds (the item its BLMOVE took, and any a bus that
# lost the lease took after it lost it), and up to count more items of the queue, to the
# inflight list and returns them (cut like CLAIM's); else an error FENCED and nothing
# moves (the owner's next claim takes what is in the staging list, first).
FENCED_CLAIM = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED the lease of this bus was taken over')
end
local items = redis.call('LRANGE', KEYS[2], 0, -1)
if #items == 0 then return {} end
redis.call('DEL', KEYS[2])
local more = tonumber(ARGV[2]) > 0 and redis.call('LPOP', KEYS[3], ARGV[2])
if more then
  for i = 1, #more do items[#items + 1] = more[i] end
end
redis.call('RPUSH', KEYS[4], unpack(items))
local limit = tonumber(ARGV[3])
for i = 1, #items do
  if #items[i] > limit then
    items[i] = string.sub(items[i], 1, limit) .. string.sub(items[i], -4096)
  end
end
return items
"""

# KEYS: inflight. ARGV: count, longest item returned. The first items, cut like CLAIM's.
PEEK = """
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local limit = tonumber(ARGV[2])
for i = 1, #items do
  if #items[i] > limit then
    items[i] = string.sub(items[i], 1, limit) .. string.sub(items[i], -4096)
  end
end
return items
"""

# stale(epoch key, signed ms): whether a POST signed at ``signed ms`` ('' for an unsigned
# legacy peer: never) predates the replay memory (the seen set). The memory's epoch is
# set when it is first used; a Redis that lost its data lost the epoch with it, and a
# missing epoch becomes now: a copy of a POST signed before then is refused (-2), since
# nothing proves it was not seen before the loss.
STALE = """
local function stale(epoch_key, signed)
  if signed == '' then return false end
  local epoch = tonumber(redis.call('GET', epoch_key))
  if not epoch then
    local t = redis.call('TIME')
    epoch = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('SET', epoch_key, string.format('%.0f', epoch))
  end
  return tonumber(signed) < epoch
end
"""

# KEYS: seen, epoch. ARGV: expiry score, most seen ids, then the msgpack array of (seen id,
# handler queue, body) triples, flat: the requests of one POST in one step, each straight
# to its handler's queue (one packed argument: redis-py packs each argument in Python,
# several microseconds per envelope; see pipeline.bus.store._packed).
# ARGV[4]: the POST's signed time in ms (see STALE).
# Per triple: 1 queued, 0 replayed (also a second copy in the same call), -1 the seen
# set is full (the sender retries later), 2 set aside (the handler's queue is not a
# list: the body is in the dead-letter list and the id is remembered), -2 signed
# before the replay memory's epoch.
ACCEPT_REQUESTS = (
    PUSH_OR_BURY
    + STALE
    + """
local most = tonumber(ARGV[2])
local a = cmsgpack.unpack(ARGV[3])
local out = {}
if stale(KEYS[2], ARGV[4]) then
  for i = 1, #a - 2, 3 do out[#out + 1] = -2 end
  return out
end
local size = redis.call('ZCARD', KEYS[1])  -- once per call: each ZADD below adds one id
for i = 1, #a - 2, 3 do
  if size >= most then
    out[#out + 1] = redis.call('ZSCORE', KEYS[1], a[i]) and 0 or -1
  elseif redis.call('ZADD', KEYS[1], 'NX', ARGV[1], a[i]) == 0 then
    out[#out + 1] = 0  -- seen: ZADD NX leaves its score, adds nothing
  else
    size = size + 1
    out[#out + 1] = 2 - push_or_bury(a[i + 1], a[i + 2], 'request not delivered')
  end
end
return out
"""
)

# KEYS: backlog, expiry, epoch. ARGV: the msgpack array of (uid, sender twin, answer head,
# answer tail) quadruples, flat: the replies of one POST in one step; the POST's signed
# time in ms (see STALE). The answer to the caller is head .. <the request's ret as a
# JSON string> .. tail. Per reply: 1 answered, 0 uid not in backlog (or already
# answered), -1 the request was sent to another twin, -2 signed before the epoch.
DELIVER_REPLIES = (
    PUSH_OR_BURY
    + STALE
    + """
local function deliver(uid, sender, head, tail)
  local entry = redis.call('HGET', KEYS[1], uid)
  if not entry then return 0 end
  local dst = string.match(entry, '"dst":%[(%d+)%]')
  if dst ~= sender then return -1 end
  -- the bus wrote the entry (compact JSON, ASCII): a ret without escapes is read in
  -- place (a quote inside a JSON string is escaped, so '"ret":"' is the key itself),
  -- anything else by decoding the whole entry
  local ret = string.match(entry, '"ret":"([^"\\\\]*)"')
  local text = ret and '"' .. ret .. '"'
  if not ret then
    local ok, doc = pcall(cjson.decode, entry)
    ret = ok and type(doc) == 'table' and doc['ret'] or nil
    text = type(ret) == 'string' and cjson.encode(ret)
  end
  redis.call('HDEL', KEYS[1], uid)
  redis.call('ZREM', KEYS[2], uid)
  if type(ret) ~= 'string' then
    bury('', head .. '""' .. tail, 'corrupt backlog entry ' .. uid .. ': reply kept')
    return 1
  end
  push_or_bury(ret, head .. text .. tail, 'answer not delivered')
  return 1
end
local a = cmsgpack.unpack(ARGV[1])
local out = {}
if stale(KEYS[3], ARGV[2]) then
  for i = 1, #a - 3, 4 do out[#out + 1] = -2 end
  return out
end
for i = 1, #a - 3, 4 do
  out[#out + 1] = deliver(a[i], a[i + 1], a[i + 2], a[i + 3])
end
return out
"""
)

# KEYS: backlog, expiry, outbox, fence. ARGV: uid, ret, answer, outbox id, fencing token
# ('' for none). 1 answered, 0 already answered, -1 refused: the token is not the fence's.
FINISH = (
    PUSH_OR_BURY
    + """
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then return -1 end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[4] ~= '' then redis.call('HDEL', KEYS[3], ARGV[4]) end
push_or_bury(ARGV[2], ARGV[3], 'answer not delivered')
return 1
"""
)

# KEYS: none (the targets are client-named). ARGV: why, then (target, value) pairs.
# Returns the 0-based indexes of the pairs set aside (in the dead-letter list).
PUSH = (
    PUSH_OR_BURY
    + """
local aside = {}
for i = 2, #ARGV, 2 do
  if push_or_bury(ARGV[i], ARGV[i + 1], ARGV[1]) == 0 then aside[#aside + 1] = (i - 2) / 2 end
end
return aside
"""
)

# KEYS: backlog, expiry. ARGV: the msgpack array of (uid, request, deadline) triples,
# flat: a batch's backlog entries and their deadlines.
RECORD = """
local a = cmsgpack.unpack(ARGV[1])
for i = 1, #a - 2, 3 do
  redis.call('HSET', KEYS[1], a[i], a[i + 1])
  redis.call('ZADD', KEYS[2], a[i + 2], a[i])
end
return #a / 3
"""

# KEYS: a hash. ARGV: the msgpack array of (field, value) pairs, flat. HSET of them all.
HSET = """
local a = cmsgpack.unpack(ARGV[1])
for i = 1, #a - 1, 2 do
  redis.call('HSET', KEYS[1], a[i], a[i + 1])
end
return #a / 2
"""

# KEYS: inflight, dead, attempts, fence. ARGV: dead entry, attempts field, fencing token
# ('' for none). Sets aside the first inflight item (the one the entry is about) in one
# step; 0 and nothing done when the token is not the fence's.
BURY_HEAD = f"""
if ARGV[3] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[3] then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], 0, {dead.LIST_MAX - 1})
redis.call('LPOP', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[2], ARGV[2] .. ':why')
return 1
"""
