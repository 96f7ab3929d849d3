"""How the supervisor tells a demo component is up: a TCP port, an HTTP 200, Redis, Airflow's health."""

from __future__ import annotations

import asyncio

import aiohttp

from pipeline.demo.plan import Plan
from pipeline.demo.supervisor import Probe


def tcp_probe(port: int) -> Probe:
    async def check() -> bool:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()
        return True

    return check


def http_probe(url: str) -> Probe:
    async def check() -> bool:
        timeout = aiohttp.ClientTimeout(total=3)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    return check


class AirflowProbe:
    """Up when the API server says the scheduler and the DAG processor are healthy.

    ``detail`` is its last answer in a few words (what the demo says it waits for).
    """

    PARTS = ("scheduler", "dag_processor")

    def __init__(self, plan: Plan) -> None:
        self.url = f"{plan.airflow_url}/api/v2/monitor/health"
        self.detail = ""

    async def __call__(self) -> bool:
        timeout = aiohttp.ClientTimeout(total=3)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(self.url) as resp,
            ):
                if resp.status != 200:
                    self.detail = f"the API server answered {resp.status}"
                    return False
                doc = await resp.json()
        except (aiohttp.ClientError, ValueError, OSError) as exc:
            self.detail = f"the API server does not answer yet ({type(exc).__name__})"
            return False
        states = {p: str((doc.get(p) or {}).get("status") or "unknown") for p in self.PARTS}
        self.detail = ", ".join(f"{p} {state}" for p, state in states.items())
        return all(state == "healthy" for state in states.values())


def airflow_probe(plan: Plan) -> Probe:
    """Up when the API server says the scheduler and the DAG processor are healthy."""
    return AirflowProbe(plan)


def redis_probe(port: int) -> Probe:
    async def check() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            return (await reader.readline()).startswith(b"+PONG")
        finally:
            writer.close()
            await writer.wait_closed()

    return check


__all__ = ["AirflowProbe", "airflow_probe", "http_probe", "redis_probe", "tcp_probe"]
