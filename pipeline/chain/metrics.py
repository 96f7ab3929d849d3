"""Prometheus text exposition (format 0.0.4), hand-written: counters and gauges, no labels beyond one."""

from __future__ import annotations

from collections import defaultdict

from pipeline.redisio.errorkind import KINDS, error_kind

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Failed Redis commands, one series per :data:`~pipeline.redisio.errorkind.KINDS` kind.
REDIS_ERRORS = "sluice_serve_redis_errors_total"


class Metrics:
    """Counters (monotonic) and gauges of one ``sluice serve`` process."""

    _HELP = {
        "sluice_serve_connections_total": ("counter", "websocket connections accepted"),
        "sluice_serve_connections_open": ("gauge", "websocket connections open now"),
        "sluice_serve_subscriptions_open": ("gauge", "subscriptions open now"),
        "sluice_serve_messages_sent_total": ("counter", "notifications and replies sent"),
        "sluice_serve_blocks_live_total": ("counter", "blocks published to the live hub"),
        "sluice_serve_slow_disconnects_total": (
            "counter",
            "subscribers disconnected for falling behind",
        ),
        "sluice_serve_rpc_errors_total": ("counter", "JSON-RPC error replies, by code"),
        "sluice_serve_requests_refused_total": (
            "counter",
            "requests refused because their connection had too many in flight",
        ),
        "sluice_serve_internal_errors_total": (
            "counter",
            "requests and subscriptions ended by an unexpected error (logged)",
        ),
        "sluice_serve_auth_failures_total": (
            "counter",
            "requests refused for a missing or bad token",
        ),
        "sluice_serve_redis_errors_total": (
            "counter",
            "redis commands of serve that failed (live tail, wake-ups, subscriptions and "
            "their catch-ups, the write probe of /healthz, the status page), by kind",
        ),
        "sluice_serve_redis_up": ("gauge", "1 when the live tailer is connected to redis"),
        "sluice_serve_connections_refused_total": (
            "counter",
            "connections answered 503 and closed: the connection cap was reached",
        ),
        "sluice_serve_header_timeouts_total": (
            "counter",
            "connections closed (408) for not sending a complete request head in time",
        ),
        "sluice_serve_dialogue_connections_open": (
            "gauge",
            "Dialogue feed connections open now",
        ),
        "sluice_serve_dialogue_duplexes_open": ("gauge", "Dialogue feed duplexes served now"),
        "sluice_serve_dialogue_queued_messages": (
            "gauge",
            "messages the Dialogue feed's duplexes hold queued now",
        ),
        "sluice_serve_dialogue_queued_bytes": (
            "gauge",
            "bytes the Dialogue feed's duplexes hold queued now (per connection at most 8 MiB)",
        ),
        "sluice_serve_dialogue_dropped_total": (
            "counter",
            "Dialogue feed connections dropped: the peer read nothing of a duplex's end for 10 s",
        ),
        "sluice_serve_upgrades_lost_total": (
            "counter",
            "websocket upgrades whose peer was gone before the answer could be written",
        ),
        "sluice_serve_heartbeat_timeouts_total": (
            "counter",
            "websockets closed (1011) for not answering a ping while nothing sent to them waited",
        ),
        "sluice_serve_bad_heights_total": (
            "counter",
            "chain blocks set aside: height not their parent's plus one, or descending from one",
        ),
        "sluice_serve_reorg_resyncs_total": (
            "counter",
            "subscriptions planned again from their head after a reorg deeper than fork choice held",
        ),
        "sluice_serve_reorg_reconnects_total": (
            "counter",
            "cardinal connections closed (1012) to deliver a deep reorg on the library's redial",
        ),
        "sluice_serve_entries_refused_total": (
            "counter",
            "chain-stream entries refused (too large, too many items, too deep, wrong shape)",
        ),
        "sluice_serve_resident_bytes": ("gauge", "resident memory of the process"),
        "sluice_serve_memory_releases_total": (
            "counter",
            "times free native memory was given back after the resident size grew",
        ),
        "sluice_serve_memory_released_bytes_total": (
            "counter",
            "resident bytes given back by those releases",
        ),
        "sluice_serve_catchup_shared_hits_total": (
            "counter",
            "lake blocks a catch-up took encoded from another catch-up reading them at once",
        ),
        "sluice_serve_catchup_shared_misses_total": (
            "counter",
            "lake blocks decoded and encoded while other catch-ups read the lake too",
        ),
        "sluice_serve_catchup_shared_clears_total": (
            "counter",
            "times the shared encoded blocks were dropped (full, or no catch-up left to share with)",
        ),
        "sluice_serve_history_cache_dropped_total": (
            "counter",
            "cached lake files dropped after going unused for SLUICE_SERVE_CACHE_IDLE_S",
        ),
    }

    def __init__(self) -> None:
        self.values: dict[str, float] = defaultdict(float)
        self.labelled: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for kind in KINDS:  # every kind listed from the start, at 0: rates work from the first
            self.inc_label(REDIS_ERRORS, "kind", kind, 0.0)

    def inc(self, name: str, amount: float = 1.0) -> None:
        self.values[name] += amount

    def set(self, name: str, value: float) -> None:
        self.values[name] = value

    def inc_label(self, name: str, label: str, value: str, amount: float = 1.0) -> None:
        self.labelled[name][f'{label}="{value}"'] += amount

    def total(self, name: str) -> float:
        """A metric's value, summed over its labels when it has some."""
        if name in self.labelled:
            return sum(self.labelled[name].values())
        return self.values.get(name, 0.0)

    def redis_error(self, exc: BaseException) -> None:
        """Count one failed Redis command of serve under its kind
        (:func:`pipeline.redisio.errorkind.error_kind`)."""
        self.inc_label(REDIS_ERRORS, "kind", error_kind(exc))

    def render(self) -> str:
        lines: list[str] = []
        for name, (kind, text) in self._HELP.items():
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            if name in self.labelled:
                for labels, value in sorted(self.labelled[name].items()):
                    lines.append(f"{name}{{{labels}}} {_num(value)}")
            else:
                lines.append(f"{name} {_num(self.values.get(name, 0.0))}")
        return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)
