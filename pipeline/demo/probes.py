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


def airflow_probe(plan: Plan) -> Probe:
    """Up when the API server says the scheduler and the DAG processor are healthy."""
    url = f"{plan.airflow_url}/api/v2/monitor/health"

    async def check() -> bool:
        timeout = aiohttp.ClientTimeout(total=3)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
                if resp.status != 200:
                    return False
                doc = await resp.json()
        except (aiohttp.ClientError, ValueError):
            return False
        parts = ("scheduler", "dag_processor")
        return all((doc.get(p) or {}).get("status") == "healthy" for p in parts)

    return check


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


__all__ = ["airflow_probe", "http_probe", "redis_probe", "tcp_probe"]
