"""The keys of ``sluice serve``'s aiohttp app, shared by the app and its connections."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from aiohttp import web

from pipeline.chain.history.entries import Refusals
from pipeline.chain.history.lakeview import SharedHistory
from pipeline.chain.history.resumption import TieredResumption
from pipeline.chain.metrics import Metrics
from pipeline.chain.produce.producer import WebsocketHub
from pipeline.chain.serve.admission import ConnectionGuard
from pipeline.chain.serve.relay import RedisTailer
from pipeline.settings import Settings

if TYPE_CHECKING:
    from pipeline.chain.serve.wsconn import Connection

SETTINGS = web.AppKey("settings", Settings)
HUB = web.AppKey("hub", WebsocketHub)
METRICS = web.AppKey("metrics", Metrics)
RESUMPTION = web.AppKey("resumption", TieredResumption)
REDIS = web.AppKey("redis", aioredis.Redis)
TAILER = web.AppKey("tailer", RedisTailer)
#: the server's refused chain entries and its height check (pipeline/chain/history/entries.py)
REFUSED = web.AppKey("refused", Refusals)
#: The server's shared lake reader (absent when the app was given another history source).
HISTORY = web.AppKey("history", SharedHistory)
#: The connection cap and request-head deadline (pipeline/chain/serve/admission.py).
GUARD = web.AppKey("guard", ConnectionGuard)
CONNECTIONS: web.AppKey[set[Connection]] = web.AppKey("connections")
#: Every request task in flight in the server (bounded by MAX_IN_FLIGHT_SERVER).
CALLS: web.AppKey[set[asyncio.Task[None]]] = web.AppKey("calls")
