"""The admission mark the trainer writes for the rollout (see ``AdmissionMark``): read and written here once.

``consumed`` is counted in the rollout's own unit, its publish counter: ``published − undelivered``, where
``undelivered`` is the number of stream entries the trainer's consumer group has not been served yet. Both
are read in one Lua script, so no publish can slip in between. Entries served but not yet acknowledged
(pending: trained and awaiting a checkpoint, or about to be retrained after a restart) count as consumed:
they are in the trainer's hands and need no new groups. Foreign entries (pushed by anything but the rollout)
are not in the counter; while they wait undelivered they make ``consumed`` smaller (the rollout waits a
little longer), and once taken they cost the rollout nothing.
"""

from __future__ import annotations

import redis

from shared.contract import DEFAULT_CONTRACT
from shared.protocol import AdmissionMark

# KEYS[1]: stream, KEYS[2]: publish counter; ARGV[1]: consumer group. Redis ≥ 6.2 (exclusive XRANGE start).
_CONSUMED = """
local published = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('EXISTS', KEYS[1]) == 0 then
  return published
end
local last = nil
for _, info in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered = nil, nil
  for i = 1, #info, 2 do
    if info[i] == 'name' then name = info[i + 1] elseif info[i] == 'last-delivered-id' then delivered = info[i + 1] end
  end
  if name == ARGV[1] then last = delivered end
end
if last == nil then
  return published - redis.call('XLEN', KEYS[1])
end
return published - #redis.call('XRANGE', KEYS[1], '(' .. last, '+')
"""


def consumed_groups(client: redis.Redis, stream: str, group: str, published_key: str) -> int:
    """Published groups the consumer group ``group`` has been served (see the module docstring)."""
    return int(client.eval(_CONSUMED, 2, stream, published_key, group))


def encode_mark(mark: AdmissionMark) -> str:
    return mark.model_dump_json()


def read_mark(client: redis.Redis, key: str = DEFAULT_CONTRACT.admission_key) -> AdmissionMark | None:
    """The trainer's last mark, or None when it never wrote one (then the rollout falls back to versions)."""
    raw = client.get(key)
    return None if raw is None else AdmissionMark.model_validate_json(raw)
