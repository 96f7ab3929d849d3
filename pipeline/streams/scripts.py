"""The Lua scripts the stream service runs in Redis, and the field its entries carry.

Each script touches the keys of one stream only (one slot on a cluster);
what a script returns is read in :mod:`pipeline.streams.servicepush`,
:mod:`pipeline.streams.servicepull` and :mod:`pipeline.streams.servicecontrol`.
"""

from __future__ import annotations

#: The field of a stream entry that holds its data.
FIELD = b"data"

# A push: if its dedup key exists, the first push's indexes (status 0, DUPLICATE);
# else every entry XADD-ed and the joined indexes kept for ARGV[1] ms (status 1).
PUSH = """
local prev = redis.call('GET', KEYS[2])
if prev then return {0, prev} end
local ids = {}
for i = 3, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', ARGV[2], ARGV[i])
end
local joined = table.concat(ids, ',')
redis.call('SET', KEYS[2], joined, 'PX', ARGV[1])
return {1, joined}
"""

# Non-blocking fetch packed by Redis itself (cmsgpack): one bulk string instead
# of five RESP elements per entry, so the client parses a batch in C. Stops
# after ARGV[4] bytes (but always returns at least one entry). nil = no stream.
FETCH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
local out = {}
local size = 0
for _, e in ipairs(entries) do
  if #out > 0 and size > tonumber(ARGV[4]) then break end
  local fields = e[2]
  local data = ''
  for j = 1, #fields, 2 do
    if fields[j] == ARGV[3] then data = fields[j + 1]; break end
  end
  out[#out + 1] = e[1]
  out[#out + 1] = data
  size = size + #data
end
return cmsgpack.pack(out)
"""

# One key only (the stream's own slot on a cluster); the registry of stream names
# (``keys.streams_registry``) is updated after it as a separate, idempotent SADD.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local id = redis.call('XADD', KEYS[1], '*', 'init', '')
redis.call('XDEL', KEYS[1], id)
return 1
"""

# An index saved only if it is past the one saved (compared as entry ids): monotonic.
SAVE_INDEX = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local cms, cseq = string.match(cur, '^(%d+)-(%d+)$')
  local nms, nseq = string.match(ARGV[2], '^(%d+)-(%d+)$')
  cms = tonumber(cms); cseq = tonumber(cseq); nms = tonumber(nms); nseq = tonumber(nseq)
  if cms and (nms < cms or (nms == cms and nseq <= cseq)) then return cur end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
"""
