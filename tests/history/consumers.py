"""The consumers a history runs, each recording what it applied (:class:`~tests.history.checker.Record`).

Three kinds, each in both dialects (``seed`` on ``/ws``, ``cardinal`` on ``/cardinal``):

- ``go``: the cardinal-streams library's own websocket consumer (tests/go/consumer,
  cardinal dialect only: the library speaks nothing else); its ChainUpdates'
  Removed and Added, in that order.
- ``python``: ``sluice subscribe`` in its own process (Sluice's client library):
  its Added and Removed lines.
- ``raw``: a plain websocket JSON-RPC client written here from the protocol
  alone: a block at or below its head replaces every height from its own up, a
  cardinal ``reorg`` names the ancestor above which everything goes; it
  reconnects by itself from its head.

Each reconnects across server restarts and network faults on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp

from pipeline.blockcodec import parse_batch_result, parse_subbatch_result
from pipeline.chain.cardinal import (
    parse_cardinal_batch,
    parse_cardinal_reorg,
    parse_cardinal_subbatch,
)
from pipeline.chain.client.ordered import BlockAssembler
from pipeline.errors import BadBatch
from tests.history.checker import Record, apply

KINDS = ("go", "python", "raw")
PATHS = {"seed": "/ws", "cardinal": "/cardinal"}


def _hex(text: str) -> str:
    return text[2:] if text.startswith("0x") else text


class Consumer:
    """One consumer: started at (num, hash), recording its updates until stopped."""

    def __init__(self, record: Record) -> None:
        self.record = record
        self._loop = asyncio.get_running_loop()
        self.task: asyncio.Task[None] | None = None

    def now(self) -> float:
        return self._loop.time()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class ProcessConsumer(Consumer):
    """A consumer in its own process, one JSON line per update on stdout."""

    proc: asyncio.subprocess.Process | None = None

    #: where its stdout lines and stderr are kept (the run's directory)
    logs: Path | None = None

    async def launch(self, *argv: str) -> None:
        err = (self.logs / f"{self.record.name}.err").open("ab") if self.logs else None
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err if err is not None else asyncio.subprocess.DEVNULL,
            env={**os.environ, "SLUICE_LOG_LEVEL": "WARNING"},
        )
        if err is not None:
            err.close()
        self.task = asyncio.create_task(self._read(), name=f"consumer {self.record.name}")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        out = (self.logs / f"{self.record.name}.jsonl").open("ab") if self.logs else None
        try:
            async for raw in self.proc.stdout:
                if out is not None:
                    out.write(raw)
                self.line(json.loads(raw))
        finally:
            if out is not None:
                out.close()

    def line(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.kill()
            await self.proc.wait()
        await super().stop()


class GoConsumer(ProcessConsumer):
    """The library's ChainUpdates, and its reorg events as the library defines them: the
    application drops every block above the named common ancestor (sent for reorgs
    deeper than the threshold, where the library's processor reports no Removed)."""

    def line(self, obj: dict[str, Any]) -> None:
        t = self.now()
        if obj.get("event") == "reorg":
            state, _ = apply(self.record)
            for height in sorted((n for n in state if n > obj["num"]), reverse=True):
                self.record.remove(t, height, state[height])
            return
        if obj.get("event") != "update":
            return
        for b in obj["removed"]:
            self.record.remove(t, b["num"], _hex(b["hash"]))
        for b in obj["added"]:
            self.record.add(t, b["num"], _hex(b["hash"]), _hex(b["parent"]))


class PythonConsumer(ProcessConsumer):
    def line(self, obj: dict[str, Any]) -> None:
        t = self.now()
        if "added" in obj:
            self.record.add(t, obj["added"], _hex(obj["hash"]), _hex(obj["parent"]))
        elif "removed" in obj:
            self.record.remove(t, obj["removed"], _hex(obj["hash"]))


class RawConsumer(Consumer):
    """The protocol by hand: see the module doc.

    With ``logs`` (the run's directory), ``<name>.jsonl`` keeps what it was sent: one
    line per connection (``{"subscribe": [num, hash]}``) and per notification
    (``{"t": type, "num", "hash", "parent", "depth"}``, as far as each has them), so a
    seed that fails shows what serve sent, not only what the consumer ended with.
    """

    def __init__(
        self, record: Record, url: str, num: int, hash: str, logs: Path | None = None
    ) -> None:
        super().__init__(record)
        self.url = url
        self.head = (num, hash)
        self.state: dict[int, str] = {}
        #: notifications it could not parse (each one a violation)
        self.malformed: list[str] = []
        self._log = (logs / f"{record.name}.jsonl").open("a") if logs is not None else None
        self.task = asyncio.create_task(self._run(), name=f"consumer {record.name}")

    def _note(self, obj: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json.dumps({"at": round(self.now(), 3), **obj}) + "\n")

    async def _run(self) -> None:
        try:
            async with aiohttp.ClientSession() as session:
                while True:
                    with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError):
                        await self._connection(session)
                    await asyncio.sleep(0.2)
        finally:
            if self._log is not None:
                self._log.close()

    async def _connection(self, session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(self.url, heartbeat=5, max_msg_size=16 << 20) as ws:
            num, h = self.head
            self._note({"subscribe": [num, h]})
            params: list[Any] = ["streams", hex(num), "0x" + h]
            if self.record.dialect == "seed":
                params += [[], {"weight": True}]
            await ws.send_str(
                json.dumps(
                    {"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe", "params": params}
                )
            )
            assembler = BlockAssembler()
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    return
                obj = json.loads(msg.data)
                if "params" in obj:
                    try:
                        self._result(obj["params"]["result"], assembler)
                    except BadBatch as exc:  # a violation to report, not a crash of the run
                        self.malformed.append(f"{exc}: {msg.data[:200]}")
                elif "error" in obj:
                    raise ConnectionError(f"refused: {obj['error']}")

    def _result(self, result: dict[str, Any], assembler: BlockAssembler) -> None:
        kind = result.get("type")
        self._note(
            {
                "t": kind,
                **{k: result[k] for k in ("num", "hash", "parent", "depth") if k in result},
            }
        )
        cardinal = self.record.dialect == "cardinal"
        if kind == "reorg" and cardinal:
            ancestor, _ = parse_cardinal_reorg(result)
            self._drop_above(ancestor)
            return
        if kind == "batch":
            header = parse_cardinal_batch(result) if cardinal else parse_batch_result(result)
            block = assembler.batch(header)
        elif kind == "subbatch":
            parsed = parse_cardinal_subbatch(result) if cardinal else parse_subbatch_result(result)
            block = assembler.subbatch(*parsed)
        else:
            return
        if block is None:
            return
        self._drop_above(block.num - 1)
        h = block.hash.hex()
        self.state[block.num] = h
        self.record.add(self.now(), block.num, h, block.parent.hex())
        self.head = (block.num, h)

    def _drop_above(self, num: int) -> None:
        t = self.now()
        for height in sorted((n for n in self.state if n > num), reverse=True):
            self.record.remove(t, height, self.state.pop(height))
        if num in self.state:
            self.head = (num, self.state[num])


async def start(
    kind: str, dialect: str, base: str, num: int, hash: str, go_binary: str, threshold: int,
    *, name: str, start_bound: int, weight: int, logs: Path | None = None,
) -> Consumer:  # fmt: skip
    """A consumer of ``kind`` and ``dialect`` at ``base`` (``ws://host:port``) from (num, hash)."""
    record = Record(name=name, kind=kind, dialect=dialect, start=start_bound)
    url = base + PATHS[dialect]
    if kind != "raw":  # these start holding the block they name (a wrong hash must go)
        record.add(asyncio.get_running_loop().time(), num, hash, "")
    if kind == "raw":
        return RawConsumer(record, url, num, hash, logs)
    if kind == "go":
        consumer: ProcessConsumer = GoConsumer(record)
        consumer.logs = logs
        await consumer.launch(
            go_binary, "-url", url, "-from", str(num), "-hash", "0x" + hash,
            "-weight", hex(weight), "-threshold", str(threshold),
        )  # fmt: skip
        return consumer
    consumer = PythonConsumer(record)
    consumer.logs = logs
    await consumer.launch(
        sys.executable, "-m", "pipeline.cli", "subscribe", "--url", url, "--dialect", dialect,
        "--from", str(num), "--hash", "0x" + hash, "--retries", "1000",
    )  # fmt: skip
    return consumer


__all__ = ["KINDS", "Consumer", "start"]
